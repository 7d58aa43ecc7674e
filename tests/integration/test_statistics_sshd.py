"""Verdicts for a sampled agent on real sshd hosts (plus local): within-host noise is not a host
difference, and a real host difference is found with its p-value.

The agent is a coin: a command agent (``sampled = true``) that passes each attempt with a probability
(0.9 on a host whose private /opt holds a flag file, else the suite's rate). Each draw is seeded from
a salt, the host, the task and the attempt, so a run is reproducible while every host draws its own
outcomes; the salts are arbitrary fixed values.
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
TRIAGE = REPO / "examples" / "suites" / "triage"
FLAG_DIR = "crosshost-stats-test"  # under a test host's private /opt

COIN = f'''import json, os, random, socket, sys
sys.stdin.readline()  # the task message
here = os.path.dirname(os.path.abspath(__file__))
params = json.load(open(os.path.join(here, "params.json")))
# the runner makes <task>.<attempt>.<random>/work the agent's working directory
task, attempt = os.path.basename(os.path.dirname(os.getcwd())).split(".")[:2]
host = socket.gethostname()
host = host if host.startswith("box-") else "local"  # the controller's name differs between machines
rate = 0.9 if os.path.exists("/opt/{FLAG_DIR}/high") else params["rate"]
draw = random.Random("%s:%s:%s:%s" % (params["salt"], host, task, attempt)).random()
with open("verdict", "w") as out:
    out.write("pass" if draw < rate else "fail")
sys.stdout.write(json.dumps({{"type": "final", "content": "drew", "finish": "stop"}}) + "\\n")
'''


def _coin_suite(root: Path, tasks: list[str], *, rate: float, salt: str) -> Path:
    suite = root / "coin"
    (suite / "agent").mkdir(parents=True)
    shutil.copy(TRIAGE / "contract.json", suite / "contract.json")
    shutil.copy(TRIAGE / "tools.json", suite / "tools.json")
    (suite / "agent" / "coin.py").write_text(COIN)
    (suite / "suite.toml").write_text(
        'name = "coin"\nrepeat = 8\ncontract = "contract.json"\ntools = "tools.json"\n'
        '[agent]\nkind = "command"\ncommand = ["python3", "{suite}/agent/coin.py"]\nsampled = true\n'
        "[budget]\nmax_steps = 2\nmax_bytes = 4096\ntimeout_s = 30\n[gate]\nflip_rate = 0.10\nalpha = 0.05\n"
    )
    for task in tasks:
        repo = suite / "tasks" / task / "repo"
        repo.mkdir(parents=True)
        (suite / "tasks" / task / "task.toml").write_text('description = "a coin"\n')
        (suite / "tasks" / task / "prompt.md").write_text("draw\n")
        (repo / "run_tests.sh").write_text('#!/bin/sh\ngrep -q pass verdict\n')
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
    suite = _coin_suite(tmp_path, ["coin-a", "coin-b"], rate=0.5, salt="first")
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
        suite = _coin_suite(tmp_path, ["coin"], rate=0.1, salt="ninety-ten")
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
