"""``replay --until-decided``: attempts only where they can still decide something.

The rounds are planned before the first one: the first round runs ``start`` attempts per host (at
least ``QUIET_AFTER``), every later round doubles a task's attempts, up to ``max_repeat``. Each look
at the evidence tests at ``alpha / looks`` (Bonferroni over the planned looks), so the chance of a
false host difference over all the looks together stays at or below alpha (docs/statistics.md). A
task stays open while a further round can still change its answer: it has not been declared
different, and either its attempts could not settle it yet (``verdict.undecided_repeat``) or the
difference it shows would reach the level within the budget. A task that shows one verdict
everywhere, that is declared different, or whose difference could not become significant within the
budget (futility) is closed; closing for futility never raises the error rate.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.analysis.flips import STATISTICAL, TaskFlip
from orchestrator.analysis.stats import MAX_REPEAT, needed_repeat
from orchestrator.analysis.verdict import QUIET_AFTER, undecided_repeat


def plan_looks(start: int, max_repeat: int) -> list[int]:
    """The attempts per host a task has after each round: ``start`` (at least ``QUIET_AFTER``), then
    doubling, the last capped at ``max_repeat``."""
    if max_repeat < 1 or max_repeat > MAX_REPEAT:
        raise ValueError(f"max_repeat must be 1..{MAX_REPEAT}, got {max_repeat}")
    first = min(max(start, QUIET_AFTER), max_repeat)
    looks = [first]
    while looks[-1] < max_repeat:
        looks.append(min(looks[-1] * 2, max_repeat))
    return looks


def look_level(alpha: float, looks: int) -> float:
    """The level each look tests at: the looks' error rates add up to at most alpha."""
    return alpha / max(1, looks)


def still_open(flip: TaskFlip, reference: str, others: Sequence[str], level: float, max_repeat: int) -> bool:
    """Whether another round of this task can still decide something (see the module doc)."""
    if flip.evidence != STATISTICAL or flip.flip or not others:
        return False
    ref = flip.counts[reference]
    if max(ref.n, *(flip.counts[h].n for h in others)) >= max_repeat:
        return False
    if undecided_repeat(flip, reference, others, level) is not None:
        return True
    for host in others:
        rate = flip.counts[host].rate
        if ref.rate is None or rate is None or rate == ref.rate:
            continue
        needed = needed_repeat(ref.rate, rate, level, start=max(ref.n, flip.counts[host].n))
        if needed is not None and needed <= max_repeat:
            return True
    return False
