"""The report page shows the traces from the records the analysis kept when it read them, and what
it shows is what it showed reading each trace again from its file (the plain way, kept here as the
reference): the page's data, report.html byte for byte, and every other report file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis import analyse_run
from orchestrator.analysis.attempts import TraceRecords
from orchestrator.report import analyse_and_write, page_traces, write_reports
from orchestrator.report.html import render_html
from orchestrator.report.page_data import MAX_STEPS_PER_TRACE, build_data
from tests.support.html_run import build_known_run
from tests.support.rundirs import Attempt

REPORT_FILES = ("report.json", "report.md", "junit.xml", "report.html")
WRITTEN = re.compile(r"written \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")  # the page's clock, not its content


def _run(tmp_path: Path) -> Path:
    """The known run (three hosts, a flip, hostile markup, observation sidecars) and traces that take
    the page's other ways: one longer than it embeds, one with a damaged line, one cut short."""
    long_calls = [("read_unit_status", {"unit": f"u{i}.service"}) for i in range(MAX_STEPS_PER_TRACE + 40)]
    run = build_known_run(tmp_path, extra_attempts={
        ("local", "long-task", 0): Attempt("pass", calls=long_calls),
        ("box-b", "long-task", 0): Attempt("pass", calls=long_calls[:-3]),
        ("box-c", "long-task", 0): Attempt("fail", calls=long_calls[5:]),
        ("local", "damaged-task", 0): Attempt("pass"),
        ("box-b", "damaged-task", 0): Attempt("pass"),
        ("box-c", "damaged-task", 0): Attempt("pass"),
    })  # fmt: skip
    traces = run / "hosts" / "box-b" / "traces"
    damaged = traces / "damaged-task.0.jsonl"
    lines = damaged.read_text().splitlines()
    damaged.write_text("\n".join([lines[0], '{"type": "turn", "step": 1, "tool": ', *lines[1:]]) + "\n")
    cut = run / "hosts" / "box-c" / "traces" / "damaged-task.0.jsonl"
    cut.write_text("\n".join(cut.read_text().splitlines()[:-1]) + "\n")  # no finish record
    return run


def _page(report: Any, run: Path, traces: TraceRecords | None) -> str:
    return WRITTEN.sub("written <now>", render_html(report, run, traces))


@pytest.mark.parametrize("limit", [50_000, 400], ids=["all-kept", "some-read-again"])
def test_the_page_from_the_kept_records_is_the_page_read_from_the_files(tmp_path: Path, limit: int) -> None:
    run = _run(tmp_path)
    plain = analyse_run(run)
    kept = TraceRecords(limit)
    report = analyse_run(run, keep=kept)
    assert report.model_dump() == plain.model_dump()  # keeping changes nothing the analysis says
    data = build_data(report, run, kept)
    assert json.dumps(data, sort_keys=True) == json.dumps(build_data(plain, run), sort_keys=True)
    assert data["traces"] and any(t["more"] for t in data["traces"]) and any(t["problems"] for t in data["traces"])
    assert _page(report, run, kept) == _page(plain, run, None)


def test_a_replay_writes_the_report_files_it_wrote_reading_the_traces_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tmp_path)
    write_reports(run, analyse_run(run))  # the plain way: the page reads every trace from its file
    plain = {name: (run / name).read_text(encoding="utf-8") for name in REPORT_FILES}
    read_again: list[Path] = []
    real = page_traces.iter_trace

    def counted(path: Path) -> Any:
        read_again.append(path)
        return real(path)

    monkeypatch.setattr(page_traces, "iter_trace", counted)
    analyse_and_write(run)
    for name in REPORT_FILES:
        got = (run / name).read_text(encoding="utf-8")
        if name == "report.html":
            got, plain[name] = WRITTEN.sub("", got), WRITTEN.sub("", plain[name])
        assert got == plain[name], name
    # every trace the page shows came from the analysis' reading, the damaged and the cut one too
    assert read_again == []


def test_what_is_kept_stops_at_its_limit(tmp_path: Path) -> None:
    run = _run(tmp_path)
    kept = TraceRecords(100)
    analyse_run(run, keep=kept)
    assert 0 <= kept.room < 100
    assert kept.typed(run / "hosts" / "local" / "traces" / "long-task.0.jsonl") is None  # too long to keep
