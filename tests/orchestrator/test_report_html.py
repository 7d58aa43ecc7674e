"""report.html as written beside report.md: self-contained, escaped, the data the page renders,
the trend from the history index, and ``crosshost view`` (path and --serve)."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.analysis import analyse_run
from orchestrator.cli import app
from orchestrator.commands.view import ensure_report, serving
from orchestrator.report import page_data, write_reports
from orchestrator.report.page_traces import STEP_FIELDS
from orchestrator.store.history import index_path, record_run
from tests.support.html_run import HOSTILE_TASK, HOSTILE_VALUE, OBSERVATION, build_known_run


def _written(tmp_path: Path) -> tuple[Path, str]:
    run = build_known_run(tmp_path)
    write_reports(run, analyse_run(run))
    return run, (run / "report.html").read_text(encoding="utf-8")


def _step(trace: dict, i: int) -> dict:
    return dict(zip(STEP_FIELDS, trace["steps"][i], strict=True))


def _data(page: str) -> dict:
    block = re.search(r'<script type="application/json" id="crosshost-data">(.*?)</script>', page, re.S)
    assert block is not None
    return json.loads(block.group(1))


def test_written_with_the_other_reports_and_fetches_nothing(tmp_path):
    run, page = _written(tmp_path)
    assert {"report.json", "report.md", "junit.xml", "report.html"} <= {p.name for p in run.iterdir()}
    # one file: no external script, stylesheet, image or font; the CSP forbids fetching any
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", page, re.I)
    assert "http://" not in page.replace("http://127.0.0.1:9/health", "").replace(
        "http://www.w3.org/2000/svg", ""
    )
    assert "https://" not in page
    assert "default-src 'none'" in page


def test_hostile_task_ids_and_values_stay_text(tmp_path):
    _, page = _written(tmp_path)
    assert page.count("<script") == 2  # the data block and the page's own script, nothing injected
    assert HOSTILE_TASK not in page and HOSTILE_VALUE not in page
    assert "</script><script>" not in page and "<!--" not in page
    data = _data(page)  # ...yet the values arrive intact for the script to show as text
    task = next(t for t in data["tasks"] if t["task"] == HOSTILE_TASK)
    assert task["why"]["local"][0] == HOSTILE_VALUE
    assert _step(data["traces"][task["traces"]["box-b"][0]], 0)["args"] == {"unit": HOSTILE_VALUE}


def test_the_page_holds_the_matrix_and_the_aligned_traces(tmp_path):
    _, page = _written(tmp_path)
    data = _data(page)
    assert [h["name"] for h in data["hosts"]] == ["local", "box-b", "box-c"]
    assert data["run"]["reference"] == "local" and data["run"]["flipped"] == 1
    flip = next(t for t in data["tasks"] if t["task"] == "flip-task")
    assert flip["verdicts"]["box-b"] == ["fail", "fail"] and flip["classification"] == "host_coupling"
    assert flip["flipped_attempts"] == {"local": [], "box-b": [0, 1], "box-c": []}

    # box-b's attempt 0 makes an extra call at its step 2: the same alignment as the shape diff
    pair = flip["pairs"]["box-b"][0]
    assert [row[2] for row in pair["rows"]] == ["equal", "extra", "equal"]
    assert pair["first"] == 1
    host_trace = data["traces"][flip["traces"]["box-b"][0]]
    assert _step(host_trace, pair["rows"][1][1])["tool"] == "http_get_health"
    assert _step(host_trace, 0)["observation"] == f"box-b says {OBSERVATION} 1"  # the sidecar, as redacted
    assert host_trace["finish"]["why"] == "predicate exit 1: nginx still unhealthy"
    assert host_trace["path"] == "hosts/box-b/traces/flip-task.0.jsonl"
    # box-c: the same shapes (so no alignment needed), another argument value at step 1
    assert flip["pairs"]["box-c"][0] == {"same": 2, "values": [0], "first": 0}
    # identical traces: nothing diverges
    agree = next(t for t in data["tasks"] if t["task"] == "agree-task")
    assert agree["pairs"]["box-b"][0] == {"same": 2, "values": [], "first": None}
    assert flip["attribution"][0]["host"] == "box-b"


def test_links_to_raw_traces_are_percent_encoded(tmp_path):
    _, page = _written(tmp_path)
    data = _data(page)
    task = next(t for t in data["tasks"] if t["task"] == HOSTILE_TASK)
    link = data["traces"][task["traces"]["local"][0]]["path"]
    assert link.startswith("hosts/local/traces/%3Cimg%20src%3Dx") and link.endswith(".0.jsonl")


def test_a_large_run_keeps_the_traces_of_flips_first(tmp_path, monkeypatch):
    monkeypatch.setattr(page_data, "MAX_EMBEDDED_STEPS", 12)
    _, page = _written(tmp_path)
    tasks = {t["task"]: t for t in _data(page)["tasks"]}
    assert tasks["flip-task"]["embedded"] and tasks["flip-task"]["pairs"]["box-b"][0] is not None
    assert not tasks["agree-task"]["embedded"] and tasks["agree-task"]["traces"]["box-b"] == [None, None]


def test_trend_from_the_history_index(tmp_path):
    runs = tmp_path / "runs"
    old = build_known_run(runs, "20241231T000000Z-000001", manifest_extra={"started": "2024-12-31T00:00:00Z"})
    write_reports(old, analyse_run(old))
    record_run(runs, old)
    run = build_known_run(runs)
    write_reports(run, analyse_run(run))
    page = (run / "report.html").read_text()
    assert '<section id="trend">' in page and "2 run(s) of triage" in page
    svg = page[page.index("<svg") : page.index("</svg>")]
    assert "20241231T000000Z-000001 · flip rate: 33.3%" in svg  # the indexed run
    assert "20250101T000000Z-abcdef · box-b pass rate: 33.3%" in svg  # this run, not yet indexed
    assert svg.count("<polyline") == 4  # flip rate and three hosts


def test_no_index_no_trend_and_none_created(tmp_path):
    run, page = _written(tmp_path)
    assert 'id="trend"' not in page
    assert not index_path(run.parent).exists()


def test_view_prints_the_path_and_writes_a_missing_page(tmp_path):
    run = build_known_run(tmp_path)
    result = CliRunner().invoke(app, ["view", str(run)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(run / "report.html")
    assert "flip-task" in (run / "report.html").read_text()
    assert not (run / "report.md").exists()  # only the page was missing; nothing else rewritten


def test_view_of_a_directory_that_is_not_a_run_is_exit_2(tmp_path):
    result = CliRunner().invoke(app, ["view", str(tmp_path)])
    assert result.exit_code == 2
    assert "manifest.json: missing" in result.output and "Traceback" not in result.output
    assert CliRunner().invoke(app, ["view", str(tmp_path / "nope")]).exit_code == 2


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_serve_gives_the_run_directory_and_nothing_outside_it(tmp_path):
    run = build_known_run(tmp_path / "runs")
    ensure_report(run)
    (tmp_path / "secret.txt").write_text("outside the run")
    os.symlink(tmp_path / "secret.txt", run / "escape.txt")
    with serving(run) as (server, url):
        import threading

        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            assert server.server_address[0] == "127.0.0.1"
            assert url.startswith("http://127.0.0.1:") and url.endswith("/report.html")
            status, body = _get(url)
            assert status == 200 and b"crosshost-data" in body
            base = url.rsplit("/", 1)[0]
            assert _get(base + "/hosts/box-b/traces/flip-task.0.jsonl")[0] == 200
            assert _get(base + "/escape.txt")[0] == 404  # a symlink out of the run directory
            assert _get(base + "/../secret.txt")[0] == 404
            assert _get(base + "/%2e%2e/secret.txt")[0] == 404
        finally:
            server.shutdown()
            thread.join(timeout=5)


def test_an_unreadable_trace_is_a_problem_on_the_page_not_a_crash(tmp_path):
    run = build_known_run(tmp_path)
    trace = run / "hosts" / "box-b" / "traces" / "flip-task.0.jsonl"
    trace.unlink()
    trace.mkdir()  # unreadable as a file: the runner's TraceError
    write_reports(run, analyse_run(run))
    assert "cannot read trace" in (run / "report.html").read_text(encoding="utf-8")


def test_a_long_trace_is_cut_and_its_finish_still_shown(tmp_path, monkeypatch):
    monkeypatch.setattr(page_data, "MAX_STEPS_PER_TRACE", 1)
    _, page = _written(tmp_path)
    data = _data(page)
    flip = next(t for t in data["tasks"] if t["task"] == "flip-task")
    trace = data["traces"][flip["traces"]["box-b"][0]]
    assert len(trace["steps"]) == 1 and trace["more"] == 1
    assert trace["finish"]["why"] == "predicate exit 1: nginx still unhealthy"


def test_serve_answers_only_its_own_host_name_and_a_silent_connection_holds_no_thread(tmp_path, monkeypatch):
    """DNS rebinding: a page of evil.example that resolves to 127.0.0.1 sends Host: evil.example and
    is refused. A connection that sends nothing is closed after the read timeout; past the thread
    bound a connection is closed at once rather than given a thread."""
    import socket
    import threading

    from orchestrator import httpserver
    from orchestrator.commands import view

    monkeypatch.setattr(view._RunDirHandler, "timeout", 0.5)
    run = build_known_run(tmp_path / "runs")
    ensure_report(run)
    for bound in (None, 1):
        if bound is not None:
            monkeypatch.setattr(httpserver, "MAX_THREADS", bound)
        with serving(run) as (server, url):
            thread = threading.Thread(target=server.serve_forever, daemon=True)
            thread.start()
            try:
                port = server.server_address[1]
                if bound is None:
                    request = urllib.request.Request(url, headers={"Host": f"evil.example:{port}"})
                    with pytest.raises(urllib.error.HTTPError) as got:
                        urllib.request.urlopen(request, timeout=10)
                    assert got.value.code == 421
                    assert _get(url)[0] == 200 and _get(url.replace("127.0.0.1", "localhost"))[0] == 200
                    silent = socket.create_connection(("127.0.0.1", port), timeout=10)
                    assert silent.recv(100) == b""  # closed by the server after its read timeout
                    silent.close()
                    continue
                held = socket.create_connection(("127.0.0.1", port), timeout=10)  # the one thread, silent
                time.sleep(0.2)
                turned = socket.create_connection(("127.0.0.1", port), timeout=10)
                assert turned.recv(100) == b"" and server.turned_away == 1
                held.close()
                turned.close()
            finally:
                server.shutdown()
                thread.join(timeout=5)
