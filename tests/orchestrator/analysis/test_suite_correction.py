"""Many tasks, one alpha: Holm and Benjamini–Hochberg over a suite's host comparisons, the tasks a
run could not settle, the sequential rule of --until-decided, and a light seeded simulation (the
heavy one is ``make bench``: bench/stats_bench.py)."""

from __future__ import annotations

import random

import pytest
from scipy.stats import false_discovery_control

from bench.stats_bench import (
    DIFFERS,
    fixed_run,
    mostly_decided_suite,
    quiet_suite,
    sequential_run,
    with_effects,
)
from orchestrator.analysis.flips import correct_flips, task_flip
from orchestrator.analysis.run import analyse_run
from orchestrator.analysis.sequential import look_level, plan_looks, still_open
from orchestrator.analysis.stats import BH, HOLM, adjust_p_values, fisher_exact, margin_min_p
from orchestrator.analysis.verdict import classify_task, undecided_repeat
from tests.support.rundirs import Attempt, RunSpec, build_run, two_hosts

FPS: dict[str, str | None] = {"local": "f-local", "box-b": "f-box-b"}


def test_benjamini_hochberg_matches_scipy_and_holm_matches_its_definition() -> None:
    rng = random.Random(4)
    for _ in range(200):
        ps = [rng.random() ** 3 for _ in range(rng.randint(1, 40))]
        assert adjust_p_values(ps, BH) == pytest.approx(list(false_discovery_control(ps, method="bh")))
    # Holm: the i-th smallest times (m - i + 1), kept monotone, capped at 1
    assert adjust_p_values([0.01, 0.04, 0.03, 0.5], HOLM) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    with pytest.raises(ValueError):
        adjust_p_values([0.1], "bonferroni")


def test_margin_min_p_is_one_where_nothing_can_differ() -> None:
    assert margin_min_p(8, 8, 16) == 1.0 and margin_min_p(8, 8, 0) == 1.0  # all pass or all fail
    assert margin_min_p(8, 8, 8) == pytest.approx(fisher_exact(8, 8, 0, 8))
    assert margin_min_p(8, 8, 1) == 1.0  # one pass in sixteen attempts cannot differ at all


def _flip(local: str, box_b: str):  # "PPPF" strings
    verdicts = {"local": ["pass" if c == "P" else "fail" for c in local], "box-b": ["pass" if c == "P" else "fail" for c in box_b]}
    return verdicts, task_flip(verdicts, "local", sampled=True)


def test_a_difference_significant_alone_is_not_one_among_many_quiet_comparisons() -> None:
    # 7/8 against 1/8 is p = 0.01: a flip on its own, not once 20 other varying tasks share alpha
    flips = {"t": _flip("PPPPPPPF", "FFFFFFFP")[1]}
    assert correct_flips(flips, {"t": ["box-b"]}, "local", correction=HOLM) == 1 and flips["t"].flip
    for i in range(20):
        flips[f"q{i}"] = _flip("PPPPFFFF", "PPPFFFFF")[1]
    for method in (HOLM, BH):
        assert correct_flips(flips, {t: ["box-b"] for t in flips}, "local", correction=method) == 21
        assert not flips["t"].flip and flips["t"].p_adjusted["box-b"] > flips["t"].p_values["box-b"]
    # all-pass tasks cannot differ: they are left out of the family and do not dilute it
    flips = {"t": _flip("PPPPPPPF", "FFFFFFFP")[1]}
    flips.update({f"c{i}": _flip("PPPPPPPP", "PPPPPPPP")[1] for i in range(200)})
    assert correct_flips(flips, {t: ["box-b"] for t in flips}, "local", correction=HOLM) == 1
    assert flips["t"].flip and flips["c0"].p_adjusted["box-b"] == 1.0


def test_undecided_names_the_repeat_that_settles_it() -> None:
    for local, box_b, expected in (
        ("P", "F", 4),  # a difference no count of one attempt could show
        ("P", "P", 2),  # one verdict everywhere, on one attempt: settled at two
        ("PP", "PP", None),  # one verdict everywhere on two attempts a host: settled
        ("PPP", "FFF", 4),
        ("PPPPPFFF", "PPPPFFFF", None),  # eight attempts could have shown a difference; they did not
    ):
        verdicts, flip = _flip(local, box_b)
        assert undecided_repeat(flip, "local", ["box-b"], 0.05) == expected, (local, box_b)
        decision = classify_task(verdicts, "local", FPS, {}, flip, sampled=True)
        assert (decision.classification == "underpowered") == (expected is not None)
    verdicts, flip = _flip("PPPPPFFF", "PPPPFFFF")
    assert classify_task(verdicts, "local", FPS, {}, flip, sampled=True).classification == "sampled_noise"
    assert classify_task(verdicts, "local", FPS, {}, flip, sampled=False).classification == "flaky"


def _run(tmp_path, tasks: dict[str, tuple[str, str]], **manifest):
    attempts = {}
    for task, (local, box_b) in tasks.items():
        attempts.update({("local", task, i): Attempt("pass" if c == "P" else "fail") for i, c in enumerate(local)})
        attempts.update({("box-b", task, i): Attempt("pass" if c == "P" else "fail") for i, c in enumerate(box_b)})
    extra = {"sampled": list(tasks), **manifest}
    return analyse_run(build_run(tmp_path, RunSpec(hosts=two_hosts(), attempts=attempts, manifest_extra=extra)))


def test_a_run_of_undecided_tasks_is_inconclusive_not_a_green_light(tmp_path) -> None:
    report = _run(tmp_path / "a", {"t1": ("P", "F"), "t2": ("P", "P"), "t3": ("F", "F")})
    assert report.valid and report.within_gate and report.flip_rate == 0.0
    assert (report.undecided, report.inconclusive, report.settle_repeat) == (3, True, 4)
    # the same tasks at eight attempts: decided
    report = _run(tmp_path / "b", {"t1": ("PPPPPFFF", "PPPFFFFF"), "t2": ("PPPPPPPP", "PPPPPPPP")})
    assert (report.undecided, report.inconclusive, report.settle_repeat) == (0, False, None)
    assert report.correction == BH and report.family == 1


def test_the_sequential_plan_and_its_level() -> None:
    assert plan_looks(1, 32) == [2, 4, 8, 16, 32]
    assert plan_looks(8, 20) == [8, 16, 20]
    assert look_level(0.05, 5) == pytest.approx(0.01)
    with pytest.raises(ValueError):
        plan_looks(2, 0)


def test_still_open_only_where_another_round_can_decide() -> None:
    level = 0.01
    _, flip = _flip("PP", "PP")
    assert not still_open(flip, "local", ["box-b"], level, 32)  # one verdict everywhere
    _, flip = _flip("PP", "FF")
    assert still_open(flip, "local", ["box-b"], level, 32)  # 2/2 against 0/2 cannot show it yet
    assert not still_open(flip, "local", ["box-b"], level, 2)  # the budget is spent
    _, flip = _flip("PPPPFFFF", "PPPPFFFF")
    assert not still_open(flip, "local", ["box-b"], level, 32)  # equal rates: no round can help
    _, flip = _flip("PPPPPPFF", "PPFFFFFF")
    assert still_open(flip, "local", ["box-b"], level, 32)  # 75% against 25% is found by 32 attempts


def test_light_simulation_error_rates_and_attempts() -> None:
    """The heavy version of each number is in make bench; these are seeded and small."""
    rng = random.Random(7)
    false_runs = 0
    for _ in range(8):
        outcome = fixed_run(rng, quiet_suite(rng), 8, HOLM)
        false_runs += any(c in DIFFERS for c in outcome.classifications)
    assert false_runs <= 1  # alpha 0.05: more than one of eight would be far outside it
    outcome = fixed_run(rng, with_effects(quiet_suite(rng, 40)), 16, BH)
    assert sum(c == "host_coupling" for c in outcome.classifications[:5]) >= 4
    suite = mostly_decided_suite(rng, 100)
    seq = sequential_run(rng, suite, 2, 32, BH)
    fixed = fixed_run(rng, suite, 16, BH)
    assert fixed.attempts >= 3 * seq.attempts
    assert sum(c == "host_coupling" for c in seq.classifications[:5]) >= 4


def test_report_of_an_undecided_run_exits_inconclusive_and_says_what_settles_it(tmp_path) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli import app
    from orchestrator.exit_policy import INCONCLUSIVE

    build = {"t1": ("P", "F"), "t2": ("P", "P")}
    report = _run(tmp_path / "a", build)
    run = tmp_path / "a" / report.run_id
    out = CliRunner().invoke(app, ["report", str(run)])
    assert out.exit_code == INCONCLUSIVE == 4, out.output
    assert "inconclusive: 2 of 2 comparable task(s) undecided ([gate] undecided allows 0)" in out.output
    assert "rerun with --repeat 4 or --until-decided" in out.output
    assert "inconclusive: 2 of 2" in (run / "report.md").read_text()
    assert 'id="undecided"' in (run / "report.html").read_text()
    # the suite may allow undecided tasks: then the run passes, and still says so
    report = _run(tmp_path / "b", build, allow_undecided=2)
    out = CliRunner().invoke(app, ["report", str(tmp_path / "b" / report.run_id)])
    assert out.exit_code == 0 and "undecided: 2 task(s), within [gate] undecided = 2" in out.output


def test_adjusted_p_is_shown_beside_the_raw_one(tmp_path) -> None:
    from orchestrator.report import render_markdown

    tasks = {"t": ("PPPPPPPF", "FFFFFFFP")}
    tasks.update({f"q{i}": ("PPPPFFFF", "PPPFFFFF") for i in range(5)})
    report = _run(tmp_path, tasks, correction=HOLM)
    t = next(x for x in report.tasks if x.task == "t")
    rate = next(r for r in t.rates if r.host == "box-b")
    assert rate.p_value == pytest.approx(0.010101, abs=1e-6) and rate.p_adjusted == pytest.approx(6 * 0.010101, abs=1e-5)
    assert not rate.differs and report.correction == HOLM and report.family == 6
    assert "p=0.010 adj=0.061" in render_markdown(report)
