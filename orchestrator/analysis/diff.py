"""``crosshost diff``: the tool-call shape diff of a run as readable unified diffs.

One pair of traces is loaded at a time (capped), so a long run never sits in memory.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from agent_runner.errors import TraceError
from orchestrator.analysis.attempts import iter_steps, iter_turns_by_value
from orchestrator.analysis.shapes import (
    arg_shapes_differing,
    arg_values_differing,
    args_differences,
    shape_changes,
    turn_args,
    unified_shape_diff,
)
from orchestrator.selection import TaskSelection, select_hosts
from orchestrator.store.rundir import load_run

MAX_STEPS = 20_000


@dataclass
class DiffOutput:
    lines: list[str] = field(default_factory=list)
    differs: bool = False
    #: traces a host sent that cannot be read (a FIFO, a device): that host's failure, not bad input
    problems: list[str] = field(default_factory=list)


def run_diff(
    run_dir: Path, hosts: Sequence[str] = (), selection: TaskSelection | None = None
) -> DiffOutput:
    """Shape diff for the selected tasks (default: all). ``hosts`` (``--hosts a,b``): none, the
    reference against every other host; one, the reference against it; more, the first named
    against each of the others."""
    run = load_run(run_dir)
    traces: dict[tuple[str, str], dict[int, Path]] = {}  # (host, task) -> attempt -> trace
    for (host, task_id, attempt), path in run.trace_files():
        traces.setdefault((host, task_id), {})[attempt] = path
        if host not in run.hosts:
            run.hosts.append(host)
    reference = run.reference or (run.hosts[0] if run.hosts else "")
    select_hosts(run.hosts, hosts, f"{run_dir}: --hosts")  # an unknown name is bad input
    named = list(dict.fromkeys(hosts))
    if len(named) == 1:
        named = [reference, *named]
    first, others = (named[0], named[1:]) if named else (reference, [h for h in run.hosts if h != reference])
    pairs = [(first, h) for h in others if h != first]
    tasks = sorted({t for _, t in traces})
    if selection is not None and not selection.everything:
        tasks = selection.select(tasks, run.manifest.task_tags, str(run_dir))

    out = DiffOutput()
    for task_id in tasks:
        for left_host, right_host in pairs:
            _diff_pair(run_dir, out, task_id, left_host, right_host, traces)
    return out


def _step_args(trace: Path, steps: set[int]) -> dict[int, dict[str, object]]:
    """The arguments of the named steps of one trace (re-read: only steps whose values differ)."""
    found: dict[int, dict[str, object]] = {}
    for _, turn in iter_turns_by_value(trace):
        step = turn.get("step")
        if isinstance(step, int) and step in steps:
            found[step] = turn_args(turn)
    return found


def _value(text: str | None) -> str:
    return "(not passed)" if text is None else json.dumps(text, ensure_ascii=False)


def _diff_pair(
    run_dir: Path,
    out: DiffOutput,
    task: str,
    left_host: str,
    right_host: str,
    traces: dict[tuple[str, str], dict[int, Path]],
) -> None:
    left, right = traces.get((left_host, task), {}), traces.get((right_host, task), {})
    same: list[int] = []
    for attempt in sorted(left.keys() | right.keys()):
        if attempt not in left or attempt not in right:
            missing = left_host if attempt not in left else right_host
            out.lines.append(f"# {task} attempt {attempt}: no trace on {missing}")
            continue
        try:
            a = list(islice(iter_steps(left[attempt]), MAX_STEPS))
            b = list(islice(iter_steps(right[attempt]), MAX_STEPS))
        except TraceError as exc:
            out.problems.append(str(exc))
            out.lines.append(f"# {task} attempt {attempt}: {exc}")
            continue
        diff = unified_shape_diff(
            a,
            b,
            str(left[attempt].relative_to(run_dir)),
            str(right[attempt].relative_to(run_dir)),
        )
        values = args_differences(a, b)
        if not diff and not values:
            same.append(attempt)
            continue
        out.differs = out.differs or bool(diff)
        out.lines.append(f"# {task} attempt {attempt}: {left_host} -> {right_host}")
        out.lines.extend(diff or [f"  (same shape, {len(a)} steps)"])
        reshaped = shape_changes(a, b)
        left_args = _step_args(left[attempt], {r.step for r, _ in values + reshaped})
        right_args = _step_args(right[attempt], {o.step for _, o in values + reshaped})
        for r, o in reshaped:  # the values that moved the shape: why the + line differs from the -
            keys = arg_shapes_differing(left_args.get(r.step), right_args.get(o.step))
            if keys:
                said = "; ".join(f"{key}: {x or '(not passed)'} -> {y or '(not passed)'}" for key, x, y in keys)
                out.lines.append(f"  step {o.step} {o.tool}: shape differs; {said}")
        for r, o in values:
            out.lines.append(f"  step {o.step} {o.tool}: argument values differ (args_fp {r.args_fp} -> {o.args_fp})")
            out.lines.extend(
                f"    {key}: {_value(a)} -> {_value(b)}"
                for key, a, b in arg_values_differing(left_args.get(r.step), right_args.get(o.step))
            )
        if len(a) == MAX_STEPS or len(b) == MAX_STEPS:
            out.lines.append(f"  (only the first {MAX_STEPS} steps compared)")
    if same:
        attempts = ", ".join(str(n) for n in same)
        out.lines.append(
            f"# {task}: same shapes and values on {left_host} and {right_host} (attempts {attempts})"
        )
