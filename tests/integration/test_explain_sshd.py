"""crosshost explain against a real sshd host: what it names, what it leaves, what it spends.

box-c has its own /opt holding the demo's feature flag and runs without LANG; the controller's
``local`` pins LANG=C.UTF-8. Two tasks flip: ``locale-probe`` (the environment) and
``feature-flag-probe`` (a file). Explain must name box-c's LANG as the cause of the first by a
counterfactual, must not pretend an environment fact explains the second, and must leave nothing on
either host.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.explain import ExplainRequest, explain
from orchestrator.replay import ReplayRequest, replay
from tests.integration.test_replay_sshd import TRIAGE, _left_of_run

pytestmark = pytest.mark.sshd


def _inventory(hosts: Any, tmp_path: Path) -> Path:
    """The fleet's inventory with local's LANG pinned and box-c's LANG kept out of its runs."""
    text = hosts.inventory_path.read_text()
    text = text.replace('transport = "local"', 'transport = "local"\nenv = { LANG = "C.UTF-8" }', 1)
    text = text.replace('name = "box-c"', 'name = "box-c"\nenv_allowlist = ["PATH", "LC_ALL", "TZ"]', 1)
    path = tmp_path / "hosts.toml"
    path.write_text(text)
    return path


def test_explain_names_the_locale_counterfactual_and_leaves_nothing(fresh_sshd_host: Any, tmp_path: Path) -> None:
    flag = fresh_sshd_host.fleet.hosts["box-c"].dir / "opt" / "crosshost-demo" / "feature.flag"
    flag.parent.mkdir(parents=True)
    flag.touch()
    inventory = _inventory(fresh_sshd_host, tmp_path)
    tasks = ["locale-probe", "feature-flag-probe", "restart-unhealthy-only"]
    started = time.monotonic()
    run = replay(ReplayRequest(suite_dir=TRIAGE, inventory_path=inventory, out=tmp_path / "runs", tasks=tasks, repeat=1))
    replay_s = time.monotonic() - started
    report = run.report
    assert report is not None
    flipped = {t.task for t in report.tasks if t.flip}
    assert flipped == {"locale-probe", "feature-flag-probe"}, [(t.task, t.verdicts) for t in report.tasks]
    # ranked before explain: the task that prints LANG has it first; the flag task names no fact
    by_task = {t.task: t for t in report.tasks}
    assert by_task["locale-probe"].attribution[0].fields[0].field == "locale.LANG"
    assert "no differing fact named by the task" in by_task["feature-flag-probe"].cause

    started = time.monotonic()
    out = explain(ExplainRequest(run_dir=run.run_dir.path, inventory_path=inventory))
    explain_s = time.monotonic() - started
    assert out.exit_code == 0 and not out.errors, out.errors
    record = json.loads((run.run_dir.path / "explain.json").read_text())
    entries = {t["task"]: t for t in record["tasks"]}
    assert set(entries) == flipped
    locale = entries["locale-probe"]
    assert locale["again"] == {"local": "pass", "box-c": "fail"}  # the flip holds when replayed once more
    lang = next(cf for cf in locale["counterfactuals"] if cf["fact"] == "LANG")
    assert (lang["host"], lang["value"], lang["verdict"], lang["reproduces"]) == ("box-c", None, "fail", True)
    flag_entry = entries["feature-flag-probe"]
    assert not any(cf["reproduces"] for cf in flag_entry["counterfactuals"])
    assert record["replays"] == 1 + len({(cf["host"], cf["fact"]) for t in record["tasks"] for cf in t["counterfactuals"]})
    assert record["replays"] <= 1 + record["max_counterfactuals"]

    # every report carries it: the cause first, the counterfactual in report.md, the cost once
    report_json = json.loads((run.run_dir.path / "report.json").read_text())
    causes = {t["task"]: t["cause"] for t in report_json["tasks"]}
    assert causes["locale-probe"].startswith("with box-c's LANG (unset), local fails too")
    assert "no single environment fact reproduces it" in causes["feature-flag-probe"]
    md = (run.run_dir.path / "report.md").read_text()
    assert "local with box-c's LANG (unset): fail, reproduces the flip" in md
    assert report_json["explain"].startswith(f"explain: {record['replays']} replay(s) in ")

    # no residue of explain's own runs on either host
    for run_id in record["runs"]:
        assert _left_of_run(inventory, run_id) == {"local": "", "box-c": ""}
    # its cost: within 3 x the replay of these tasks plus 2 s
    assert explain_s <= 3 * replay_s + 2, (explain_s, replay_s)
