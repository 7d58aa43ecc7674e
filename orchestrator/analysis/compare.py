"""``crosshost compare RUN_A RUN_B``: the model gap beside the box.

Two runs of one suite on the same hosts whose pins differ only in the agent (its settings, model and
files: ``agent_sha``). Per task, the gap between the two agents on the reference host is judged with
the flip rule itself (``flips.task_flip``: the same exact test where attempts vary or an agent is
sampled, the same-attempt pairing where both agents are deterministic), and set beside the host
differences each run found. If the box moves more tasks than the agents differ on, the comparison
measures the environment, not the models; two runs whose agent pins are equal on every task compare
nothing but the environment and are refused.

Across tasks the gap is one number with a confidence interval: the mean over tasks of B's pass rate
minus A's, paired by task (each task is its own control), its standard error from the spread of the
per-task differences, clustered by tag when the runs' tasks carry tags (tasks of one tag are not
independent evidence). When the interval holds 0 the gap is undecided, and the comparison says how
many tasks (or attempts per task) would make an interval of that width exclude it.
"""

from __future__ import annotations

from math import ceil, sqrt
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from orchestrator.analysis.flips import TaskFlip, correct_flips, task_flip
from orchestrator.analysis.models import RunReport
from orchestrator.analysis.run import analyse_run
from orchestrator.analysis.stats import DEFAULT_CORRECTION, Z95, pass_counts, wilson_interval
from orchestrator.dotted import flatten
from orchestrator.errors import InputError
from orchestrator.store.rundir import RunDir, load_run

#: the pins that may differ between the two runs: who the agent is (settings, model, its files)
AGENT_PINS = ("agent_sha",)

QUIET = "box quiet; the model comparison stands"
LOUD = "an environment comparison wearing a model's name; fix the environment before publishing"
SAME_ORDER = "box noise is the same order as the effect; widen the task set or pin harder"


class AgentRate(BaseModel):
    """One run's agent on one task, on the reference host."""

    n: int
    passes: int
    pass_rate: float | None = None
    ci_low: float
    ci_high: float


class TaskGap(BaseModel):
    task: str
    a: AgentRate
    b: AgentRate
    evidence: str  # "deterministic" or "statistical", as the flip rule decided
    p_value: float
    p_adjusted: float = 1.0  # p_value adjusted across the compared tasks (the suite's correction)
    gap: bool  # the agents differ on this task (on the reference host)
    box_a: list[str] = Field(default_factory=list)  # hosts that differ from the reference in run A
    box_b: list[str] = Field(default_factory=list)

    @property
    def box(self) -> bool:
        return bool(self.box_a or self.box_b)


class Comparison(BaseModel):
    run_a: str
    run_b: str
    suite: str | None
    reference: str | None
    hosts: list[str]
    alpha: float
    agent_pins: dict[str, dict[str, Any]] = Field(default_factory=dict)  # task -> {"a": .., "b": ..}
    tasks: list[TaskGap] = Field(default_factory=list)
    left_out: list[str] = Field(default_factory=list)  # tasks only one run replayed
    model_gap: int = 0  # tasks on which the agents differ
    box_flips: int = 0  # tasks with a host difference in either run
    reading: str = ""
    #: B's pass rate minus A's on the reference host, the mean over tasks, and its 95% interval
    gap_mean: float | None = None
    gap_ci_low: float | None = None
    gap_ci_high: float | None = None
    #: the independent units of that interval: tasks, or the tags the tasks were clustered by
    clusters: int = 0
    clustered_by_tag: bool = False
    #: when the interval holds 0: what would make an interval of its width exclude the observed gap
    resolve: str = ""

    @property
    def exit_code(self) -> int:
        from orchestrator.exit_policy import compare_exit

        return compare_exit(self.model_gap, self.box_flips)


def _pins(run_dir: Path) -> dict[str, Any]:
    return dict(load_run(run_dir).manifest.pins)


def _refusals(a: RunReport, b: RunReport, pins_a: dict[str, Any], pins_b: dict[str, Any]) -> list[str]:
    """Why the two runs cannot be compared: empty when they can."""
    why: list[str] = []
    if a.suite != b.suite:
        why.append(f"suite differs: {a.suite} vs {b.suite}")
    hosts_a, hosts_b = [h.name for h in a.hosts], [h.name for h in b.hosts]
    if sorted(hosts_a) != sorted(hosts_b):
        why.append(f"hosts differ: {', '.join(hosts_a)} vs {', '.join(hosts_b)}")
    if a.reference != b.reference:
        why.append(f"reference differs: {a.reference} vs {b.reference}")
    flat_a, flat_b = flatten(pins_a), flatten(pins_b)
    differing = sorted(
        key
        for key in flat_a.keys() | flat_b.keys()
        if key.split(".", 1)[0] in (pins_a.keys() & pins_b.keys())  # tasks both replayed
        and key.split(".")[-1] not in AGENT_PINS
        and flat_a.get(key) != flat_b.get(key)
    )
    if differing:
        shown = ", ".join(differing[:8]) + (f" and {len(differing) - 8} more" if len(differing) > 8 else "")
        why.append(f"pins differ beyond the agent: {shown}")
    return why


def _agent_rate(verdicts: list[str]) -> AgentRate:
    counts = pass_counts(verdicts)
    low, high = wilson_interval(counts.passes, counts.n)
    return AgentRate(
        n=counts.n, passes=counts.passes, pass_rate=counts.rate, ci_low=round(low, 4), ci_high=round(high, 4)
    )


def reading(model_gap: int, box_flips: int) -> str:
    if box_flips == 0:
        return QUIET
    if box_flips >= model_gap:
        return LOUD
    return SAME_ORDER


def compare_runs(run_a: Path, run_b: Path, alpha: float | None = None) -> Comparison:
    """Compare two run directories; ``InputError`` (exit 2) names what makes them incomparable."""
    for run in (run_a, run_b):
        if not RunDir(run).manifest_path.is_file():
            raise InputError(f"{run}: not a run directory (no manifest.json); give two runs/<run_id>/ directories")
    a, b = analyse_run(run_a), analyse_run(run_b)
    pins_a, pins_b = _pins(run_a), _pins(run_b)
    why = _refusals(a, b, pins_a, pins_b)
    if why:
        raise InputError(f"{run_a} and {run_b} cannot be compared: {'; '.join(why)}")
    level = alpha if alpha is not None else a.alpha
    reference = a.reference or ""
    tasks_b = {t.task: t for t in b.tasks}
    out = Comparison(
        run_a=a.run_id,
        run_b=b.run_id,
        suite=a.suite,
        reference=a.reference,
        hosts=[h.name for h in a.hosts],
        alpha=level,
        left_out=sorted({t.task for t in a.tasks} ^ tasks_b.keys()),
    )
    flips: dict[str, TaskFlip] = {}
    for ta in a.tasks:
        tb = tasks_b.get(ta.task)
        if tb is None:
            continue
        seq_a, seq_b = ta.verdicts.get(reference, []), tb.verdicts.get(reference, [])
        flip = flips[ta.task] = task_flip({"a": seq_a, "b": seq_b}, "a", alpha=level, sampled=ta.sampled or tb.sampled)
        out.tasks.append(
            TaskGap(
                task=ta.task,
                a=_agent_rate(seq_a),
                b=_agent_rate(seq_b),
                evidence=flip.evidence,
                p_value=round(flip.p_values.get("b", 1.0), 6),
                gap=flip.flip,
                box_a=list(ta.flipped_hosts),
                box_b=list(tb.flipped_hosts),
            )
        )
        agent_a = (pins_a.get(ta.task) or {}).get("agent_sha")
        agent_b = (pins_b.get(ta.task) or {}).get("agent_sha")
        if agent_a != agent_b:
            out.agent_pins[ta.task] = {"a": agent_a, "b": agent_b}
    if not out.agent_pins and out.tasks:
        raise InputError(
            f"{run_a} and {run_b} cannot be compared as agents: their agent pins (agent_sha) are equal on every "
            "task, so only the environment changed between them; compare environments with crosshost report "
            "on each run or crosshost history"
        )
    # the agents' gap is declared at one error rate over the tasks, as host differences are
    correct_flips(flips, {t: ["b"] for t in flips}, "a", alpha=level, correction=a.correction or DEFAULT_CORRECTION)
    for t in out.tasks:
        t.gap = flips[t.task].flip
        t.p_adjusted = round(flips[t.task].p_adjusted.get("b", 1.0), 6)
    out.model_gap = sum(t.gap for t in out.tasks)
    out.box_flips = sum(t.box for t in out.tasks)
    out.reading = reading(out.model_gap, out.box_flips)
    gap_interval(out, load_run(run_a).manifest.task_tags)
    return out


def gap_interval(c: Comparison, tags: dict[str, list[str]]) -> None:
    """The mean per-task gap (B minus A) with its 95% interval, clustered by each task's first tag when
    any task has one; when it holds 0, what would resolve it (``Comparison.resolve``)."""
    rows = [(t.task, t.a, t.b) for t in c.tasks if t.a.n and t.b.n]
    if not rows:
        return
    diffs = {task: b.passes / b.n - a.passes / a.n for task, a, b in rows}
    mean = sum(diffs.values()) / len(diffs)
    c.clustered_by_tag = any(tags.get(task) for task in diffs)
    groups: dict[str, float] = {}
    for task, d in diffs.items():
        key = tags[task][0] if c.clustered_by_tag and tags.get(task) else f"task:{task}"
        groups[key] = groups.get(key, 0.0) + d - mean
    g, n = len(groups), len(diffs)
    c.clusters = g
    c.gap_mean = round(mean, 4)
    if g < 2:
        c.resolve = "one cluster: no interval; add tasks (or tags)"
        return
    se = sqrt(g / (g - 1) * sum(x * x for x in groups.values())) / n
    c.gap_ci_low, c.gap_ci_high = round(mean - Z95 * se, 4), round(mean + Z95 * se, 4)
    if c.gap_ci_low <= 0 <= c.gap_ci_high:
        c.resolve = _resolve(mean, se, n, rows)


def _resolve(mean: float, se: float, n: int, rows: list[tuple[str, AgentRate, AgentRate]]) -> str:
    """How many tasks, or attempts per task, would make the interval exclude 0 at the observed gap."""
    if mean == 0:
        return "no gap measured: more tasks or attempts narrow the interval around 0"
    tasks = ceil(n * (Z95 * se / abs(mean)) ** 2) + 1
    # the attempts' own noise in the mean: what more attempts per task could take away
    within = sum(
        r.passes / r.n * (1 - r.passes / r.n) / r.n for _, a, b in rows for r in (a, b)
    ) / (n * n)
    between = max(0.0, se * se - within)
    target = (mean / Z95) ** 2
    attempts = max(r.n for _, a, b in rows for r in (a, b))
    said = f"about {tasks} task(s) at this spread would resolve the gap of {mean:+.3f}"
    if within > 0 and target > between:
        needed = ceil(attempts * within / (target - between)) + 1
        return said + f", or --repeat {needed} on these {n} task(s)"
    return said + "; more attempts on these tasks cannot (the tasks themselves disagree)"
