"""``dataclass``, ``field``, ``fields`` and ``replace`` for the runner's own record classes, without
the ``dataclasses`` module.

Importing ``dataclasses`` (it imports ``inspect``, and with it ``dis``, ``ast`` and ``tokenize``) and
building the runner's 24 record classes with it (three functions compiled from source for each) was
~30 ms of every run's start, more than any other part of its imports. This builds the same classes
from the same class bodies: an ``__init__`` compiled for each class (its fields in order, a default or
a ``default_factory`` called per instance; ``frozen`` sets them through ``object.__setattr__``), and
``__repr__``, ``__eq__``, ``__hash__``, ``__match_args__`` as ``dataclasses`` gives them. What it does
not give: ``__dataclass_fields__`` (so ``dataclasses.replace``, ``asdict`` and ``is_dataclass`` do
not know these classes: use ``replace`` and ``fields`` here), ``ClassVar``/``InitVar`` fields,
``__post_init__``, keyword-only fields, ``order``, ``slots``. Type checkers see ``dataclasses``
itself. ``LIGHT`` off (before the runner's modules are imported): ``dataclasses`` itself, the
reference this is tested against. Standard library only, Python 3.9.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

#: off: the record classes are built by ``dataclasses`` (the reference the light build is tested against)
LIGHT = True

if TYPE_CHECKING:
    from dataclasses import dataclass, field, fields, replace
else:

    class _Missing:
        def __repr__(self) -> str:
            return "<missing>"

    _MISSING = _Missing()

    class Field:
        """One field of a record class: its ``name``, ``default`` and ``default_factory``."""

        __slots__ = ("name", "default", "default_factory")

        def __init__(self, default: Any = _MISSING, default_factory: Any = _MISSING) -> None:
            if default is not _MISSING and default_factory is not _MISSING:
                raise ValueError("cannot specify both default and default_factory")
            self.name = ""
            self.default = default
            self.default_factory = default_factory

    class FrozenInstanceError(AttributeError):
        """An attribute of a frozen record assigned or deleted."""

    def _repr(self: Any) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__record_names__)
        return f"{type(self).__qualname__}({shown})"

    def _eq(self: Any, other: Any) -> Any:
        if other.__class__ is not self.__class__:
            return NotImplemented
        names = self.__record_names__
        return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)

    def _hash(self: Any) -> int:
        return hash(tuple(getattr(self, n) for n in self.__record_names__))

    def _frozen_setattr(self: Any, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def _frozen_delattr(self: Any, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def _is_classvar(annotation: Any) -> bool:
        text = annotation if isinstance(annotation, str) else repr(annotation)
        return text.startswith(("ClassVar", "typing.ClassVar"))

    def _own_fields(cls: type) -> List[Field]:
        out: List[Field] = []
        for name, annotation in cls.__dict__.get("__annotations__", {}).items():
            if _is_classvar(annotation):
                continue
            value = cls.__dict__.get(name, _MISSING)
            spec = value if isinstance(value, Field) else Field(default=value)
            if isinstance(spec.default, (list, dict, set)):
                raise ValueError(f"mutable default {type(spec.default)} for field {name} is not allowed: "
                                 f"use default_factory")
            spec.name = name
            if spec.default is _MISSING and isinstance(value, Field):
                delattr(cls, name)  # as dataclasses: a field without a default is no class attribute
            elif spec.default is not _MISSING:
                setattr(cls, name, spec.default)
            out.append(spec)
        return out

    def _init(cls: type, specs: List[Field], frozen: bool) -> Callable[..., None]:
        """The ``__init__`` of ``cls``, compiled once: what ``dataclasses`` compiles for it."""
        scope: Dict[str, Any] = {"_MISSING": _MISSING, "_set": object.__setattr__}
        params: List[str] = []
        body: List[str] = []
        seen_default = False
        for spec in specs:
            name = spec.name
            if spec.default_factory is not _MISSING:
                scope[f"_factory_{name}"] = spec.default_factory
                params.append(f"{name}=_MISSING")
                value = f"_factory_{name}() if {name} is _MISSING else {name}"
                seen_default = True
            elif spec.default is not _MISSING:
                scope[f"_default_{name}"] = spec.default
                params.append(f"{name}=_default_{name}")
                value = name
                seen_default = True
            else:
                if seen_default:
                    raise TypeError(f"non-default argument {name!r} follows default argument")
                params.append(name)
                value = name
            body.append(f"  _set(self, {name!r}, {value})" if frozen else f"  self.{name} = {value}")
        source = f"def __init__(self, {', '.join(params)}):\n" + ("\n".join(body) or "  pass") + "\n"
        exec(source, scope)  # our own class bodies' field names, as dataclasses does
        init: Callable[..., None] = scope["__init__"]
        init.__qualname__ = f"{cls.__qualname__}.__init__"
        return init

    def _build(cls: type, frozen: bool) -> type:
        specs: Dict[str, Field] = {}
        for base in reversed(cls.__mro__[1:]):
            for spec in getattr(base, "__record_fields__", ()):
                specs[spec.name] = spec
        for spec in _own_fields(cls):
            specs[spec.name] = spec
        ordered = list(specs.values())
        names = tuple(s.name for s in ordered)
        cls.__record_fields__ = tuple(ordered)
        cls.__record_names__ = names
        methods: Dict[str, Any] = {"__init__": _init(cls, ordered, frozen), "__repr__": _repr, "__eq__": _eq,
                                   "__match_args__": names}
        for name, method in methods.items():
            if name not in cls.__dict__:
                setattr(cls, name, method)
        if "__hash__" not in cls.__dict__ or cls.__dict__["__hash__"] is None:
            cls.__hash__ = _hash if frozen else None
        if frozen:
            cls.__setattr__ = _frozen_setattr
            cls.__delattr__ = _frozen_delattr
        return cls

    def dataclass(cls: Optional[type] = None, *, frozen: bool = False) -> Any:
        """A record class built from its annotated fields (see the module's docstring)."""
        if not LIGHT:
            import dataclasses

            return dataclasses.dataclass(cls, frozen=frozen) if cls is not None else dataclasses.dataclass(frozen=frozen)
        if cls is None:
            return lambda c: _build(c, frozen)
        return _build(cls, frozen)

    def field(*, default: Any = _MISSING, default_factory: Any = _MISSING) -> Any:
        """A field's default, or what makes one for each instance (``default_factory``)."""
        if not LIGHT:
            import dataclasses

            if default_factory is not _MISSING:
                return dataclasses.field(default_factory=default_factory)
            return dataclasses.field(default=default) if default is not _MISSING else dataclasses.field()
        return Field(default, default_factory)

    def fields(class_or_instance: Any) -> Tuple[Any, ...]:
        """The fields of a record class (or of a record), in order: each has a ``name``."""
        found = getattr(class_or_instance, "__record_fields__", None)
        if found is None:
            import dataclasses

            return dataclasses.fields(class_or_instance)
        return tuple(found)

    def replace(obj: Any, **changes: Any) -> Any:
        """A copy of the record ``obj`` with ``changes``, through its ``__init__``."""
        for spec in fields(obj):
            changes.setdefault(spec.name, getattr(obj, spec.name))
        return obj.__class__(**changes)
