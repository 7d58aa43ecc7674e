"""The four report files, written each on a thread of its own as soon as it is rendered, are byte
for byte the files written one after the other (the plain way, kept here as the reference); a file
that cannot be written still fails the command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.analysis import analyse_run
from orchestrator.analysis.models import REPORT_NAME
from orchestrator.report import render_json, render_junit, render_markdown, write_reports
from orchestrator.report.html import render_html
from orchestrator.store.rundir import write_bytes_atomic
from tests.support.html_run import build_known_run

FILES = (REPORT_NAME, "report.md", "junit.xml", "report.html")
WRITTEN = re.compile(rb"written \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")  # the page's clock, not its content


def _files(run: Path) -> dict[str, bytes]:
    return {name: WRITTEN.sub(b"", (run / name).read_bytes()) for name in FILES}


def test_the_files_written_at_once_are_the_files_written_one_after_the_other(tmp_path: Path) -> None:
    run = build_known_run(tmp_path)
    report = analyse_run(run)
    for name, render in ((REPORT_NAME, render_json), ("report.md", render_markdown), ("junit.xml", render_junit)):
        write_bytes_atomic(run / name, render(report).encode())
    write_bytes_atomic(run / "report.html", render_html(report, run).encode())
    plain = _files(run)
    for name in FILES:
        (run / name).unlink()
    write_reports(run, report)
    assert _files(run) == plain
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]  # no temporary file left


def test_a_file_that_cannot_be_written_fails_the_write(tmp_path: Path) -> None:
    run = build_known_run(tmp_path)
    (run / "report.md").mkdir()  # the atomic rename onto it fails
    with pytest.raises(OSError):
        write_reports(run, analyse_run(run))
    assert (run / REPORT_NAME).is_file() and (run / "report.md").is_dir()
