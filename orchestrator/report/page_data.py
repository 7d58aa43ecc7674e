"""What the script of ``report.html`` reads (``assets/report.js``): the run, its hosts, its tasks
and their traces as plain JSON-able data."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from orchestrator.analysis.attempts import TraceRecords
from orchestrator.analysis.attribution import again_line, path_line, trial_line
from orchestrator.analysis.flips import flipped_attempts
from orchestrator.analysis.models import RunReport, TaskReport
from orchestrator.report.page_traces import (
    PageTrace,
    PairView,
    TraceView,
    load_trace,
    pair,
    trace_files,
)

MAX_STEPS_PER_TRACE = 300  # steps of one trace embedded (and aligned); the raw file has them all
MAX_EMBEDDED_STEPS = 25_000  # steps embedded in one page; tasks that agree lose their traces first

_TASK_FIELDS = (
    "task",
    "verdicts",
    "flip",
    "flipped_hosts",
    "flaky_hosts",
    "classification",
    "action",
    "why",
    "leaks",
    "weak",
    "findings",
    "shape_diff",
    "args_diff",
    "attribution",
    "problems",
    "predicate_output",
    "model_hold",
)


# shown by the page in their own way, or not at all (the statistics only for sampled agents)
_KNOWN = {*_TASK_FIELDS, "comparable", "errors", "evidence", "sampled", "rates", "needed_repeat", "cause", "explain"}


class CounterfactualView(TypedDict):
    line: str
    reproduces: bool | None


class PathView(TypedDict):
    line: str
    path: str
    by: list[str]
    state: dict[str, str]


class ExplainView(TypedDict):
    again: str
    counterfactuals: list[CounterfactualView]
    paths: list[PathView]
    not_collected: list[str]


class TaskTraces(TypedDict):
    """Per task: per host the trace ids of its attempts, per other host the pairs with the reference."""

    traces: dict[str, list[int | None]]
    pairs: dict[str, list[PairView | None]]
    embedded: bool


class RunView(TypedDict):
    run_id: str
    suite: str | None
    reference: str
    valid: bool
    invalid_reasons: list[str]
    flip_rate: float
    gate: float
    within_gate: bool
    flipped: int
    comparable: int
    explain: str | None


class HostView(TypedDict):
    name: str
    reference: bool
    fingerprint: str | None
    reachable: bool
    error: str | None
    pass_rate: float | None
    passed: int
    failed: int
    errors: int
    pass_k: dict[str, float]
    leaks: int
    findings: int


class PageData(TypedDict):
    run: RunView
    hosts: list[HostView]
    tasks: list[dict[str, Any]]  # a TaskReport's fields as dumped (_TASK_FIELDS), the views beside them
    traces: list[TraceView]


def _explain_view(task: TaskReport, reference: str) -> ExplainView | None:
    """``crosshost explain``'s evidence for the task as the sentences report.md has (one home for them)."""
    entry = task.explain
    if entry is None:
        return None
    return ExplainView(
        again=again_line(entry),
        counterfactuals=[
            CounterfactualView(line=trial_line(cf, reference), reproduces=cf.reproduces) for cf in entry.counterfactuals
        ],
        paths=[PathView(line=path_line(p), path=p.path, by=p.by, state=p.state) for p in entry.paths],
        not_collected=entry.not_collected,
    )


def _task_order(report: RunReport) -> list[TaskReport]:
    """Tasks by how much their traces matter: flips, then any finding, then the rest."""

    def weight(t: TaskReport) -> int:
        if t.flip:
            return 0
        if t.classification != "agree" or t.leaks or t.weak or t.shape_diff or t.args_diff:
            return 1
        return 2

    return sorted(report.tasks, key=weight)


# --- the data the script renders ------------------------------------------------------------------


def build_data(report: RunReport, run_dir: Path, kept: TraceRecords | None = None) -> PageData:
    """Everything the page's script shows, as plain JSON-able data (``kept``: the traces' records the
    analysis kept; the others are read from their files)."""
    hosts = report.host_names()
    reference = report.reference or (hosts[0] if hosts else "")
    files = trace_files(run_dir)
    traces: list[TraceView] = []
    per_task: dict[str, TaskTraces] = {}
    budget = MAX_EMBEDDED_STEPS
    for task in _task_order(report):
        entry = TaskTraces(traces={}, pairs={}, embedded=True)
        loaded: dict[tuple[str, int], PageTrace] = {}
        n_attempts = max((len(v) for v in task.verdicts.values()), default=0)
        for host in hosts:
            ids: list[int | None] = []
            for attempt in range(n_attempts):
                path = files.get((host, task.task, attempt))
                if path is None:
                    ids.append(None)
                    continue
                if budget <= 0:
                    entry["embedded"] = False
                    ids.append(None)
                    continue
                trace = load_trace(path, min(MAX_STEPS_PER_TRACE, budget), kept.typed(path) if kept is not None else None)
                budget -= max(1, len(trace.steps))
                loaded[(host, attempt)] = trace
                ids.append(len(traces))
                traces.append(trace.to_json())
            entry["traces"][host] = ids
        for host in hosts:
            if host == reference:
                continue
            entry["pairs"][host] = [
                pair(loaded[(reference, a)], loaded[(host, a)])
                if (reference, a) in loaded and (host, a) in loaded
                else None
                for a in range(n_attempts)
            ]
        per_task[task.task] = entry

    stats = {s.host: s for s in report.stats}
    host_rows = []
    for name in hosts:
        entry_h = next((h for h in report.hosts if h.name == name), None)
        s = stats.get(name)
        host_rows.append(
            HostView(
                name=name,
                reference=name == reference,
                fingerprint=entry_h.fingerprint if entry_h else None,
                reachable=entry_h.reachable if entry_h else True,
                error=entry_h.error if entry_h else None,
                pass_rate=s.pass_rate if s else None,
                passed=s.passed if s else 0,
                failed=s.failed if s else 0,
                errors=s.errors if s else 0,
                pass_k=s.pass_k if s else {},
                leaks=sum(1 for t in report.tasks for leak in t.leaks if leak.host == name),
                findings=sum(1 for t in report.tasks for f in t.findings if f.host == name),
            )
        )

    tasks = []
    for task in report.tasks:
        dumped = task.model_dump(mode="json")
        row = {k: dumped.get(k) for k in _TASK_FIELDS}
        # fields the analysis adds later (evidence, explanations) are shown as they come
        if task.sampled or task.evidence != "deterministic":
            row["statistics"] = {
                "evidence": task.evidence,
                "needed_repeat": task.needed_repeat,
                "rates": dumped["rates"],
            }
        row["extra"] = {k: v for k, v in dumped.items() if k not in _KNOWN and v}
        row["cause"] = task.cause if task.flip else ""
        row["explain"] = _explain_view(task, reference)
        row["flipped_attempts"] = {h: sorted(flipped_attempts(task, h, reference)) for h in hosts}
        row.update(per_task.get(task.task, {}))
        tasks.append(row)

    return PageData(
        run=RunView(
            run_id=report.run_id,
            suite=report.suite,
            reference=reference,
            valid=report.valid,
            invalid_reasons=report.invalid_reasons,
            flip_rate=report.flip_rate,
            gate=report.gate,
            within_gate=report.within_gate,
            flipped=report.flipped,
            comparable=report.comparable,
            explain=report.explain,
        ),
        hosts=host_rows,
        tasks=tasks,
        traces=traces,
    )
