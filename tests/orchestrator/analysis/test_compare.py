"""``crosshost compare``: the model gap on the reference host beside each run's host differences."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.analysis.compare import LOUD, QUIET, SAME_ORDER, compare_runs
from orchestrator.cli import app
from orchestrator.errors import InputError
from tests.support.rundirs import PINS, Attempt, RunSpec, build_run, two_hosts

TASKS = ("t1", "t2", "t3", "t4")


def _run(root: Path, run_id: str, agent: str, rates: dict[str, dict[str, int]], **pin_changes: str) -> Path:
    """A sampled run: per task, host -> passes out of 8; every other pin as PINS."""
    pins = {**PINS, "agent_sha": agent, **pin_changes}
    attempts = {}
    for task, by_host in rates.items():
        for host, passes in by_host.items():
            for i in range(8):
                attempts[(host, task, i)] = Attempt("pass" if i < passes else "fail", pins=pins)
    extra = {"sampled": list(rates), "pins": {task: pins for task in rates}}
    return build_run(root, RunSpec(hosts=two_hosts(), attempts=attempts, manifest_extra=extra), run_id=run_id)


def _strong_weak(tmp_path: Path, box_b_weak: dict[str, int]) -> tuple[Path, Path]:
    strong = _run(tmp_path, "20250101T000000Z-aaaaaa", "strong", {t: {"local": 8, "box-b": 8} for t in TASKS})
    weak = _run(
        tmp_path, "20250102T000000Z-bbbbbb", "weak", {t: {"local": 1, "box-b": box_b_weak.get(t, 1)} for t in TASKS}
    )
    return strong, weak


def test_a_quiet_box_lets_the_model_gap_stand(tmp_path: Path) -> None:
    c = compare_runs(*_strong_weak(tmp_path, {}))
    assert (c.model_gap, c.box_flips, c.reading, c.exit_code) == (4, 0, QUIET, 0)
    t1 = c.tasks[0]
    assert (t1.a.passes, t1.b.passes, t1.gap, t1.evidence) == (8, 1, True, "statistical")
    assert t1.p_value < 0.01 and set(c.agent_pins) == set(TASKS)


def test_a_loud_box_is_an_environment_comparison(tmp_path: Path) -> None:
    # in the weak run box-b passes 8/8 where local passes 1/8, on every task: the box moves them all
    c = compare_runs(*_strong_weak(tmp_path, {t: 8 for t in TASKS}))
    assert (c.model_gap, c.box_flips, c.reading, c.exit_code) == (4, 4, LOUD, 1)
    assert c.tasks[0].box_b == ["box-b"] and c.tasks[0].box_a == []


def test_box_noise_of_the_order_of_the_gap(tmp_path: Path) -> None:
    c = compare_runs(*_strong_weak(tmp_path, {"t1": 8}))
    assert (c.model_gap, c.box_flips, c.reading, c.exit_code) == (4, 1, SAME_ORDER, 0)


def test_runs_whose_pins_differ_beyond_the_agent_are_refused_naming_the_pins(tmp_path: Path) -> None:
    a = _run(tmp_path, "20250101T000000Z-aaaaaa", "strong", {"t1": {"local": 8, "box-b": 8}})
    b = _run(tmp_path, "20250102T000000Z-bbbbbb", "weak", {"t1": {"local": 1, "box-b": 1}}, prompt_sha="x" * 12)
    with pytest.raises(InputError, match=r"pins differ beyond the agent: t1\.prompt_sha"):
        compare_runs(a, b)
    done = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert done.exit_code == 2
    assert len(done.output.strip().splitlines()) == 1 and "t1.prompt_sha" in done.output


def test_cli_markdown_and_json(tmp_path: Path) -> None:
    a, b = _strong_weak(tmp_path, {})
    done = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert done.exit_code == 0, done.output
    assert f"- reading: **{QUIET}**" in done.output
    assert "| t1 | 8/8 100% [68-100] | 1/8 12% [2-47] | 0.001 | **yes** |  |  |" in done.output
    done = CliRunner().invoke(app, ["compare", str(a), str(b), "--format", "json"])
    data = json.loads(done.output)
    assert (data["model_gap"], data["box_flips"], data["reading"]) == (4, 0, QUIET)
    assert data["tasks"][0]["a"] == {"n": 8, "passes": 8, "pass_rate": 1.0, "ci_low": 0.6756, "ci_high": 1.0}
