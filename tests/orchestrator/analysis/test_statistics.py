"""The statistics of a verdict: Fisher's exact test and the Wilson interval against scipy, the
attempts an underpowered difference needs, and simulations of the flip rule over many seeded runs.

scipy is a dev dependency only: crosshost computes everything with the standard library, and these
tests hold its numbers against scipy's on many tables.
"""

from __future__ import annotations

import random

import pytest
from scipy.stats import binomtest
from scipy.stats import fisher_exact as scipy_fisher

from orchestrator.analysis.flips import task_flip
from orchestrator.analysis.stats import (
    fisher_exact,
    min_p_value,
    needed_repeat,
    pass_counts,
    wilson_interval,
)
from orchestrator.analysis.verdict import classify_task

ALPHA = 0.05
FINGERPRINTS = {"local": "f-local", "box-a": "f-box-a", "box-b": "f-box-b"}


def test_fisher_exact_matches_scipy_on_many_tables() -> None:
    rng = random.Random(12)
    tables = [(a, n1, b, n2) for n1 in range(1, 9) for n2 in range(1, 9) for a in range(n1 + 1) for b in range(n2 + 1)]
    for _ in range(2000):
        n1, n2 = rng.randint(1, 120), rng.randint(1, 120)
        tables.append((rng.randint(0, n1), n1, rng.randint(0, n2), n2))
    for a, n1, b, n2 in tables:
        expected = scipy_fisher([[a, n1 - a], [b, n2 - b]]).pvalue
        assert fisher_exact(a, n1, b, n2) == pytest.approx(expected, rel=1e-9, abs=1e-12), (a, n1, b, n2)


def test_fisher_exact_known_values_and_edges() -> None:
    assert fisher_exact(1, 1, 0, 1) == 1.0  # one attempt per host can never show a difference
    assert fisher_exact(3, 3, 0, 3) == pytest.approx(0.1)
    assert fisher_exact(8, 8, 0, 8) == pytest.approx(2 / 12870)
    assert fisher_exact(0, 0, 3, 5) == 1.0  # a host without a non-error attempt: no evidence
    assert min_p_value(3, 3) == pytest.approx(0.1) and min_p_value(4, 4) < ALPHA
    with pytest.raises(ValueError):
        fisher_exact(4, 3, 0, 3)


def test_wilson_interval_matches_scipy() -> None:
    for n in range(1, 40):
        for k in range(n + 1):
            ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
            low, high = wilson_interval(k, n)
            assert (low, high) == (pytest.approx(ci.low, abs=1e-9), pytest.approx(ci.high, abs=1e-9)), (k, n)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_needed_repeat_is_the_first_count_that_reaches_alpha() -> None:
    # 1/1 against 0/1: n/n against 0/n reaches p < 0.05 first at n = 4 (p = 2/70)
    assert needed_repeat(1.0, 0.0) == 4
    assert fisher_exact(3, 3, 0, 3) >= ALPHA > fisher_exact(4, 4, 0, 4)
    n = needed_repeat(0.375, 0.75, start=8)
    assert n is not None and fisher_exact(round(0.375 * n), n, round(0.75 * n), n) < ALPHA
    assert fisher_exact(round(0.375 * (n - 1)), n - 1, round(0.75 * (n - 1)), n - 1) >= ALPHA
    assert needed_repeat(0.5, 0.5) is None
    assert needed_repeat(0.5, 0.501) is None  # not within the 1000 attempts a suite may ask for


def test_pass_counts_leave_errors_out() -> None:
    counts = pass_counts(["pass", "error", "fail", "pass"])
    assert (counts.n, counts.passes, counts.rate) == (3, 2, 0.6667)


# --- simulations over seeded runs -----------------------------------------------------------------


def _draw(rng: random.Random, rate: float, repeat: int) -> list[str]:
    return ["pass" if rng.random() < rate else "fail" for _ in range(repeat)]


def _simulate(rates: dict[str, float], repeat: int, runs: int, seed: int, *, sampled: bool) -> dict[str, float]:
    """Fractions over ``runs`` seeded tasks: comparisons called different, tasks with a flip, tasks
    classified host_coupling/laptop_contamination, and tasks the attempt-paired rule alone would flip."""
    rng = random.Random(seed)
    compared = differing = flipped = coupled = paired = 0
    for _ in range(runs):
        verdicts = {host: _draw(rng, rate, repeat) for host, rate in rates.items()}
        flip = task_flip(verdicts, "local", alpha=ALPHA, sampled=sampled)
        decision = classify_task(verdicts, "local", FINGERPRINTS, {}, flip, alpha=ALPHA, sampled=sampled)
        compared += len(flip.p_values)
        differing += len(flip.flipped_hosts)
        flipped += flip.flip
        coupled += decision.classification in ("host_coupling", "laptop_contamination")
        ref = verdicts["local"]
        paired += any(v != ref[i] for h, seq in verdicts.items() if h != "local" for i, v in enumerate(seq))
    return {
        "per_comparison": differing / compared,
        "per_task": flipped / runs,
        "host_classified": coupled / runs,
        "attempt_paired": paired / runs,
    }


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.5, 0.7, 0.9])
def test_no_host_effect_is_called_a_host_difference_at_most_alpha_of_the_time(rate: float) -> None:
    # local + two hosts, every host passing at the same rate, 8 attempts each, 4,000 seeded tasks
    result = _simulate({"local": rate, "box-a": rate, "box-b": rate}, 8, 4000, seed=int(rate * 100), sampled=True)
    assert result["per_comparison"] <= ALPHA, result  # measured: 0.0215 at rate 0.5, less elsewhere
    assert result["per_task"] <= ALPHA and result["host_classified"] == result["per_task"], result
    if 0.3 <= rate <= 0.7:  # what the attempt-paired rule made of the same runs
        assert result["attempt_paired"] > 0.9, result


def test_power_for_ninety_against_ten_percent_at_repeat_8() -> None:
    result = _simulate({"local": 0.9, "box-a": 0.1}, 8, 4000, seed=90, sampled=True)
    assert result["per_comparison"] >= 0.9, result  # exact power of Fisher's test here: 0.932


def test_one_attempt_of_a_sampled_agent_is_underpowered_never_a_flip() -> None:
    verdicts = {"local": ["pass"], "box-a": ["fail"], "box-b": ["pass"]}
    flip = task_flip(verdicts, "local", alpha=ALPHA, sampled=True)
    decision = classify_task(verdicts, "local", FINGERPRINTS, {}, flip, alpha=ALPHA, sampled=True)
    assert not flip.flip and flip.comparable and flip.p_values["box-a"] == 1.0
    assert (decision.classification, decision.needed_repeat) == ("underpowered", 4)
    assert decision.action == "rerun with --repeat 4"
    # the same verdicts from an agent that is not sampled keep the deterministic rule
    flip = task_flip(verdicts, "local", alpha=ALPHA, sampled=False)
    assert flip.flip and flip.flipped_hosts == ["box-a"]
    assert classify_task(verdicts, "local", FINGERPRINTS, {}, flip).classification == "host_coupling"


def test_varying_attempts_without_a_significant_difference_are_flaky_whatever_attempt_i_did() -> None:
    verdicts = {"local": ["pass", "fail", "pass", "fail"], "box-a": ["fail", "pass", "fail", "pass"]}
    flip = task_flip(verdicts, "local")
    assert (flip.evidence, flip.flip) == ("statistical", False)
    assert classify_task(verdicts, "local", FINGERPRINTS, {}, flip).classification == "flaky"


def test_a_significant_difference_with_varying_attempts_is_host_coupling() -> None:
    verdicts = {"local": ["pass"] * 7 + ["fail"], "box-a": ["fail"] * 8, "box-b": ["pass"] * 8}
    flip = task_flip(verdicts, "local")
    decision = classify_task(verdicts, "local", FINGERPRINTS, {}, flip)
    assert flip.flipped_hosts == ["box-a"] and flip.p_values["box-a"] < 0.01
    assert decision.classification == "host_coupling"
    verdicts = {"local": ["fail"] * 8, "box-a": ["pass"] * 7 + ["fail"], "box-b": ["fail"] * 8}
    flip = task_flip(verdicts, "local")
    assert classify_task(verdicts, "local", FINGERPRINTS, {}, flip).classification == "laptop_contamination"


def test_sampled_agent_underpowered_only_where_the_counts_cannot_reach_alpha() -> None:
    # three attempts a host: even 3/3 against 0/3 is p = 0.1, so no count could show a difference
    verdicts = {"local": ["pass"] * 3, "box-a": ["fail"] * 3}
    flip = task_flip(verdicts, "local", sampled=True)
    decision = classify_task(verdicts, "local", FINGERPRINTS, {}, flip, sampled=True)
    assert (decision.classification, decision.needed_repeat) == ("underpowered", 4)
    # eight attempts a host could show one (8/8 against 0/8 is p < 0.001); 5/8 against 4/8 does not
    verdicts = {"local": ["pass"] * 5 + ["fail"] * 3, "box-a": ["pass"] * 4 + ["fail"] * 4}
    flip = task_flip(verdicts, "local", sampled=True)
    decision = classify_task(verdicts, "local", FINGERPRINTS, {}, flip, sampled=True)
    assert (decision.classification, decision.needed_repeat, flip.flip) == ("sampled_noise", None, False)
