"""``analyse_run``: a run directory in, a ``RunReport`` out (the content of ``report.json``).

One streaming pass over every trace builds a small ``AttemptSummary`` per attempt; everything after
that works on summaries. Per-step data is re-read from disk only for the shape diff of a task whose
shapes (or argument values) actually differ, one pair of traces at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

from agent_runner.wire import REFUSED_API
from orchestrator.analysis.attempts import AttemptSummary, TraceSummariser, iter_steps, iter_turns_by_value
from orchestrator.analysis.attribution import (
    attribution,
    cause_line,
    cut_words,
    explain_cause,
    explain_spent,
    leaf_text,
    read_explain,
)
from orchestrator.analysis.flips import (
    TaskFlip,
    correct_flips,
    effective_gate,
    flaky_hosts,
    flip_rate,
    pass_hat_k,
    task_flip,
)
from orchestrator.analysis.leaks import cross_host_leaks
from orchestrator.analysis.models import (
    ACTIONS,
    PREDICATE_OUTPUT_CAP,
    ArgsDiff,
    ArgValue,
    BurnFinding,
    HostEntry,
    HostRate,
    HostStats,
    Leak,
    OutsideWorkspace,
    RunReport,
    ShapeDiff,
    TaskReport,
)
from orchestrator.analysis.shapes import Step, arg_values_differing, shape_edits, step_of, turn_args
from orchestrator.analysis.stats import (
    CORRECTIONS,
    DEFAULT_ALPHA,
    DEFAULT_CORRECTION,
    pass_rate,
    wilson_interval,
)
from orchestrator.analysis.verdict import (
    AGENT_CALL_KINDS,
    classify_task,
    same_fingerprint,
    same_host,
    who_acts,
)
from orchestrator.dotted import flatten
from orchestrator.model.hold import HoldSummary
from orchestrator.selection import TaskSelection
from orchestrator.store.rundir import AttemptKey, ResultRow, Run, load_run

MAX_DIFF_STEPS = 20_000  # steps of one trace loaded for a shape diff
MAX_SHAPE_DIFFS = 50  # entries per host and task in report.json
MAX_ARGS_DIFFS = 20
MAX_LEAK_EXAMPLES = 1  # the rest are in each task's leaks
#: a leak's message in the validity reason: room for a long workspace path, whose end is the evidence
MAX_LEAK_MESSAGE = 400


def analyse_run(run_dir: Path, gate: float | None = None, selection: TaskSelection | None = None) -> RunReport:
    """Analyse ``runs/<run_id>/``; ``gate`` (``--gate``) overrides the suite's flip-rate gate;
    ``selection`` (``--tasks/--exclude/--tags``) analyses those tasks only (flip rate, validity)."""
    run = load_run(run_dir)
    alpha = run.alpha if run.alpha is not None else DEFAULT_ALPHA
    correction = _correction(run)
    # --until-decided looked at the evidence several times: each look is tested at alpha / looks
    level = alpha / _looks(run)
    contract = run.contract
    fingerprints = [f.to_json() for f in run.fingerprints.values()]

    hold = HoldSummary.read(run.dir)
    summaries: dict[AttemptKey, AttemptSummary] = {}
    # one memo for every trace of the run
    summariser = TraceSummariser(contract, fingerprints, run.manifest.expect_findings)
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
        flips[task] = _task_flip(run, task, numbers, summaries, reference, level, hold)
        compared[task] = [
            h for h in run.hosts if h != reference and not same_host(h, reference, fp_ids, machines)
        ]
    family = correct_flips(flips, compared, reference, alpha=level, correction=correction)
    task_reports = [
        _task_report(run, task, numbers_of[task], summaries, reference, fp_ids, level, flips[task], hold, machines)
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
    reasons = _invalid_reasons(run, summaries, tasks, reference, fp_ids, machines)
    burn = burn_findings(run)
    if run.manifest.burn_invalidates:
        reasons += _burn_reasons(burn)
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
        notes=[*run.manifest.notes, *_same_machine_notes(run.hosts, machines)],
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


# --- the held model -------------------------------------------------------------------------------


def hold_lines(hold: HoldSummary, task: str, keys: list[str], others: list[str]) -> list[str]:
    """Per host: ``model held for N requests on HOST``, or where it diverged and on what."""
    recorded = hold.recorded_requests(keys)
    lines: list[str] = []
    divergences = [d for d in hold.divergences if d.task == task]
    for host in others:
        held = hold.held_requests(host, keys)
        mine = [d for d in divergences if d.host == host]
        if not mine:
            lines.append(f"model held for {held} of {recorded} request(s) on {host}")
            continue
        for d in mine:
            what = f"{d.role or 'request'} message {d.message}" if d.message is not None else "request"
            lines.append(
                f"diverged at request {d.request} of attempt {d.attempt} on {host}: {what} differs: "
                f"{d.other[:160]!r} (reference: {d.reference[:160]!r}); "
                f"held for {held} of {recorded} request(s)"
            )
    return lines


# --- per task -------------------------------------------------------------------------------------


def _tail(output: str | None) -> str | None:
    """The end of a predicate's output, where its verdict line is."""
    if output is None or len(output) <= PREDICATE_OUTPUT_CAP:
        return output
    return "…" + output[-PREDICATE_OUTPUT_CAP:]


def _task_flip(
    run: Run,
    task: str,
    numbers: range,
    summaries: Mapping[AttemptKey, AttemptSummary],
    reference: str,
    alpha: float,
    hold: HoldSummary | None,
) -> TaskFlip:
    """The task's own evidence, before the suite-wide correction decides its statistical flips."""
    verdicts = {h: [summaries[(h, task, a)].verdict for a in numbers] for h in run.hosts}
    keys = [f"{task}.{a}" for a in numbers]
    others = [h for h in run.hosts if h != reference]
    recorded = hold is not None and hold.recorded_requests(keys) > 0
    # attempts are paired again only where every other host got some of the reference's answers (an
    # agent whose first request names a host-specific path diverges before anything is held)
    held = recorded and hold is not None and all(hold.held_requests(h, keys) for h in others)
    return task_flip(verdicts, reference, alpha=alpha, sampled=task in run.sampled, held=held)


def _task_report(
    run: Run,
    task: str,
    numbers: range,
    summaries: Mapping[AttemptKey, AttemptSummary],
    reference: str,
    fp_ids: Mapping[str, str | None],
    alpha: float,
    flip: TaskFlip,
    hold: HoldSummary | None = None,
    machines: Mapping[str, str | None] | None = None,
) -> TaskReport:
    attempts = {h: [summaries[(h, task, a)] for a in numbers] for h in run.hosts}
    verdicts = {h: [s.verdict for s in seq] for h, seq in attempts.items()}
    sampled = task in run.sampled
    keys = [f"{task}.{a}" for a in numbers]
    others = [h for h in run.hosts if h != reference]
    recorded = hold is not None and hold.recorded_requests(keys) > 0
    report = TaskReport(
        task=task,
        verdicts=verdicts,
        flip=flip.flip,
        flaky_hosts=flaky_hosts(verdicts),
        classification="agree",
        action=ACTIONS["agree"],
        flipped_hosts=flip.flipped_hosts,
        comparable=flip.comparable,
        errors=sum(v == "error" for seq in verdicts.values() for v in seq),
        why={h: [s.why[:300] for s in seq] for h, seq in attempts.items()},
        evidence=flip.evidence,
        sampled=sampled,
        rates=[_host_rate(h, flip, reference) for h in verdicts],
        predicate_output={h: [_tail(s.predicate_output) for s in seq] for h, seq in attempts.items()},
    )
    for seq in attempts.values():
        for s in seq:
            report.problems.extend(s.problems)
            for f in [*s.findings, *s.weak]:
                entry = Leak(
                    host=s.host, step=f.step, kind=f.kind, attempt=s.attempt, tool=f.tool, message=f.message,
                    rule=f.rule, evidence=f.evidence,
                )  # fmt: skip
                (report.weak if f.weak else report.leaks if f.is_leak else report.findings).append(entry)

    shapes_differ: dict[str, bool] = {}
    for host, seq in attempts.items():
        if host == reference:
            continue
        shapes_differ[host] = _compare_shapes(report, host, attempts.get(reference, []), seq)

    decision = classify_task(
        verdicts, reference, fp_ids, shapes_differ, flip, alpha=alpha, sampled=sampled, machines=machines
    )
    report.classification = decision.classification
    report.action = who_acts(
        decision.classification,
        decision.action,
        agent_call_wrong=bool(report.leaks) or any(f.kind in AGENT_CALL_KINDS for f in report.findings),
        tool_answers_differ=any(
            _answers_differ(ref, oth)
            for host in report.flipped_hosts
            for ref, oth in zip(attempts.get(reference, []), attempts[host], strict=False)
        ),
    )
    report.needed_repeat = decision.needed_repeat
    if recorded and hold is not None:
        report.model_hold = hold_lines(hold, task, keys, others)
    # ranked per task: what ties a fact to the task is the task's own words, whoever said them: the
    # verdict's reasons, the predicate's output, and the agent's own argument values that differ
    task_text = "\n".join(
        [w for seq in report.why.values() for w in seq]
        + [o for seq in report.predicate_output.values() for o in seq if o]
        + [x for d in report.args_diff for v in d.values for x in (v.reference, v.other) if x]
    )
    for host in report.flipped_hosts:
        report.attribution.append(
            attribution(reference, run.fingerprints.get(reference), host, run.fingerprints.get(host), task_text)
        )
    if report.attribution:
        report.cause = cause_line(report.attribution)
    return report


def _host_rate(host: str, flip: TaskFlip, reference: str) -> HostRate:
    counts = flip.counts[host]
    low, high = wilson_interval(counts.passes, counts.n)
    p_value = flip.p_values.get(host)
    adjusted = flip.p_adjusted.get(host, p_value)
    return HostRate(
        host=host,
        n=counts.n,
        passes=counts.passes,
        pass_rate=counts.rate,
        ci_low=round(low, 4),
        ci_high=round(high, 4),
        p_value=None if host == reference or p_value is None else round(p_value, 6),
        p_adjusted=None if host == reference or adjusted is None else round(adjusted, 6),
        differs=host in flip.flipped_hosts,
    )


def _answers_differ(ref: AttemptSummary, oth: AttemptSummary) -> bool:
    """The same calls with the same argument values, and a tool answered differently."""
    return (
        ref.has_trace and oth.has_trace and ref.steps > 0
        and ref.shape_hash == oth.shape_hash and ref.values_hash == oth.values_hash
        and ref.answers_hash != oth.answers_hash
    )  # fmt: skip


def _compare_shapes(
    report: TaskReport, host: str, reference: list[AttemptSummary], other: list[AttemptSummary]
) -> bool:
    """Whether the host's shapes differ from the reference's on any attempt; fills the task's diffs."""
    differ = False
    args_done = False
    for ref, oth in zip(reference, other, strict=False):
        if not (ref.has_trace and oth.has_trace):
            continue
        if ref.shape_hash != oth.shape_hash:
            if not differ:  # one diff per host and task: later attempts usually repeat it
                report.shape_diff.extend(_shape_diff(ref, oth))
            differ = True
        elif ref.values_hash != oth.values_hash and not args_done:
            report.args_diff.extend(_args_diff(ref, oth))
            args_done = True
    return differ


def _shape_diff(ref: AttemptSummary, oth: AttemptSummary) -> list[ShapeDiff]:
    assert ref.path is not None and oth.path is not None
    left = list(islice(iter_steps(ref.path), MAX_DIFF_STEPS))
    right = list(islice(iter_steps(oth.path), MAX_DIFF_STEPS))
    return [
        ShapeDiff(
            host=oth.host,
            attempt=oth.attempt,
            op=e.op,
            reference_step=e.reference.step if e.reference else None,
            step=e.other.step if e.other else None,
            reference=e.reference.describe() if e.reference else None,
            other=e.other.describe() if e.other else None,
        )
        for e in shape_edits(left, right)[:MAX_SHAPE_DIFFS]
    ]


def _args_diff(ref: AttemptSummary, oth: AttemptSummary) -> list[ArgsDiff]:
    assert ref.path is not None and oth.path is not None
    # args_differences over iter_steps, streamed pairwise and only as far as the pairs the report
    # keeps; a Step is built only where the values differ (most of two long traces agree)
    pairs: list[tuple[Step, Step, dict[str, object], dict[str, object]]] = []
    for (ref_fp, ref_turn), (oth_fp, oth_turn) in zip(
        iter_turns_by_value(ref.path), iter_turns_by_value(oth.path), strict=False
    ):
        if ref_fp != oth_fp:
            r, o = step_of(ref_turn), step_of(oth_turn)
            assert r is not None and o is not None  # both turns name a tool
            if r.shape == o.shape:  # args_differences' rule; r.args_fp is ref_fp
                pairs.append((r, o, turn_args(ref_turn), turn_args(oth_turn)))
                if len(pairs) >= MAX_ARGS_DIFFS:
                    break
    return [
        ArgsDiff(
            host=oth.host,
            attempt=oth.attempt,
            step=o.step,
            tool=o.tool,
            reference_args_fp=r.args_fp,
            args_fp=o.args_fp,
            values=[ArgValue(key=k, reference=a, other=b) for k, a, b in arg_values_differing(ra, oa)],
        )
        for r, o, ra, oa in pairs[:MAX_ARGS_DIFFS]
    ]


# --- validity -------------------------------------------------------------------------------------


def _flat_pins(pins: Mapping[str, Any]) -> dict[str, str]:
    return {key: leaf_text(leaf) for key, leaf in flatten(dict(pins)).items()}


def burn_findings(run: Run) -> list[BurnFinding]:
    """The ``burn`` isolation findings of every host's fingerprint, in host order."""
    found: list[BurnFinding] = []
    for host in run.hosts:
        fingerprint = run.fingerprints.get(host)
        entries = fingerprint.findings if fingerprint is not None else None
        for f in entries if isinstance(entries, list) else []:
            if isinstance(f, dict) and f.get("action") == "burn":
                found.append(
                    BurnFinding(
                        host=host, kind=str(f.get("kind") or "?"), detail=str(f.get("detail") or ""),
                        meaning=str(f.get("meaning") or ""),
                    )  # fmt: skip
                )
    return found


def outside_workspace(summaries: Mapping[AttemptKey, AttemptSummary]) -> list[OutsideWorkspace]:
    """Every attempt whose files were found outside its workspace, in host, task, attempt order."""
    return [
        OutsideWorkspace(host=h, task=t, attempt=a, paths=s.outside_workspace, count=s.n_outside_workspace)
        for (h, t, a), s in sorted(summaries.items())
        if s.n_outside_workspace
    ]


def _burn_reasons(burn: list[BurnFinding]) -> list[str]:
    by_host: dict[str, list[BurnFinding]] = {}
    for f in burn:
        by_host.setdefault(f.host, []).append(f)
    return [
        f"isolation: {host} has {len(found)} burn finding(s) ([gate] burn_invalidates): "
        + "; ".join(f"{f.kind} ({f.detail})" for f in found)
        for host, found in by_host.items()
    ]


def _invalid_reasons(
    run: Run,
    summaries: Mapping[AttemptKey, AttemptSummary],
    tasks: list[str],
    reference: str,
    fp_ids: Mapping[str, str | None],
    machines: Mapping[str, str | None],
) -> list[str]:
    """Every reason the run is not valid, in the order of the validity rule; empty means valid."""
    reasons: list[str] = []
    if run.manifest.interrupted:
        reasons.append("run interrupted: not every host finished")
    for host in run.hosts:
        if host not in run.fingerprints:
            why = run.fingerprint_problems.get(host, "missing")
            reasons.append(f"fingerprint not stored for {host}: {why}")
    if run.contract is None:
        reasons.append(f"contract not stored: {run.contract_problem}")

    replayed = [h for h in run.hosts if any(s.path is not None for k, s in summaries.items() if k[0] == h)]
    if len(replayed) < 2:
        reasons.append(f"fewer than two hosts replayed ({', '.join(replayed) or 'none'})")
    else:
        distinct = [h for h in replayed if not any(same_host(h, g, fp_ids, machines) for g in replayed if g < h)]
        if len(distinct) < 2:
            same = ", ".join(h for h in replayed if h != replayed[0])
            if all(same_fingerprint(machines.get(h), machines.get(replayed[0])) for h in replayed):
                reasons.append(
                    f"no two replayed hosts are different machines ({same} the same machine as {replayed[0]})"
                )
            else:
                reasons.append(f"no two replayed hosts have different fingerprints ({same} same as {replayed[0]})")

    reasons.extend(_pin_reasons(run, summaries, tasks, reference))

    for host in run.hosts:
        leaks = [(k, s) for k, s in summaries.items() if k[0] == host and s.n_leaks]
        if not leaks:
            continue
        total = sum(s.n_leaks for _, s in leaks)
        examples: list[str] = []
        for (_, task, attempt), s in leaks:
            for f in s.findings:
                if f.is_leak and len(examples) < MAX_LEAK_EXAMPLES:
                    message = cut_words(f.message, MAX_LEAK_MESSAGE)
                    examples.append(f"{task}.{attempt} step {f.step}: {f.kind} [{f.rule}]: {message}")
        reasons.append(f"host leakage: {total} finding(s) in traces from {host} (first: {'; '.join(examples)})")
    for host in run.hosts:
        refused = [s for k, s in summaries.items() if k[0] == host and s.verdict == "error"
                   and s.why.startswith(REFUSED_API)]
        if refused:
            reasons.append(f"model API refused on {host}: {len(refused)} attempt(s) never reached the model "
                           f"({cut_words(refused[0].why, MAX_LEAK_MESSAGE)})")
    return reasons


def _same_machine_notes(hosts: list[str], machines: Mapping[str, str | None]) -> list[str]:
    """One note for each host that is an earlier host's machine under another inventory name (their
    fingerprints may differ: another workspace_root, another user)."""
    notes = []
    for i, host in enumerate(hosts):
        first = next((g for g in hosts[:i] if same_fingerprint(machines.get(host), machines.get(g))), None)
        if first is not None:
            notes.append(
                f"{host} is the same machine as {first} (equal machine identities): compared with each "
                "other they are same_host, a difference between them is not the host's"
            )
    return notes


def _pin_reasons(
    run: Run, summaries: Mapping[AttemptKey, AttemptSummary], tasks: list[str], reference: str
) -> list[str]:
    """``pins differ: <pin> on <host>`` for each pin a host ran with a value other than the reference's."""
    differing: dict[tuple[str, str], list[str]] = {}  # (host, pin) -> tasks
    by_task: dict[str, list[AttemptSummary]] = {}
    for (_, task, _), s in summaries.items():
        if s.pins is not None:
            by_task.setdefault(task, []).append(s)
    for task in tasks:
        seq = sorted(by_task.get(task, []), key=lambda s: (s.host != reference, s.attempt))
        if not seq:
            continue
        base = _flat_pins(seq[0].pins or {})
        for s in seq[1:]:
            pins = _flat_pins(s.pins or {})
            for pin in sorted(base.keys() | pins.keys()):
                if base.get(pin) != pins.get(pin):
                    tasks_of = differing.setdefault((s.host, pin), [])
                    if task not in tasks_of:
                        tasks_of.append(task)
    order = {h: i for i, h in enumerate(run.hosts)}
    return [
        f"pins differ: {pin} on {host} (tasks: {', '.join(tasks_of)})"
        for (host, pin), tasks_of in sorted(
            differing.items(), key=lambda kv: (order.get(kv[0][0], 0), kv[0][1])
        )
    ]
