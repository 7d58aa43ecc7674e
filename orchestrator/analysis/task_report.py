"""One task of a run judged: its flip before the suite-wide correction, its ``TaskReport`` (verdicts,
rates, findings, the shape and argument diffs, the decision and who acts, the attribution) and what
the held model did for it."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import islice
from typing import TYPE_CHECKING

from orchestrator.analysis.attempts import AttemptSummary, iter_steps, iter_turns_by_value
from orchestrator.analysis.attribution import attribution, cause_line
from orchestrator.analysis.flips import TaskFlip, flaky_hosts, task_flip
from orchestrator.analysis.models import (
    ACTIONS,
    PREDICATE_OUTPUT_CAP,
    ArgsDiff,
    ArgValue,
    HostRate,
    Leak,
    ShapeDiff,
    TaskReport,
)
from orchestrator.analysis.shapes import Step, arg_values_differing, shape_edits, step_of, turn_args
from orchestrator.analysis.stats import wilson_interval
from orchestrator.analysis.verdict import AGENT_CALL_KINDS, classify_task, who_acts
from orchestrator.store.rundir import AttemptKey, Run

if TYPE_CHECKING:
    from orchestrator.model.hold import HoldSummary

MAX_DIFF_STEPS = 20_000  # steps of one trace loaded for a shape diff
MAX_SHAPE_DIFFS = 50  # entries per host and task in report.json
MAX_ARGS_DIFFS = 20


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


def _tail(output: str | None) -> str | None:
    """The end of a predicate's output, where its verdict line is."""
    if output is None or len(output) <= PREDICATE_OUTPUT_CAP:
        return output
    return "…" + output[-PREDICATE_OUTPUT_CAP:]


def task_flip_in_run(
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


def task_report(
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
