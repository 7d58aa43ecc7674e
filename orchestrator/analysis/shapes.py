"""Tool-call shapes: per step (tool name, sorted argument keys, argument value types).

The final message's wording is not part of a shape. Argument values are compared apart, by
``args_fp``. A whole trace's shape is kept as a running hash (``ShapeHasher``) so the analysis holds
no per-step data; the per-step tuples are re-read from the trace only for the diff of one task.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from agent_runner.records import TraceTurn
from agent_runner.redact import redact
from agent_runner.trace import fp

_JSON_TYPES: dict[type, str] = {
    type(None): "null",
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    list: "list",
    tuple: "list",
    dict: "object",
}


def json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value)) or type(value).__name__


class Step(NamedTuple):
    """One tool call as seen by the shape diff (a tuple: a million of them are built per run)."""

    step: int
    tool: str
    keys: tuple[str, ...]
    types: tuple[str, ...]
    args_fp: str

    @property
    def shape(self) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        return (self.tool, self.keys, self.types)

    def describe(self) -> str:
        """``tool(key: type, ...)`` — one line of the unified shape diff."""
        return (
            f"{self.tool}(" + ", ".join(f"{k}: {t}" for k, t in zip(self.keys, self.types, strict=True)) + ")"
        )


def step_of(turn: Mapping[str, object]) -> Step | None:
    """The shape step of a trace turn as read from its line, or None for a turn without a tool call."""
    return turn_step(TraceTurn.from_json(turn))


def turn_step(turn: TraceTurn) -> Step | None:
    """The shape step of a trace turn, or None for a turn without a tool call."""
    if not turn.tool:
        return None
    keys = tuple(sorted(turn.args))
    return Step(
        step=turn.step,
        tool=turn.tool,
        keys=keys,
        types=tuple(json_type(turn.args[k]) for k in keys),
        args_fp=turn.args_fp or fp(turn.args),
    )


def shape_line(tool: str, args: Mapping[str, object]) -> bytes:
    """What ``ShapeHasher`` hashes for one step: the repr of ``Step.shape``, without building a Step."""
    keys = tuple(sorted(args))
    # repr of a tuple of strings is unambiguous and much cheaper than json.dumps
    return repr((tool, keys, tuple(json_type(args[k]) for k in keys))).encode() + b"\n"


class ShapeHasher:
    """Running hashes of a trace's shape and of its argument values, fed one step at a time.

    Lines are buffered and hashed in blocks: sha256 is a stream, so the digest is the one that
    per-step updates give, at a fraction of the calls.
    """

    _BLOCK = 1024  # steps per hash update

    def __init__(self) -> None:
        self._shape = hashlib.sha256()
        self._values = hashlib.sha256()
        self._answers = hashlib.sha256()
        self._shape_lines: list[bytes] = []
        self._value_lines: list[str] = []
        self._answer_lines: list[str] = []
        self.steps = 0

    def add(self, step: Step) -> None:
        self.add_line(repr(step.shape).encode() + b"\n", step.args_fp)

    def add_line(self, line: bytes, args_fp: str, obs_fp: str = "") -> None:
        """One step given as its ``shape_line``, its ``args_fp`` and the tool's answer (``obs_fp``)."""
        self._shape_lines.append(line)
        self._value_lines.append(args_fp)
        self._answer_lines.append(obs_fp)
        self.steps += 1
        if len(self._shape_lines) >= self._BLOCK:
            self._flush()

    def _flush(self) -> None:
        if self._shape_lines:
            self._shape.update(b"".join(self._shape_lines))
            self._values.update(("\n".join(self._value_lines) + "\n").encode())
            self._answers.update(("\n".join(self._answer_lines) + "\n").encode())
            self._shape_lines.clear()
            self._value_lines.clear()
            self._answer_lines.clear()

    @property
    def shape_hash(self) -> str:
        self._flush()
        return self._shape.hexdigest()[:16]

    @property
    def values_hash(self) -> str:
        self._flush()
        return self._values.hexdigest()[:16]

    @property
    def answers_hash(self) -> str:
        """What the tools answered, step by step: two traces with the same calls and another
        answers_hash met a tool that answers differently."""
        self._flush()
        return self._answers.hexdigest()[:16]


@dataclass(frozen=True)
class Edit:
    op: str  # "equal" | "changed" | "missing" | "extra"
    reference: Step | None
    other: Step | None


_MOD = (1 << 61) - 1  # window hashes: a Mersenne prime modulus and a fixed base
_BASE = 1_000_003
_SMALL_RANGE = 4096  # below this many (a, b) pairs difflib's own search is cheaper


def _prefix_hashes(x: Sequence[int], lo: int, hi: int) -> list[int]:
    out = [0]
    h = 0
    for v in x[lo:hi]:
        h = (h * _BASE + v + 1) % _MOD
        out.append(h)
    return out


def _window_hashes(prefix: list[int], k: int) -> list[int]:
    power = pow(_BASE, k, _MOD)
    return [(prefix[t + k] - prefix[t] * power) % _MOD for t in range(len(prefix) - k)]


class _ShapeMatcher(difflib.SequenceMatcher[int]):
    """difflib's matcher (no junk, no autojunk) with a faster ``find_longest_match``, same answers.

    difflib finds the longest common block by dynamic programming over every pair of equal items:
    a trace repeats a handful of shapes, so that is ~n*m/shapes pairs (5,000 steps against 5,000:
    8 million Python steps, a second). Here the longest length is found by binary search, each
    length tested with rolling hashes of the windows (every hash hit is compared item by item, so a
    collision costs time, never a wrong answer), and the tie is broken as difflib breaks it: the
    block that starts first in ``a``, then first in ``b``. Items are small non-negative ints.
    """

    def __init__(self, a: list[int], b: list[int]) -> None:
        self._ints = (a, b)
        super().__init__(None, a, b, autojunk=False)

    def find_longest_match(
        self, alo: int = 0, ahi: int | None = None, blo: int = 0, bhi: int | None = None
    ) -> difflib.Match:
        a, b = self._ints
        ahi = len(a) if ahi is None else ahi
        bhi = len(b) if bhi is None else bhi
        if (ahi - alo) * (bhi - blo) <= _SMALL_RANGE:
            return super().find_longest_match(alo, ahi, blo, bhi)
        pa, pb = _prefix_hashes(a, alo, ahi), _prefix_hashes(b, blo, bhi)

        def first_block(k: int) -> tuple[int, int] | None:
            """The first (i, j), by i then j, where a[i:i+k] == b[j:j+k]; None if there is none."""
            starts: dict[int, list[int]] = {}
            for t, h in enumerate(_window_hashes(pb, k)):
                starts.setdefault(h, []).append(blo + t)
            for t, h in enumerate(_window_hashes(pa, k)):
                for j in starts.get(h, ()):
                    i = alo + t
                    if a[i : i + k] == b[j : j + k]:
                        return i, j
            return None

        low, high = 0, min(ahi - alo, bhi - blo)  # a block of length `low` exists
        found: tuple[int, int] | None = None
        while low < high:
            mid = (low + high + 1) // 2
            block = first_block(mid)
            if block is None:
                high = mid - 1
            else:
                low, found = mid, block
        if found is None:  # nothing in common
            return difflib.Match(alo, blo, 0)
        return difflib.Match(found[0], found[1], low)  # found: the block of the last length that exists


def align_steps(reference: Sequence[Step], other: Sequence[Step], *, with_equal: bool = True) -> list[Edit]:
    """Every step of both sequences, aligned by difflib (insertions don't cascade): ``equal`` rows
    pair steps of the same shape; ``changed``/``missing``/``extra`` rows are the shape diff."""
    ids: dict[tuple[str, tuple[str, ...], tuple[str, ...]], int] = {}
    # each shape as a small int: equal shapes get equal ints, so difflib's alignment is unchanged
    a = [ids.setdefault(s.shape, len(ids)) for s in reference]
    b = [ids.setdefault(s.shape, len(ids)) for s in other]
    rows: list[Edit] = []
    matcher = _ShapeMatcher(a, b)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            if with_equal:
                rows.extend(Edit("equal", r, o) for r, o in zip(reference[i1:i2], other[j1:j2], strict=True))
            continue
        left, right = list(reference[i1:i2]), list(other[j1:j2])
        for n in range(max(len(left), len(right))):
            ref_step = left[n] if n < len(left) else None
            other_step = right[n] if n < len(right) else None
            op = "changed" if ref_step and other_step else ("missing" if ref_step else "extra")
            rows.append(Edit(op, ref_step, other_step))
    return rows


def shape_edits(reference: Sequence[Step], other: Sequence[Step]) -> list[Edit]:
    """The steps where two shape sequences differ (the rows of ``align_steps`` that are not equal)."""
    return align_steps(reference, other, with_equal=False)


def args_differences(reference: Iterable[Step], other: Iterable[Step]) -> list[tuple[Step, Step]]:
    """Same-shape steps, paired in order, whose argument values differ (by ``args_fp``)."""
    return [
        (r, o)
        for r, o in zip(reference, other, strict=False)
        if r.shape == o.shape and r.args_fp != o.args_fp
    ]


def shape_changes(reference: Sequence[Step], other: Sequence[Step]) -> list[tuple[Step, Step]]:
    """Calls of the same tool whose shape differs, paired where the unified shape diff replaces one
    line with another (the ``-lookup(key: str)`` / ``+lookup(key: str, scope: str)`` pairs)."""
    matcher = difflib.SequenceMatcher(
        a=[s.describe() for s in reference], b=[s.describe() for s in other], autojunk=False
    )
    pairs: list[tuple[Step, Step]] = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "replace":
            pairs += [(r, o) for r, o in zip(reference[i1:i2], other[j1:j2], strict=False) if r.tool == o.tool]
    return pairs


def unified_shape_diff(
    reference: Sequence[Step], other: Sequence[Step], ref_label: str, other_label: str
) -> list[str]:
    """A readable unified diff of two shape sequences (one line per tool call)."""
    return list(
        difflib.unified_diff(
            [s.describe() for s in reference],
            [s.describe() for s in other],
            fromfile=ref_label,
            tofile=other_label,
            lineterm="",
        )
    )


MAX_ARG_VALUE = 300  # characters of one argument value shown beside its hash
_ABSENT = object()


def _arg_text(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    if len(text) <= MAX_ARG_VALUE:
        return text
    head = text[: MAX_ARG_VALUE - 1]
    space = head.rfind(" ")
    return (head[:space] if space > MAX_ARG_VALUE // 3 else head) + "…"


def arg_values_differing(
    reference_args: Mapping[str, object] | None, other_args: Mapping[str, object] | None
) -> list[tuple[str, str | None, str | None]]:
    """(key, the reference's value, the other's value) per argument whose value differs, sorted by key;
    redacted as every text crosshost writes is, a long value shortened at a word; None: not passed."""
    raw_left, raw_right = dict(reference_args or {}), dict(other_args or {})
    # compared as the trace holds them, shown redacted: two secrets that differ say so, as [REDACTED] both
    left, right = redact(raw_left), redact(raw_right)
    return [
        (
            key,
            None if key not in raw_left else _arg_text(left[key]),
            None if key not in raw_right else _arg_text(right[key]),
        )
        for key in sorted(raw_left.keys() | raw_right.keys())
        if raw_left.get(key, _ABSENT) != raw_right.get(key, _ABSENT)
    ]


def arg_shapes_differing(
    reference_args: Mapping[str, object] | None, other_args: Mapping[str, object] | None
) -> list[tuple[str, str | None, str | None]]:
    """(key, the reference's value, the other's value) for the keys that make two calls' shapes
    differ: passed on one side only, or of another JSON type. Values as JSON (``"30"`` and ``30``
    differ), redacted, a long one shortened at a word; a redacted one says its type; None: not passed."""
    left, right = dict(reference_args or {}), dict(other_args or {})
    shown_left, shown_right = redact(left), redact(right)

    def text(raw: object, shown: object) -> str:
        said = shown if isinstance(shown, str) and shown != raw and "[REDACTED]" in shown else None
        if said is not None:
            return f"{_arg_text(said)} ({json_type(raw)})"
        return _arg_text(json.dumps(shown, sort_keys=True, ensure_ascii=False))

    return [
        (
            key,
            text(left[key], shown_left[key]) if key in left else None,
            text(right[key], shown_right[key]) if key in right else None,
        )
        for key in sorted(left.keys() | right.keys())
        if (key in left) != (key in right) or json_type(left[key]) != json_type(right[key])
    ]


def turn_args(turn: Mapping[str, object]) -> dict[str, object]:
    """A trace turn's arguments (empty when the turn has none)."""
    raw = turn.get("args")
    return dict(raw) if isinstance(raw, dict) else {}
