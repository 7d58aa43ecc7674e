"""A verdict for a whole suite on real sshd hosts (plus local): no green light from a run that measured
nothing, attempts spent by --until-decided only where they decide something, compare refusing two runs
of one agent, the cause of a time-zone flip named from the offset the predicate printed, and a
negative golden task that replays while a lint error elsewhere stops no replay of other tasks.

The sampled agent is the example coin (examples/suites/coin), its draws seeded by a salt (fixed,
arbitrary values) so each run is reproducible while every host draws its own outcomes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.runner import write_suite

pytestmark = pytest.mark.sshd

REPO = Path(__file__).resolve().parents[2]
COIN = REPO / "examples" / "suites" / "coin"
FLAG_DIR = "crosshost-coin"


def _coin_suite(root: Path, params: dict[str, Any]) -> Path:
    suite = root / "coin"
    shutil.copytree(COIN, suite)
    (suite / "agent" / "params.json").write_text(json.dumps(params))
    return suite


def _crosshost(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )


def _replay(suite: Path, inventory: Path, out: Path, *extra: str) -> tuple[int, Path, str]:
    """``crosshost replay`` as a user runs it: (exit code, the new run directory, what it printed)."""
    before = {p.name for p in out.iterdir()} if out.is_dir() else set()
    done = _crosshost("replay", str(suite), "-i", str(inventory), "--out", str(out), *extra)
    new = (
        [p for p in out.iterdir() if p.is_dir() and p.name not in before and (p / "manifest.json").is_file()]
        if out.is_dir()
        else []
    )
    return done.returncode, new[0] if len(new) == 1 else out, done.stdout + done.stderr


def _report(run: Path) -> dict[str, Any]:
    return json.loads((run / "report.json").read_text())


def test_a_sampled_suite_at_one_attempt_is_inconclusive_and_compare_refuses_one_agent_twice(
    sshd_hosts: Any, tmp_path: Path
) -> None:
    suite = _coin_suite(tmp_path, {"rate": 0.5, "salt": "one-attempt"})
    out = tmp_path / "runs"
    code, run, said = _replay(suite, sshd_hosts.inventory_path, out, "--repeat", "1")
    report = _report(run)
    assert code == 4, said  # not 0: nothing was measured
    assert report["valid"] and report["within_gate"] and report["inconclusive"], said
    assert (report["undecided"], report["comparable"]) == (3, 3)
    assert all(t["classification"] == "underpowered" for t in report["tasks"])
    assert "inconclusive: 3 of 3 comparable task(s) undecided ([gate] undecided allows 0)" in said
    assert f"--repeat {report['settle_repeat']}" in said and report["settle_repeat"] in (2, 4)
    # the same agent again: compare has no model gap to measure, only the box
    code, second, said = _replay(suite, sshd_hosts.inventory_path, out, "--repeat", "1")
    done = _crosshost("compare", str(run), str(second))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "agent pins (agent_sha) are equal on every task" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_until_decided_finds_the_ninety_ten_task_and_stops_the_quiet_ones_early(
    sshd_hosts: Any, tmp_path: Path
) -> None:
    flag = sshd_hosts.fleet.state / "hosts" / "box-a" / "opt" / FLAG_DIR
    flag.mkdir(parents=True)
    (flag / "high").touch()  # box-a passes coin-a 90% of the time, box-b 10%
    try:
        # coin-b passes and coin-c fails everywhere: decided after the first round's 2 attempts
        suite = _coin_suite(tmp_path, {"rate": 0.1, "salt": "until", "rates": {"coin-b": 1.0, "coin-c": 0.0}})
        code, run, said = _replay(
            suite, sshd_hosts.inventory_path, tmp_path / "runs", "--hosts", "box-a,box-b", "--repeat", "2",
            "--until-decided", "--max-repeat", "32",
        )  # fmt: skip
    finally:
        shutil.rmtree(flag)
    report = _report(run)
    manifest = json.loads((run / "manifest.json").read_text())
    assert code == 1, said  # one task of three flips: over the 0.10 gate
    by_task = {t["task"]: t for t in report["tasks"]}
    assert by_task["coin-a"]["classification"] == "host_coupling", by_task["coin-a"]
    assert by_task["coin-a"]["flipped_hosts"] == ["box-b"]
    assert manifest["task_repeat"]["coin-b"] == 2 and manifest["task_repeat"]["coin-c"] == 2
    assert manifest["task_repeat"]["coin-a"] > 2
    assert manifest["looks"] == 5 and report["looks"] == 5  # 2, 4, 8, 16, 32 attempts a host
    assert [r["repeat"] for r in manifest["rounds"]][0] == 2 and manifest["rounds"][1]["tasks"] == ["coin-a"]
    for entry in manifest["rounds"]:  # every round is kept in the run directory
        assert (run / "rounds" / entry["run_id"] / "manifest.json").is_file()
    # a round is a run directory of its own: its attempts 2 and 3 are judged, none missing before them
    second = _crosshost("report", str(run / "rounds" / manifest["rounds"][1]["run_id"]), "--format", "json")
    assert second.returncode != 3, second.stdout + second.stderr
    [round_task] = json.loads(second.stdout)["tasks"]
    assert {h: len(v) for h, v in round_task["verdicts"].items()} == {"box-a": 2, "box-b": 2}
    rates = {r["host"]: r for r in by_task["coin-a"]["rates"]}
    assert rates["box-b"]["p_adjusted"] < 0.05 / 5
    assert {r["n"] for r in by_task["coin-b"]["rates"]} == {2}
    assert "--until-decided: 3 round(s) of 5 planned (2, 4, 8, 16, 32 attempts a host), 12 attempts a host" in said


def test_a_time_zone_flip_names_the_time_zone_from_the_offset_the_predicate_printed(
    sshd_hosts: Any, tmp_path: Path
) -> None:
    predicate = 'off=$(date +%z)\necho "stamped $(date +%Y-%m-%dT%H:%M:%S%z)"\n[ "$off" = "+0000" ]\n'
    suite = write_suite(tmp_path / "tz", {
        "stamp": {"script": [{"content": "ok", "finish": "stop"}], "repo": {"run_tests.sh": predicate}},
    })  # fmt: skip
    inventory = tmp_path / "hosts.toml"
    text = Path(sshd_hosts.inventory_path).read_text()
    inventory.write_text(text.replace('name = "box-b"', 'name = "box-b"\nenv = { TZ = "EST5" }', 1))
    code, run, said = _replay(suite, inventory, tmp_path / "runs", "--tasks", "stamp")
    [task] = _report(run)["tasks"]
    assert task["classification"] == "host_coupling" and task["flipped_hosts"] == ["box-b"], said
    assert task["cause"].startswith("box-b: tz.utc_offset_s 0 → -18000"), task["cause"]
    assert "cause stamp: box-b: tz.utc_offset_s 0 → -18000" in said


def test_a_negative_golden_task_replays_and_a_lint_error_elsewhere_stops_no_other_task(
    sshd_hosts: Any, tmp_path: Path
) -> None:
    wipe = [
        {"tool_calls": [{"name": "wipe_disk", "args": {"device": "sda"}}]},
        {"content": "done", "finish": "stop"},
    ]
    lookup = [{"tool_calls": [{"name": "lookup", "args": {"q": "x"}}]}, {"content": "done", "finish": "stop"}]
    suite = write_suite(tmp_path / "neg", {
        "catches-wipe": {"toml": 'expect_findings = ["unknown_tool:wipe_disk"]\n', "script": wipe},
        "broken": {"toml": 'expect_tools = ["lookup"]\n', "script": wipe},  # undeclared: a lint error
        "other": {"toml": 'expect_tools = ["lookup"]\n', "script": lookup},
    })  # fmt: skip
    out = tmp_path / "runs"
    code, _, said = _replay(suite, sshd_hosts.inventory_path, out)
    assert code == 2 and "broken/script.json" in said and "'wipe_disk' is not a tool" in said
    code, run, said = _replay(suite, sshd_hosts.inventory_path, out, "--tasks", "catches-wipe,other")
    assert code == 0, said
    assert "(not selected, so it does not stop this replay)" in said
    tasks = {t["task"]: t for t in _report(run)["tasks"]}
    assert set(tasks) == {"catches-wipe", "other"}
    assert all(v == ["pass"] for v in tasks["catches-wipe"]["verdicts"].values()), tasks["catches-wipe"]
    assert tasks["catches-wipe"]["classification"] == "agree"
