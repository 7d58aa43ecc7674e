"""``analyse_run``: a run directory in, a ``RunReport`` out (the content of ``report.json``).

One streaming pass over every trace builds a small ``AttemptSummary`` per attempt (and, for a replay,
keeps the records it parsed, up to a bound, for the report page that shows the same traces:
``TraceRecords``); everything after that works on summaries. Per-step data is re-read from disk only for the shape diff of a task whose
shapes (or argument values) actually differ, one pair of traces at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.analysis.attempts import AttemptSummary, TraceRecords, TraceSummariser
from orchestrator.analysis.attribution import cause_line, explain_cause, explain_spent, read_explain
from orchestrator.analysis.flips import TaskFlip, correct_flips, effective_gate, flip_rate, pass_hat_k
from orchestrator.analysis.leaks import cross_host_leaks
from orchestrator.analysis.models import HostEntry, HostStats, RunReport
from orchestrator.analysis.stats import CORRECTIONS, DEFAULT_ALPHA, DEFAULT_CORRECTION, pass_rate
from orchestrator.analysis.task_report import task_flip_in_run, task_report
from orchestrator.analysis.validity import (
    burn_findings,
    burn_reasons,
    invalid_reasons,
    outside_workspace,
    same_machine_notes,
)
from orchestrator.analysis.verdict import same_host
from orchestrator.selection import TaskSelection
from orchestrator.store.rundir import AttemptKey, ResultRow, Run, RunDir, load_run

if TYPE_CHECKING:
    from orchestrator.model.hold import HoldSummary


def _held(run_dir: RunDir) -> HoldSummary | None:
    """The run's held-model summary. Its module (and every model API's) loads only for a run that
    has one: a run without a live model analyses without them."""
    if not run_dir.model_hold_path.exists():
        return None
    from orchestrator.model.hold import HoldSummary

    return HoldSummary.read(run_dir)


def analyse_run(
    run_dir: Path, gate: float | None = None, selection: TaskSelection | None = None, *, keep: TraceRecords | None = None
) -> RunReport:
    """Analyse ``runs/<run_id>/``; ``gate`` (``--gate``) overrides the suite's flip-rate gate;
    ``selection`` (``--tasks/--exclude/--tags``) analyses those tasks only (flip rate, validity);
    ``keep``: where the traces' records are kept for the report page."""
    run = load_run(run_dir)
    alpha = run.alpha if run.alpha is not None else DEFAULT_ALPHA
    correction = _correction(run)
    # --until-decided looked at the evidence several times: each look is tested at alpha / looks
    level = alpha / _looks(run)
    contract = run.contract
    fingerprints = [f.to_json() for f in run.fingerprints.values()]

    hold = _held(run.dir)
    summaries: dict[AttemptKey, AttemptSummary] = {}
    # one memo for every trace of the run
    summariser = TraceSummariser(contract, fingerprints, run.manifest.expect_findings, keep)
    traces = list(run.trace_files())
    rows = run.results()
    tasks = list(dict.fromkeys([*run.manifest.tasks, *sorted({k[1] for k, _ in traces} | {k[1] for k in rows})]))
    if selection is not None and not selection.everything:
        tasks = selection.select(tasks, run.manifest.task_tags, str(run_dir))
        rows = {k: v for k, v in rows.items() if k[1] in tasks}
    for (host, task, attempt), path in traces:
        if host not in run.hosts:
            run.hosts.append(host)
        if task in tasks:
            summaries[(host, task, attempt)] = summariser.summarise(path, host, task, attempt)

    fp_ids = {host: _fingerprint_id(run, host, summaries) for host in run.hosts}
    machines = {host: fp.same_machine_key for host, fp in run.fingerprints.items()}
    reference = run.reference or (run.hosts[0] if run.hosts else "")
    cross_host_leaks(summaries, run.fingerprints, contract, run.hosts, reference)

    attempts_of: dict[str, int] = {}
    for _, task, attempt in (*summaries, *rows):
        attempts_of[task] = max(attempts_of.get(task, 0), attempt + 1)

    flips: dict[str, TaskFlip] = {}
    compared: dict[str, list[str]] = {}
    numbers_of: dict[str, range] = {}
    first_attempt = max(0, run.manifest.first_attempt)  # a round of --until-decided numbers on from there
    for task in tasks:
        # --until-decided: a task decided early has fewer attempts than the run's repeat
        planned = run.manifest.task_repeat.get(task) or run.manifest.repeat or 0
        numbers = numbers_of[task] = range(first_attempt, max(first_attempt + planned, attempts_of.get(task, 0)))
        for host in run.hosts:
            for attempt in numbers:
                key = (host, task, attempt)
                if key not in summaries:
                    summaries[key] = _missing_attempt(run, key, rows)
        flips[task] = task_flip_in_run(run, task, numbers, summaries, reference, level, hold)
        compared[task] = [
            h for h in run.hosts if h != reference and not same_host(h, reference, fp_ids, machines)
        ]
    family = correct_flips(flips, compared, reference, alpha=level, correction=correction)
    task_reports = [
        task_report(run, task, numbers_of[task], summaries, reference, fp_ids, level, flips[task], hold, machines)
        for task in tasks
    ]

    explained = read_explain(run.dir.explain_path, run.problems)
    if explained is not None:
        by_task = {e.task: e for e in explained.tasks}
        for t in task_reports:
            entry = by_task.get(t.task)
            if entry is not None and t.flip:
                t.explain = entry
                first = explain_cause(entry, reference)
                t.cause = "; ".join(x for x in (first, cause_line(t.attribution, explained=True)) if x)

    flipped = sum(t.flip for t in task_reports)
    comparable = sum(t.comparable for t in task_reports)
    undecided = [t for t in task_reports if t.comparable and t.classification == "underpowered"]
    allow_undecided = max(0, run.manifest.allow_undecided)
    rate = flip_rate(flipped, comparable)
    gate_value = effective_gate(gate, run.gate)
    reasons = invalid_reasons(run, summaries, tasks, reference, fp_ids, machines)
    burn = burn_findings(run)
    if run.manifest.burn_invalidates:
        reasons += burn_reasons(burn)
    hosts = [
        HostEntry(
            name=h,
            fingerprint=fp_ids.get(h),
            reachable=_reachable(run, h, summaries),
            error=_host_error(run, h),
            replayed=any(s.path is not None for k, s in summaries.items() if k[0] == h),
        )
        for h in run.hosts
    ]
    return RunReport(
        run_id=run.run_id,
        suite=run.manifest.suite_name,
        valid=not reasons,
        invalid_reasons=reasons,
        gate=gate_value,
        flip_rate=rate,
        reference=reference or None,
        hosts=hosts,
        tasks=task_reports,
        suite_sha=run.manifest.suite.sha if run.manifest.suite else None,
        # a run where nothing was comparable measured nothing: it does not pass a gate
        within_gate=comparable > 0 and rate <= gate_value,
        flipped=flipped,
        comparable=comparable,
        error_attempts=sum(s.verdict == "error" for s in summaries.values()),
        error_tasks=sum(t.errors > 0 for t in task_reports),
        interrupted=run.manifest.interrupted,
        stats=[_host_stats(h, tasks, summaries) for h in run.hosts],
        problems=run.problems,
        alpha=alpha,
        burn=burn,
        burn_invalidates=run.manifest.burn_invalidates,
        outside_workspace=outside_workspace(summaries),
        notes=[*run.manifest.notes, *same_machine_notes(run.hosts, machines)],
        hold_model=run.manifest.hold_model,
        explain=None if explained is None else explain_spent(explained),
        correction=correction,
        family=family,
        looks=_looks(run),
        undecided=len(undecided),
        allow_undecided=allow_undecided,
        settle_repeat=max((t.needed_repeat for t in undecided if t.needed_repeat is not None), default=None),
        inconclusive=len(undecided) > allow_undecided,
    )


def _looks(run: Run) -> int:
    return max(1, run.manifest.looks)


def _correction(run: Run) -> str:
    value = run.manifest.correction
    return value if value in CORRECTIONS else DEFAULT_CORRECTION


# --- per attempt / per host helpers ---------------------------------------------------------------


def _fingerprint_id(run: Run, host: str, summaries: Mapping[AttemptKey, AttemptSummary]) -> str | None:
    """The host's fingerprint id: from the manifest, else fingerprint.json, else its trace headers."""
    record = run.host_record(host)
    if record is not None and record.fingerprint:
        return record.fingerprint
    stored = run.fingerprints.get(host)
    if stored is not None and stored.fingerprint:
        return stored.fingerprint
    for (h, _, _), summary in summaries.items():
        if h == host and summary.fingerprint:
            return summary.fingerprint
    return None


def _host_error(run: Run, host: str) -> str | None:
    record = run.host_record(host)
    return record.error if record is not None and record.error else None


def _reachable(run: Run, host: str, summaries: Mapping[AttemptKey, AttemptSummary]) -> bool:
    record = run.host_record(host)
    if record is not None:
        return record.reachable
    return any(s.path is not None for k, s in summaries.items() if k[0] == host)


def _missing_attempt(run: Run, key: AttemptKey, rows: Mapping[AttemptKey, ResultRow]) -> AttemptSummary:
    """An attempt without a trace is an ``error``: nothing of it can be checked."""
    host, task, attempt = key
    summary = AttemptSummary(host, task, attempt, None)
    trace = run.dir.trace_path(host, task, attempt)
    row = rows.get(key)
    host_error = _host_error(run, host)
    if row is not None and row.verdict == "error" and row.reason:
        summary.why = row.reason
    elif host_error:
        summary.why = f"{host}: {host_error}"
    else:
        summary.why = f"{trace}: missing"
    return summary


def _host_stats(host: str, tasks: Iterable[str], summaries: Mapping[AttemptKey, AttemptSummary]) -> HostStats:
    per_task: dict[str, tuple[int, int]] = {t: (0, 0) for t in tasks}
    stats = HostStats(host=host)
    for (h, task, _), s in summaries.items():
        if h != host:
            continue
        stats.attempts += 1
        if s.verdict == "error":
            stats.errors += 1
            continue
        n, c = per_task.get(task, (0, 0))
        per_task[task] = (n + 1, c + (s.verdict == "pass"))
        stats.passed += s.verdict == "pass"
        stats.failed += s.verdict == "fail"
    stats.pass_rate = pass_rate(stats.passed, stats.passed + stats.failed)
    outcomes = list(per_task.values())
    for k in range(1, max((n for n, _ in outcomes), default=0) + 1):
        value = pass_hat_k(outcomes, k)
        if value is not None:
            stats.pass_k[str(k)] = round(value, 4)
    return stats
