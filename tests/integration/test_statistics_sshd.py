"""Verdicts for a sampled agent on real sshd hosts (plus local): within-host noise is not a host
difference, and a real host difference is found with its p-value.

The agent is the example coin (examples/suites/coin): a command agent (``sampled = true``) that
passes each attempt with a probability (0.9 on a host whose private /opt holds a flag file, else the
suite's rate). Each draw is seeded from a salt, the host, the task and the attempt, so a run is
reproducible while every host draws its own outcomes; the salts are arbitrary fixed values.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.sshd

REPO = Path(__file__).resolve().parents[2]
COIN = REPO / "examples" / "suites" / "coin"
FLAG_DIR = "crosshost-coin"  # /opt/crosshost-coin/high on a host makes the coin pass 90% there


def _coin_suite(root: Path, tasks: list[str], *, rate: float, salt: str) -> Path:
    """The example coin suite with only ``tasks``, its draws seeded by ``salt``."""
    suite = root / "coin"
    shutil.copytree(COIN, suite)
    for task in (suite / "tasks").iterdir():
        if task.name not in tasks:
            shutil.rmtree(task)
    _set_params(suite, rate=rate, salt=salt)
    return suite


def _set_params(suite: Path, *, rate: float, salt: str) -> None:
    (suite / "agent" / "params.json").write_text(json.dumps({"rate": rate, "salt": salt}))


def _replay(suite: Path, inventory: Path, out: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    """``crosshost replay`` as a user runs it; (exit code, report.json of the new run, output)."""
    before = {p.name for p in out.iterdir()} if out.is_dir() else set()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "replay", str(suite), "-i", str(inventory), "--out", str(out), *extra],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    [run] = [p for p in out.iterdir() if p.is_dir() and p.name not in before and (p / "manifest.json").is_file()]
    return done.returncode, json.loads((run / "report.json").read_text()), done.stdout + done.stderr


def _paired_differences(task: dict[str, Any], reference: str) -> int:
    """How many same-attempt verdict pairs differ from the reference's: what the attempt-paired rule flipped on."""
    ref = task["verdicts"][reference]
    return sum(v != ref[i] for h, seq in task["verdicts"].items() if h != reference for i, v in enumerate(seq))


def test_a_fair_coin_everywhere_is_no_host_difference_and_compare_last_holds(sshd_hosts: Any, tmp_path: Path) -> None:
    suite = _coin_suite(tmp_path, ["coin-a", "coin-b", "coin-c"], rate=0.5, salt="first")
    out = tmp_path / "runs"
    for salt in ("first", "second"):
        _set_params(suite, rate=0.5, salt=salt)
        code, report, said = _replay(suite, sshd_hosts.inventory_path, out, "--repeat", "8", "--compare-last")
        assert code == 0, said
        assert report["valid"] and report["within_gate"] and report["alpha"] == 0.05, said
        assert [h["name"] for h in report["hosts"]] == ["local", "box-a", "box-b"]
        for task in report["tasks"]:
            assert task["sampled"] and task["evidence"] == "statistical"
            assert task["classification"] not in ("host_coupling", "laptop_contamination"), task
            assert not task["flip"] and task["flipped_hosts"] == []
            assert {r["host"]: r["n"] for r in task["rates"]} == {"local": 8, "box-a": 8, "box-b": 8}
            others = [r for r in task["rates"] if r["host"] != "local"]
            assert all(r["p_value"] >= 0.05 and r["ci_low"] <= r["pass_rate"] <= r["ci_high"] for r in others), task
        # the same runs under the attempt-paired rule: attempt i differs between hosts again and again
        assert all(_paired_differences(t, "local") >= 4 for t in report["tasks"])
        assert "newly flipping" not in said


def test_ninety_percent_on_one_host_and_ten_on_the_other_is_host_coupling(sshd_hosts: Any, tmp_path: Path) -> None:
    flag = sshd_hosts.fleet.state / "hosts" / "box-a" / "opt" / FLAG_DIR
    flag.mkdir(parents=True)
    (flag / "high").touch()  # inside box-a only: its /opt is its own
    try:
        # At --repeat 8 a 90% / 10% difference reaches p < 0.01 in 64% of runs and p < 0.05 in 93%
        # (exact, docs/statistics.md); this salt's draws (6/8 against 0/8) are one run that does.
        suite = _coin_suite(tmp_path, ["coin-a"], rate=0.1, salt="90-10")
        code, report, said = _replay(
            suite, sshd_hosts.inventory_path, tmp_path / "runs", "--repeat", "8", "--hosts", "box-a,box-b"
        )
    finally:
        shutil.rmtree(flag)
    assert code == 1, said  # a flip rate of 1/1 is over the gate
    assert report["valid"] and report["reference"] == "box-a"
    [task] = report["tasks"]
    assert (task["classification"], task["action"]) == ("host_coupling", "quarantine the agent")
    assert task["flip"] and task["flipped_hosts"] == ["box-b"]
    rates = {r["host"]: r for r in task["rates"]}
    assert rates["box-a"]["passes"] >= 6 and rates["box-b"]["passes"] <= 2, rates
    assert rates["box-b"]["p_value"] < 0.01 and rates["box-b"]["differs"]
    assert rates["box-a"]["p_value"] is None
    assert "p=" in said  # the terminal shows the p-value beside the rate


def _compare(a: Path, b: Path) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "compare", str(a), str(b), "--format", "json"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout) if done.returncode in (0, 1) else {}, done.stderr


def _runs(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if (p / "manifest.json").is_file())


def test_compare_a_strong_and_a_weak_agent_over_a_quiet_and_a_loud_box(sshd_hosts: Any, tmp_path: Path) -> None:
    tasks = ["coin-a", "coin-b", "coin-c"]
    suite = _coin_suite(tmp_path, tasks, rate=0.9, salt="strong")
    quiet, loud = tmp_path / "quiet", tmp_path / "loud"
    for rate, salt in ((0.9, "strong"), (0.1, "weak")):  # the agent's files (params.json) are its pin
        _set_params(suite, rate=rate, salt=salt)
        _replay(suite, sshd_hosts.inventory_path, quiet, "--repeat", "8")
    code, result, said = _compare(*_runs(quiet))
    assert code == 0, said
    assert result["reading"] == "box quiet; the model comparison stands"
    assert (result["model_gap"], result["box_flips"]) == (3, 0)
    assert set(result["agent_pins"]) == set(tasks)

    flag = sshd_hosts.fleet.state / "hosts" / "box-a" / "opt" / FLAG_DIR
    flag.mkdir(parents=True)
    (flag / "high").touch()  # box-a passes 90% whatever the agent: the weak agent looks strong there
    try:
        for rate, salt in ((0.9, "strong"), (0.1, "weak")):
            _set_params(suite, rate=rate, salt=salt)
            _replay(suite, sshd_hosts.inventory_path, loud, "--repeat", "8")
    finally:
        shutil.rmtree(flag)
    code, result, said = _compare(*_runs(loud))
    assert code == 1, said
    assert result["reading"] == "an environment comparison wearing a model's name; fix the environment before publishing"
    assert result["box_flips"] >= result["model_gap"] > 0, result
    assert all(t["box_b"] == ["box-a"] for t in result["tasks"] if t["box_b"]), result

    # a run of another suite cannot be compared: exit 2, one line naming what differs
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "compare", str(_runs(quiet)[0]), str(tmp_path / "nope")],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 2 and "not a run directory" in done.stderr
