"""The shape diff's matcher aligns exactly as difflib.SequenceMatcher(autojunk=False) does."""

from __future__ import annotations

import difflib
import random

import pytest

from orchestrator.analysis import shapes
from orchestrator.analysis.shapes import Step, _ShapeMatcher, shape_edits


def _edited(rng: random.Random, seq: list[int], alphabet: int) -> list[int]:
    out = list(seq)
    for _ in range(rng.randint(0, 6)):
        pos = rng.randint(0, len(out))
        op = rng.choice(("insert", "delete", "change", "duplicate"))
        if op == "insert":
            out[pos:pos] = [rng.randrange(alphabet) for _ in range(rng.randint(1, 5))]
        elif op == "delete":
            del out[pos : pos + rng.randint(1, 5)]
        elif op == "change" and pos < len(out):
            out[pos] = rng.randrange(alphabet)
        elif op == "duplicate":
            out[pos:pos] = out[max(0, pos - 7) : pos]
    return out


def _pairs(seed: int) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(60):
        alphabet = rng.choice((1, 2, 3, 5, 21, 200))
        n = rng.choice((0, 1, 5, 40, 150, 400))
        if rng.random() < 0.5:  # periodic, as a scripted agent's trace is
            period = [rng.randrange(alphabet) for _ in range(rng.randint(1, 21))]
            a = [period[i % len(period)] for i in range(n)]
        else:
            a = [rng.randrange(alphabet) for _ in range(n)]
        b = _edited(rng, a, alphabet) if rng.random() < 0.8 else [rng.randrange(alphabet) for _ in range(n)]
        pairs.append((a, b))
    return pairs


@pytest.mark.parametrize("small_range", [shapes._SMALL_RANGE, 0])  # 0: the fast search on every call
@pytest.mark.parametrize("seed", range(4))
def test_same_blocks_and_opcodes_as_difflib(monkeypatch: pytest.MonkeyPatch, small_range: int, seed: int) -> None:
    monkeypatch.setattr(shapes, "_SMALL_RANGE", small_range)
    for a, b in _pairs(seed):
        reference = difflib.SequenceMatcher(None, a, b, autojunk=False)
        ours = _ShapeMatcher(a, b)
        assert ours.get_matching_blocks() == reference.get_matching_blocks(), (a, b)
        assert ours.get_opcodes() == reference.get_opcodes()
        for alo, ahi, blo, bhi in [(0, len(a), 0, len(b)), (len(a) // 3, len(a), 1, max(1, len(b) - 2))]:
            if alo <= ahi and blo <= bhi:
                assert ours.find_longest_match(alo, ahi, blo, bhi) == reference.find_longest_match(alo, ahi, blo, bhi)


def test_shape_edits_of_a_long_repetitive_trace_name_the_steps_difflib_names() -> None:
    tools = ("read_unit_status", "http_get_health", "list_open_ports")

    def steps(n: int, odd: int | None) -> list[Step]:
        return [Step(i, "restart_unit" if i == odd else tools[i % 3], ("unit",), ("str",), "f") for i in range(1, n)]

    ref, other = steps(3000, None), steps(3000, 1500)
    a, b = [s.shape for s in ref], [s.shape for s in other]
    expected = [op for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if op[0] != "equal"]
    edits = shape_edits(ref, other)
    assert expected == [("replace", 1499, 1500, 1499, 1500)]
    assert [(e.op, e.reference.step if e.reference else None, e.other.step if e.other else None) for e in edits] == [
        ("changed", 1500, 1500)]
