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


def test_runs_with_equal_agent_pins_are_refused_as_an_environment_comparison(tmp_path: Path) -> None:
    a = _run(tmp_path, "20250101T000000Z-aaaaaa", "same", {t: {"local": 8, "box-b": 8} for t in TASKS})
    b = _run(tmp_path, "20250102T000000Z-bbbbbb", "same", {t: {"local": 1, "box-b": 8} for t in TASKS})
    with pytest.raises(InputError, match="agent pins .agent_sha. are equal on every task"):
        compare_runs(a, b)
    done = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert done.exit_code == 2 and "only the environment changed" in done.output


def _gap_runs(tmp_path: Path, a_passes: list[int], b_passes: list[int], tags: dict[str, list[str]] | None = None):
    tasks = [f"t{i}" for i in range(len(a_passes))]
    runs = []
    for run_id, agent, passes in (("20250101T000000Z-aaaaaa", "a", a_passes), ("20250102T000000Z-bbbbbb", "b", b_passes)):
        run = _run(tmp_path, run_id, agent, {t: {"local": p, "box-b": p} for t, p in zip(tasks, passes, strict=True)})
        if tags is not None:
            manifest = json.loads((run / "manifest.json").read_text())
            manifest["task_tags"] = tags
            (run / "manifest.json").write_text(json.dumps(manifest))
        runs.append(run)
    return compare_runs(*runs)


def test_the_mean_gap_has_a_paired_interval_and_says_what_resolves_it(tmp_path: Path) -> None:
    # B is better by about 2 of 8 attempts on every task: paired, the interval excludes 0
    c = _gap_runs(tmp_path / "clear", [2, 4, 6, 1, 3, 5], [4, 6, 8, 3, 5, 7])
    assert c.gap_mean == 0.25 and c.gap_ci_low is not None and c.gap_ci_low > 0 and c.resolve == ""
    assert c.clusters == 6 and not c.clustered_by_tag
    # a small mixed gap: undecided, with the tasks (and attempts) that would resolve it
    c = _gap_runs(tmp_path / "mixed", [4, 4, 4, 4], [5, 3, 6, 4])
    assert c.gap_ci_low is not None and c.gap_ci_high is not None and c.gap_ci_low < 0 < c.gap_ci_high
    assert c.resolve.startswith("about ") and "task(s) at this spread would resolve the gap of +0.062" in c.resolve
    done = CliRunner().invoke(app, ["compare", str(tmp_path / "mixed" / "20250101T000000Z-aaaaaa"), str(tmp_path / "mixed" / "20250102T000000Z-bbbbbb")])
    assert "mean gap B − A on the reference: +0.062 \\[95% CI -0.096, +0.221\\]" in done.output
    assert "undecided: about 27 task(s) at this spread would resolve the gap of +0.062, or --repeat 119" in done.output


def test_tasks_of_one_tag_are_one_cluster(tmp_path: Path) -> None:
    tags = {"t0": ["db"], "t1": ["db"], "t2": ["db"], "t3": ["net"], "t4": ["net"], "t5": ["net"]}
    clustered = _gap_runs(tmp_path / "tags", [2, 2, 2, 4, 4, 4], [6, 6, 6, 4, 4, 4], tags)
    plain = _gap_runs(tmp_path / "plain", [2, 2, 2, 4, 4, 4], [6, 6, 6, 4, 4, 4])
    assert clustered.clustered_by_tag and clustered.clusters == 2 and plain.clusters == 6
    assert clustered.gap_mean == plain.gap_mean == 0.25
    # two tags that disagree are two pieces of evidence, not six: the interval is wider
    assert clustered.gap_ci_low is not None and plain.gap_ci_low is not None
    assert clustered.gap_ci_low < plain.gap_ci_low
