"""Golden scoring: expect_tools, forbid_tools ("tool" or "tool:<any arg value>"), must_finish."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, List, Optional

from .records import TurnCall
from .suite import Task


def _values(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _values(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _values(item)
    elif isinstance(value, bool) or value is None:
        yield str(value).lower() if isinstance(value, bool) else "null"
    else:
        yield str(value)


def matches(spec: str, turn: TurnCall) -> bool:
    """``spec`` is "tool" or "tool:<value>" (any argument, at any depth, equal to value)."""
    tool, sep, value = spec.partition(":")
    if turn.get("tool") != tool:
        return False
    return not sep or value in set(_values(turn.get("args", {})))


def expected(finding_kind: str, tool: Optional[str], task: Task) -> bool:
    """The finding is one the task declares it expects (a negative golden task's out-of-contract call)."""
    return f"{finding_kind}:{tool}" in task.expect_findings


def missed_findings(task: Task, found: Iterable[Any]) -> List[str]:
    """Why a negative golden task fails: each declared finding the checker did not raise."""
    raised = {f"{f.kind}:{f.tool}" for f in found}
    return [f"expected finding {spec} was not raised: the checker missed the out-of-contract call"
            for spec in task.expect_findings if spec not in raised]


def score(task: Task, turns: Iterable[TurnCall], finish_reason: Optional[str]) -> List[str]:
    """Why the attempt misses its golden expectations (empty: it meets them)."""
    turns = list(turns)
    reasons: List[str] = []
    for spec in task.expect_tools:
        if not any(matches(spec, t) for t in turns):
            reasons.append(f"expected tool call {spec} did not happen")
    for spec in task.forbid_tools:
        steps = [str(t.get("step")) for t in turns if matches(spec, t)]
        if steps:
            reasons.append(f"forbidden tool call {spec} at step {', '.join(steps)}")
    if task.must_finish is not None and finish_reason != task.must_finish:
        reasons.append(f"finished with {finish_reason}, expected {task.must_finish}")
    return reasons
