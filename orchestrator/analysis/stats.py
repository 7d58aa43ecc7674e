"""Pass counts, pass rates, the Wilson interval and Fisher's exact test: the statistics of a verdict.

Standard library only, exact integer arithmetic where it decides something: the two-sided p-value of
Fisher's exact test sums the hypergeometric probabilities of every table at most as likely as the one
observed, compared as integers, so ties are ties and the p-value is a ratio of two exact integers.
Why Fisher's test and not Boschloo's or Barnard's, and what the false-difference rate measures, is in
docs/statistics.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from math import comb, sqrt

from agent_runner.suite import CORRECTIONS, Gate

DEFAULT_ALPHA = Gate.alpha  # the suite's [gate] default
#: the largest --repeat a suite accepts; a difference needing more attempts than this is noise
MAX_REPEAT = 1000
Z95 = 1.959963984540054  # the 97.5% point of the standard normal: a two-sided 95% interval


@dataclass(frozen=True)
class Counts:
    """The non-error attempts of one host on one task and how many of them passed."""

    n: int
    passes: int

    @property
    def rate(self) -> float | None:
        return pass_rate(self.passes, self.n)


def pass_counts(verdicts: Iterable[str]) -> Counts:
    """``error`` verdicts are the host's, not the agent's: they count neither way."""
    n = passes = 0
    for verdict in verdicts:
        if verdict == "error":
            continue
        n += 1
        passes += verdict == "pass"
    return Counts(n, passes)


def pass_rate(passes: int, n: int) -> float | None:
    """The one pass rate of crosshost: passes over non-error attempts, 4 decimals; None without any."""
    return round(passes / n, 4) if n else None


def wilson_interval(passes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% by default); (0, 1) without attempts.

    Unlike the normal approximation it stays inside [0, 1] and is not zero-width at 0/n or n/n, which
    is where a deterministic agent always is.
    """
    if n <= 0:
        return 0.0, 1.0
    p = passes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@lru_cache(maxsize=4096)
def fisher_exact(a_passes: int, a_n: int, b_passes: int, b_n: int) -> float:
    """Two-sided p-value of Fisher's exact test on the 2x2 table (passes, fails) x (host a, host b).

    Conditional on the margins, the passes of host a are hypergeometric; the p-value is the total
    probability of every table no more likely than the observed one (the convention of R's
    ``fisher.test`` and ``scipy.stats.fisher_exact``). 1.0 when either host has no attempt.
    """
    if not (0 <= a_passes <= a_n and 0 <= b_passes <= b_n):
        raise ValueError(f"passes must lie within 0..n, got {a_passes}/{a_n} and {b_passes}/{b_n}")
    if a_n == 0 or b_n == 0:
        return 1.0
    total_passes = a_passes + b_passes
    low, high = max(0, total_passes - b_n), min(a_n, total_passes)
    # numerators of P(X = x) over the common denominator C(a_n + b_n, total_passes)
    weights = [comb(a_n, x) * comb(b_n, total_passes - x) for x in range(low, high + 1)]
    observed = weights[a_passes - low]
    at_most = sum(w for w in weights if w <= observed)
    return min(1.0, at_most / comb(a_n + b_n, total_passes))


def min_p_value(a_n: int, b_n: int) -> float:
    """The smallest p-value these attempt counts can give (all passes on one host, none on the other)."""
    if a_n == 0 or b_n == 0:
        return 1.0
    return min(fisher_exact(a_n, a_n, 0, b_n), fisher_exact(0, a_n, b_n, b_n))


def needed_repeat(
    rate_a: float, rate_b: float, alpha: float = DEFAULT_ALPHA, start: int = 1, limit: int = MAX_REPEAT
) -> int | None:
    """Attempts per host at which two hosts passing at exactly these rates would differ at ``alpha``.

    The smallest n (from ``start``) whose table ``round(rate_a*n)/n`` vs ``round(rate_b*n)/n`` gives
    p < alpha; None when even ``limit`` attempts would not (the rates are equal or nearly so). It is
    the least that could settle the question: at that n a real difference of this size is found about
    half the time, so treat it as a floor.
    """
    if rate_a == rate_b:
        return None

    def significant(n: int) -> bool:
        return fisher_exact(round(rate_a * n), n, round(rate_b * n), n) < alpha

    if not significant(limit):
        return None
    # doubling, then bisection: rounding makes p(n) only nearly monotone, so the bisection lands on
    # an n that is significant, not necessarily the very first one
    lo, hi = max(1, start), max(1, start)
    while not significant(hi):
        lo, hi = hi, min(limit, hi * 2)
    if lo == hi:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if significant(mid):
            hi = mid
        else:
            lo = mid
    return hi


# --- many tasks, one alpha --------------------------------------------------------------------------

#: Benjamini–Hochberg ("bh": the expected share of false host differences among those declared is at
#: most alpha) and Holm ("holm": the probability of any false host difference in the run is at most alpha)
BH, HOLM = CORRECTIONS
DEFAULT_CORRECTION = Gate.correction


def margin_min_p(a_n: int, b_n: int, total_passes: int) -> float:
    """The smallest p-value Fisher's test can give with these margins: the observed number of passes
    over both hosts spread every way the attempt counts allow. 1.0 when every attempt passed, or none
    did (nothing can differ), so such a comparison can never be declared at any level."""
    low, high = max(0, total_passes - b_n), min(a_n, total_passes)
    if a_n == 0 or b_n == 0 or low > high:
        return 1.0
    return min(fisher_exact(x, a_n, total_passes - x, b_n) for x in range(low, high + 1))


def adjust_p_values(p_values: list[float], method: str) -> list[float]:
    """Holm's step-down or Benjamini–Hochberg's step-up adjusted p-values, in the order given: a
    comparison is declared at level alpha when its adjusted p-value is below alpha."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    if method == HOLM:
        running = 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (m - rank) * p_values[i]))
            adjusted[i] = running
    elif method == BH:
        running = 1.0
        for rank in range(m - 1, -1, -1):
            i = order[rank]
            running = min(running, m * p_values[i] / (rank + 1))
            adjusted[i] = min(1.0, running)
    else:
        raise ValueError(f"unknown correction {method!r}: one of {', '.join(CORRECTIONS)}")
    return adjusted


def first_decisive_repeat(alpha: float = DEFAULT_ALPHA, limit: int = MAX_REPEAT) -> int | None:
    """The fewest attempts per host at which two hosts could differ at ``alpha`` at all (4 at 0.05)."""
    return next((n for n in range(1, limit + 1) if min_p_value(n, n) < alpha), None)
