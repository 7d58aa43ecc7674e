"""One attempt's trace as ``report.html`` embeds it, and two traces aligned step by step.

The traces are shown as the runner wrote them (already redacted), aligned with the shape diff's own
alignment (``shapes.align_steps``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, NotRequired, TypedDict
from urllib.parse import quote

from agent_runner.records import TraceFinish, TraceTurn
from agent_runner.trace import CorruptLine, TraceRecord, iter_observations, iter_trace
from orchestrator.analysis.shapes import Step, align_steps, turn_step
from orchestrator.errors import TraceError
from orchestrator.store.rundir import RunDir

MAX_TEXT = 2_000  # characters of one argument value or observation shown


class FinishView(TypedDict):
    verdict: str
    why: str
    predicate_exit: int | None
    reason: str
    final: str


class TraceView(TypedDict):
    path: str
    obs_path: str | None
    steps: list[list[Any]]  # STEP_FIELDS each: a row of mixed values (an argument value is any JSON)
    more: int
    problems: list[str]
    finish: FinishView | None


class PairView(TypedDict):
    """Two traces of the same shapes: ``same`` and ``values``; otherwise the aligned ``rows``."""

    first: int | None
    same: NotRequired[int]
    values: NotRequired[list[int]]
    rows: NotRequired[list[list[Any]]]  # [reference index, other index, op]


def _cut(text: str, limit: int = MAX_TEXT) -> str:
    return (
        text
        if len(text) <= limit
        else text[:limit] + f"… ({len(text) - limit} more characters in the raw trace)"
    )


def _shown(value: Any) -> Any:
    """An argument value as embedded: strings cut, containers cut element by element."""
    if isinstance(value, str):
        return _cut(value)
    if isinstance(value, dict):
        return {str(k): _shown(v) for k, v in islice(value.items(), 50)}
    if isinstance(value, list):
        return [_shown(v) for v in value[:50]]
    return value


@dataclass
class PageTrace:
    """One attempt's trace as the page shows it."""

    path: str  # relative to the run directory
    steps: list[list[Any]]  # STEP_FIELDS each
    shape: list[Step]
    finish: TraceFinish | None
    more: int  # 1 when steps were left out (over the trace's budget); the raw file has them
    problems: list[str]
    obs_path: str | None

    def to_json(self) -> TraceView:
        finish = self.finish
        return TraceView(
            path=self.path,
            obs_path=self.obs_path,
            steps=self.steps,
            more=self.more,
            problems=self.problems,
            finish=None
            if finish is None
            else FinishView(
                verdict=finish.verdict, why=_cut(finish.why), predicate_exit=finish.predicate_exit,
                reason=finish.reason, final=_cut(finish.final),
            ),  # fmt: skip
        )


def _observations(path: Path, limit: int) -> dict[int, str]:
    """The sidecar's (already redacted) observations by step, for the first ``limit`` steps."""
    out: dict[int, str] = {}
    if not path.is_file():
        return out
    try:
        for _, record in iter_observations(path):
            if isinstance(record, CorruptLine):
                continue  # a damaged line shows no observation; the raw file is linked
            if record["step"] > limit:
                break
            out[record["step"]] = _cut(record["content"])
    except (TraceError, OSError):
        pass
    return out


def _finish_at_end(path: Path) -> TraceFinish | None:
    """The finish record from the end of a trace not read to the end (the last line, when it is one)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 65_536))
            tail = handle.read().decode("utf-8", "replace").strip().splitlines()
        record = json.loads(tail[-1]) if tail else None
    except (OSError, ValueError):
        return None
    # the trace's own record type, from its last line: what iter_trace makes of a finish
    return TraceFinish.from_json(record) if isinstance(record, dict) and record.get("type") == "finish" else None


def load_trace(path: Path, budget: int, records: Iterator[tuple[int, TraceRecord]] | None = None) -> PageTrace:
    """The trace at ``path`` as the page shows it; ``records``: its records already read (as
    ``iter_trace`` reads them)."""
    steps: list[list[Any]] = []
    shape: list[Step] = []
    finish: TraceFinish | None = None
    problems: list[str] = []
    more = 0
    obs_file = path.with_name(path.name[: -len(".jsonl")] + ".obs.jsonl")
    try:
        for lineno, record in records if records is not None else iter_trace(path):
            if isinstance(record, TraceTurn):
                step = turn_step(record)
                if step is None:
                    continue
                if len(steps) >= budget:
                    more = 1  # at least: the rest of a long trace is not read
                    break
                shape.append(step)
                steps.append(
                    [  # STEP_FIELDS, as a list: a long run embeds tens of thousands of steps
                        step.step,
                        step.tool,
                        _shown(record.args),
                        step.args_fp,
                        record.obs_fp or None,
                        _cut(record.error) if record.error else None,
                        None,
                    ]
                )
            elif isinstance(record, TraceFinish):
                finish = record
            elif isinstance(record, CorruptLine):
                problems.append(f"line {lineno}: {record.error or 'corrupt line'}")
    except (TraceError, OSError) as exc:
        problems.append(str(exc))
    if more:
        finish = _finish_at_end(path)
    obs_exists = obs_file.is_file()
    if steps and obs_exists:
        observed = _observations(obs_file, steps[-1][0])
        for s in steps:
            s[6] = observed.get(s[0])
    host = path.parent.parent.name
    return PageTrace(
        path=_link(host, path.name),
        steps=steps,
        shape=shape,
        finish=finish,
        more=more,
        problems=problems[:10],
        obs_path=_link(host, obs_file.name) if obs_exists else None,
    )


def _link(host: str, name: str) -> str:
    """A trace's link relative to report.html, each part percent-encoded (names come from hosts and suites)."""
    return f"hosts/{quote(host, safe='')}/traces/{quote(name, safe='')}"


STEP_FIELDS = ("n", "tool", "args", "args_fp", "obs_fp", "error", "observation")


def trace_files(run_dir: Path) -> dict[tuple[str, str, int], Path]:
    """``hosts/<host>/traces/<task>.<attempt>.jsonl`` by (host, task, attempt); sidecars skipped."""
    return dict(RunDir(run_dir).trace_files())


def pair(ref: PageTrace, other: PageTrace) -> PairView:
    """The aligned rows of two traces and the first row where they part.

    Traces of the same shapes come as ``{"same": n, "values": [rows whose values differ]}``, the
    page's script lays them out row by row. Row ops: ``equal`` (same shape and values), ``values`` (same shape, other argument values),
    and the shape diff's ``changed``/``missing``/``extra``. The first divergence is the first shape
    difference, else the first value difference.
    """
    if [s.shape for s in ref.shape] == [s.shape for s in other.shape]:
        # the same shapes step for step: difflib's answer is one equal block, so skip it
        values = [
            i for i, (a, b) in enumerate(zip(ref.shape, other.shape, strict=True)) if a.args_fp != b.args_fp
        ]
        return PairView(same=len(ref.shape), values=values, first=values[0] if values else None)
    ref_index = {id(s): i for i, s in enumerate(ref.shape)}
    other_index = {id(s): i for i, s in enumerate(other.shape)}
    rows: list[list[Any]] = []
    first_shape = first_values = None
    for edit in align_steps(ref.shape, other.shape):
        op = edit.op
        if (
            op == "equal"
            and edit.reference is not None
            and edit.other is not None
            and edit.reference.args_fp != edit.other.args_fp
        ):
            op = "values"
        if op in ("changed", "missing", "extra") and first_shape is None:
            first_shape = len(rows)
        elif op == "values" and first_values is None:
            first_values = len(rows)
        rows.append(
            [
                ref_index[id(edit.reference)] if edit.reference is not None else None,
                other_index[id(edit.other)] if edit.other is not None else None,
                op,
            ]
        )
    first = first_shape if first_shape is not None else first_values
    return PairView(rows=rows, first=first)
