"""A real replay (local + two sshd hosts) seen the two new ways: its report.html in headless Chromium,
and its spans at a real OTLP/HTTP receiver, with the controller's secret in neither."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agent_runner.redact import redact_text
from orchestrator.cli import app
from orchestrator.commands.replay import ReplayRequest, replay
from tests.orchestrator.test_otel import Receiver, _all_strings
from tools.headless import Browser, find_chromium

pytestmark = pytest.mark.sshd

REPO = Path(__file__).resolve().parents[2]
TRIAGE = REPO / "examples" / "suites" / "triage"
SECRET = "crosshost-test-token-5b7e20"
TASKS = ["shape-shifter", "locale-probe", "leaky-workdir"]


def test_a_replays_page_and_spans(sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if find_chromium() is None:
        pytest.fail("no chromium on PATH: run `make setup` (it installs Debian's chromium)")
    monkeypatch.setenv("CROSSHOST_TEST_TOKEN", SECRET)
    out = replay(ReplayRequest(suite_dir=TRIAGE, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs",
                               tasks=TASKS, repeat=1))  # fmt: skip
    rd = out.run_dir.path
    assert out.exit_code in (0, 1), out.manifest.hosts
    page_file = rd / "report.html"
    assert SECRET not in page_file.read_text(encoding="utf-8")

    with Browser() as browser:
        page = browser.page()
        page.goto(page_file.as_uri())
        page.wait_for("document.body.dataset.ready === '1'")
        assert page.console_errors() == []
        assert page.requests() == [page_file.as_uri()]
        rows = page.evaluate("[...document.querySelectorAll('#matrix tbody tr')].map(tr => tr.dataset.task)")
        assert rows == sorted(TASKS)
        hosts = page.evaluate("[...document.querySelectorAll('#matrix thead th.host-col')].map(th => th.dataset.host)")
        assert hosts == ["local", "box-a", "box-b"]

    receiver = Receiver()
    receiver.thread.start()
    try:
        result = CliRunner().invoke(app, ["export", "otel", str(rd), "--endpoint", receiver.url, "--content"])
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()
    assert result.exit_code == 0, result.output
    spans = receiver.spans()
    roots = [s for s in spans if s["attrs"]["gen_ai.operation.name"] == "invoke_agent"]
    assert sorted((s["attrs"]["crosshost.host"], s["attrs"]["crosshost.task"]) for s in roots) == sorted(
        (h, t) for h in ("local", "box-a", "box-b") for t in TASKS
    )
    report = json.loads((rd / "report.json").read_text())
    fingerprints = {h["name"]: h["fingerprint"] for h in report["hosts"]}
    verdicts = {(t["task"], h): v[0] for t in report["tasks"] for h, v in t["verdicts"].items()}
    for root in roots:
        a = root["attrs"]
        assert a["crosshost.fingerprint"] == fingerprints[a["crosshost.host"]]
        assert a["crosshost.verdict"] == verdicts[(a["crosshost.task"], a["crosshost.host"])]
        assert root["events"][0][0] == "gen_ai.evaluation.result"
    assert any(s["name"].startswith("execute_tool ") for s in spans)  # the scripted tasks' tool calls
    for span in spans:
        for text in _all_strings(span):
            assert SECRET not in text and redact_text(text) == text, (span["name"], text)
