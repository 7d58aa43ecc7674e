"""Every record class of the runner built without ``dataclasses`` (``recordclass``) is the class
``dataclasses`` builds from the same body: its ``__init__``'s parameters and defaults, a fresh
instance's fields, ``repr``, equality, hashing, ``__match_args__``, what ``replace`` makes and what
assigning to a frozen one raises; and a run's start imports no ``dataclasses``."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.support.runner import clean_env

#: run in a fresh interpreter (the classes are built when their modules are imported): every record
#: class of every runner module, described
_DESCRIBE = r"""
import importlib, inspect, json, pkgutil, re, sys
from agent_runner import recordclass
recordclass.LIGHT = __LIGHT__
import agent_runner
import dataclasses
replace = recordclass.replace if __LIGHT__ else dataclasses.replace

def shown(value):
    return re.sub(r" at 0x[0-9a-f]+", " at 0x", repr(value))

out = {}
for info in sorted(pkgutil.iter_modules(agent_runner.__path__), key=lambda m: m.name):
    if info.name == "__main__":
        continue
    module = importlib.import_module("agent_runner." + info.name)
    for attr, cls in sorted(vars(module).items()):
        if not isinstance(cls, type) or cls.__module__ != module.__name__:
            continue
        if not (hasattr(cls, "__record_fields__") or dataclasses.is_dataclass(cls)):
            continue
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        required = [p.name for p in params if p.default is inspect.Parameter.empty]
        args = {name: i for i, name in enumerate(required)}
        a, b = cls(**args), cls(**args)
        names = [f.name for f in recordclass.fields(cls)]
        changed = replace(a, **({required[0]: -1} if required else {}))
        d = {
            "params": [(p.name, str(p.kind), p.default is inspect.Parameter.empty,
                        None if p.default is inspect.Parameter.empty or p.default.__class__.__name__ in
                        ("_HAS_DEFAULT_FACTORY_CLASS", "_Missing") else shown(p.default)) for p in params],
            "names": names, "values": {n: shown(getattr(a, n)) for n in names},
            "class_attrs": {n: shown(cls.__dict__.get(n, "<none>")) for n in names},
            "repr": shown(a), "eq": a == b, "eq_other": a == object(), "replaced": shown(changed),
            "replaced_eq": changed == a, "hashable": cls.__hash__ is not None,
            "match_args": list(getattr(cls, "__match_args__", ())),
        }
        if d["hashable"]:
            try:
                d["hash_eq"] = hash(a) == hash(b)
            except TypeError:  # a frozen record holding a dict
                d["hash_eq"] = "TypeError"
        if names:
            try:
                setattr(a, names[0], "x")
                d["assign"] = "ok"
            except AttributeError:
                d["assign"] = "AttributeError"
        out[module.__name__ + "." + attr] = d
print(json.dumps(out))
"""


def _describe(light: bool) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", _DESCRIBE.replace("__LIGHT__", repr(light))], env=clean_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_every_record_class_is_what_dataclasses_builds_from_the_same_body() -> None:
    light, reference = _describe(True), _describe(False)
    assert len(reference) >= 20, sorted(reference)  # the runner's records, suite model, agents' ...
    assert sorted(light) == sorted(reference)
    for name in reference:
        assert light[name] == reference[name], name


@pytest.mark.parametrize("module", ["agent_runner.runner", "agent_runner.__main__"])
def test_the_runner_imports_no_dataclasses(module: str) -> None:
    code = f"import sys, {module}\nprint(sorted(m for m in sys.modules if m in ('dataclasses', 'inspect')))"
    done = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
