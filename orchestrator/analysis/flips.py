"""The flip rule, flakiness and pass^k over verdict lists; the attempt-paired ``flips`` table of a
results.jsonl.

A verdict list is indexed by attempt; ``error`` verdicts never count as a flip (they are counted
apart). A flip is a host difference that within-host noise cannot explain (``task_flip``):

- deterministic evidence (the agent is not sampled and every host's non-error attempts agree with
  each other): a verdict that differs from the reference's on the same attempt, as it always was; a
  task is comparable when one same-attempt pair of non-error verdicts exists;
- otherwise statistical evidence: a host differs from the reference only when Fisher's exact test on
  the two hosts' pass counts gives p < alpha; comparable when both have a non-error attempt;
- held evidence (a held model: every host replayed the reference's model answers, attempt by
  attempt): the same-attempt pairing again, even for a sampled agent and at one attempt a host.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import comb
from pathlib import Path

from agent_runner.suite import Gate
from orchestrator.analysis.models import TaskReport
from orchestrator.analysis.stats import (
    DEFAULT_ALPHA,
    DEFAULT_CORRECTION,
    Counts,
    adjust_p_values,
    fisher_exact,
    margin_min_p,
    pass_counts,
)
from orchestrator.errors import TraceError
from orchestrator.store.jsonl import iter_results

#: the highest flip rate that passes when neither ``--gate`` nor the suite's ``[gate]`` says
DEFAULT_GATE = Gate.flip_rate
DETERMINISTIC, STATISTICAL, HELD = "deterministic", "statistical", "held"


def effective_gate(option: float | None, manifest: float | None) -> float:
    """``--gate`` wins, then the manifest's (the suite's) gate, then ``DEFAULT_GATE``."""
    if option is not None:
        return option
    return manifest if manifest is not None else DEFAULT_GATE


@dataclass
class TaskFlip:
    flip: bool
    flipped_hosts: list[str]
    comparable: bool
    evidence: str = DETERMINISTIC
    counts: dict[str, Counts] = field(default_factory=dict)
    p_values: dict[str, float] = field(default_factory=dict)  # every host but the reference
    #: the p-values after the suite-wide correction (``correct_flips``); raw where none was made
    p_adjusted: dict[str, float] = field(default_factory=dict)


def task_flip(
    verdicts: Mapping[str, Sequence[str]],
    reference: str,
    *,
    alpha: float = DEFAULT_ALPHA,
    sampled: bool = False,
    held: bool = False,
) -> TaskFlip:
    """Which hosts differ from the reference on one task, and on what evidence (see the module doc).

    ``held``: the model was held (every host's attempt i got the reference's attempt i answers), so
    attempt i is paired again, whatever the agent samples and however its attempts vary."""
    counts = {h: pass_counts(seq) for h, seq in verdicts.items()}
    ref_counts = counts.get(reference, Counts(0, 0))
    p_values = {
        h: fisher_exact(ref_counts.passes, ref_counts.n, c.passes, c.n)
        for h, c in counts.items()
        if h != reference
    }
    if not held and (sampled or flaky_hosts(verdicts)):
        flipped = [h for h, p in p_values.items() if p < alpha]
        comparable = ref_counts.n > 0 and any(c.n > 0 for h, c in counts.items() if h != reference)
        return TaskFlip(bool(flipped), flipped, comparable, STATISTICAL, counts, p_values)
    ref = verdicts.get(reference, ())
    flipped = []
    comparable = False
    for host, seq in verdicts.items():
        if host == reference:
            continue
        pairs = attempt_pairs(ref, seq)
        comparable = comparable or bool(pairs)
        if any(flip for _, flip in pairs):
            flipped.append(host)
    return TaskFlip(bool(flipped), flipped, comparable, HELD if held else DETERMINISTIC, counts, p_values)


def correct_flips(
    flips: Mapping[str, TaskFlip],
    compared: Mapping[str, Sequence[str]],
    reference: str,
    *,
    alpha: float = DEFAULT_ALPHA,
    correction: str = DEFAULT_CORRECTION,
) -> int:
    """Declare host differences on statistical evidence at one error rate for the whole suite.

    The family is every statistical comparison of a task's ``compared`` hosts with the reference whose
    margins could give p < alpha at all (an all-pass or all-fail comparison never can; leaving it out
    costs no error rate and keeps a suite of mostly decided tasks from diluting alpha: Tarone's rule).
    Holm's or Benjamini–Hochberg's adjusted p-value below alpha declares the host different; the
    deterministic and held rules are untouched. Updates ``flips`` in place; returns the family's size.
    """
    family: list[tuple[str, str]] = []
    raw: list[float] = []
    for task, flip in flips.items():
        flip.p_adjusted = dict(flip.p_values)
        if flip.evidence != STATISTICAL:
            continue
        ref = flip.counts.get(reference, Counts(0, 0))
        for host in compared.get(task, ()):
            c = flip.counts.get(host, Counts(0, 0))
            if margin_min_p(ref.n, c.n, ref.passes + c.passes) < alpha:
                family.append((task, host))
                raw.append(flip.p_values[host])
    for (task, host), p in zip(family, adjust_p_values(raw, correction), strict=True):
        flips[task].p_adjusted[host] = p
    members = set(family)
    for task, flip in flips.items():
        if flip.evidence == STATISTICAL:
            flip.flipped_hosts = [h for h, p in flip.p_adjusted.items() if (task, h) in members and p < alpha]
            flip.flip = bool(flip.flipped_hosts)
    return len(family)


def attempt_pairs(reference: Sequence[str], other: Sequence[str]) -> list[tuple[int, bool]]:
    """The one flip-per-attempt rule: (attempt, flipped) for every attempt both hosts have with a
    non-error verdict; flipped when the other host's verdict differs from the reference's."""
    return [(i, v != reference[i]) for i, v in enumerate(other) if i < len(reference) and "error" not in (v, reference[i])]


def flipped_attempts(task: TaskReport, host: str, reference: str | None) -> set[int]:
    """Attempts whose verdict differs from the reference's on the same attempt: marked only where that
    pairing is the evidence (deterministic); a sampled agent's attempt i means nothing on another host."""
    if task.evidence != "deterministic" or host == reference:
        return set()
    return {i for i, flip in attempt_pairs(task.verdicts.get(reference or "", []), task.verdicts.get(host, [])) if flip}


def flaky_hosts(verdicts: Mapping[str, Sequence[str]]) -> list[str]:
    """Hosts whose non-error attempts of one task disagree with each other."""
    return [h for h, seq in verdicts.items() if len({v for v in seq if v != "error"}) > 1]


def flip_rate(flipped: int, comparable: int) -> float:
    """Rounded to the 3 decimals every report prints, so the number shown is the number judged."""
    return round(flipped / comparable, 3) if comparable else 0.0


def pass_hat_k(outcomes: Sequence[tuple[int, int]], k: int) -> float | None:
    """pass^k: per task C(c,k)/C(n,k) (all k drawn attempts pass), averaged over tasks with n >= k.

    ``outcomes`` holds (n non-error attempts, c passes) per task.
    """
    scores = [comb(c, k) / comb(n, k) for n, c in outcomes if n >= k]
    return sum(scores) / len(scores) if scores else None


# --- the flips table of any results.jsonl ----------------------------------------------------------


@dataclass
class FlipsTable:
    env_a: str
    env_b: str
    gate: float
    rows: list[tuple[str, str, str, bool]] = field(default_factory=list)
    flips: int = 0
    comparable: int = 0
    errors: int = 0

    @property
    def flip_rate(self) -> float:
        return flip_rate(self.flips, self.comparable)

    @property
    def within_gate(self) -> bool:
        """Nothing comparable (every row an error or one-sided) measures nothing, so it never passes."""
        return self.comparable > 0 and self.flip_rate <= self.gate


def flips_table(
    path: Path, env_a: str, env_b: str, attempt: int = 0, gate: float | None = None
) -> FlipsTable:
    """The flip table of two environments on one attempt of a ``results.jsonl`` of any known shape
    (rows of other tools, with ``passed`` and no ``attempt``, among them)."""
    seen: dict[str, dict[str, str]] = {}
    first_at: dict[tuple[str, str], str] = {}
    envs: set[str] = set()
    for where, row in iter_results(path):
        envs.add(row.env)
        if row.env not in (env_a, env_b) or row.attempt != attempt:
            continue
        # Two rows for one task, env and attempt: which one is the verdict is the user's call, not ours.
        if (row.task, row.env) in first_at:
            raise TraceError(
                f"{where}: task {row.task!r} env {row.env!r} attempt {attempt} again "
                f"(first at {first_at[row.task, row.env]}); keep one row per task, env and attempt"
            )
        first_at[row.task, row.env] = where
        seen.setdefault(row.task, {})[row.env] = row.verdict
    for env in (env_a, env_b):
        if env not in envs:
            present = ", ".join(sorted(envs)) or "none"
            raise TraceError(f"{path}: no rows for env {env!r} (envs present: {present})")
    table = FlipsTable(env_a, env_b, effective_gate(gate, None))
    for task in sorted(seen):
        a = seen[task].get(env_a, "-")
        b = seen[task].get(env_b, "-")
        if "error" in (a, b):
            table.errors += 1
        result = task_flip({env_a: [a], env_b: [b]}, env_a) if "-" not in (a, b) else None
        flip = bool(result and result.flip)
        if result and result.comparable:
            table.comparable += 1
        table.flips += flip
        table.rows.append((task, a, b, flip))
    return table


def format_flips(table: FlipsTable) -> str:
    """``<task> <a> <b>[ <- flip]`` per task, then the summary line."""
    lines = [f"{task} {a} {b}" + (" <- flip" if flip else "") for task, a, b, flip in table.rows]
    summary = (
        f"tasks={len(table.rows)} flips={table.flips} flip_rate={table.flip_rate:.3f} gate={table.gate:.2f}"
    )
    if table.errors:  # only when there are any: a file without error rows gets the plain totals line
        summary += f" errors={table.errors}"
    if table.rows and not table.comparable:
        summary += " (no task comparable: nothing measured, the gate is not passed)"
    lines.append(summary)
    return "\n".join(lines)
