"""write_reports, the report exit code and the renderers, on analysed run directories."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from rich.console import Console

from orchestrator.analysis import analyse_run
from orchestrator.exit_policy import judged_exit
from orchestrator.report import render_markdown, write_reports
from orchestrator.ui import report_table as render_table
from tests.support.rundirs import Attempt, RunSpec, build_run, two_hosts


def _run(tmp_path, box_b_t2="pass", gate=0.10, **kw):
    attempts = {
        ("local", "t1", 0): Attempt("pass"),
        ("box-b", "t1", 0): Attempt("pass"),
        ("local", "t2", 0): Attempt("pass"),
        ("box-b", "t2", 0): Attempt(box_b_t2, why="predicate exit 1" if box_b_t2 == "fail" else ""),
    }
    return build_run(tmp_path, RunSpec(hosts=two_hosts(), attempts=attempts, gate=gate, **kw))


def test_write_reports_writes_json_md_junit(tmp_path):
    run = _run(tmp_path)
    report = analyse_run(run)
    write_reports(run, report)
    data = json.loads((run / "report.json").read_text())
    assert data["valid"] is True and data["flip_rate"] == 0.0
    assert [t["classification"] for t in data["tasks"]] == ["agree", "agree"]
    assert "| t1 | pass | pass |" in (run / "report.md").read_text()
    suite = ET.parse(run / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "0"
    assert judged_exit(report)[0] == 0


def test_exit_code_1_over_the_gate_and_0_at_it(tmp_path):
    run = _run(tmp_path / "a", box_b_t2="fail")
    assert judged_exit(analyse_run(run))[0] == 1  # 1/2 = 0.5 > 0.10
    assert judged_exit(analyse_run(run, gate=0.5))[0] == 0  # at the gate is within it


def test_exit_code_1_when_invalid_even_without_flips(tmp_path):
    run = _run(tmp_path, contract=None)
    report = analyse_run(run)
    assert report.flip_rate == 0.0 and not report.valid
    assert judged_exit(report)[0] == 1


def test_markdown_details_say_why_and_what_differs(tmp_path):
    md = render_markdown(analyse_run(_run(tmp_path, box_b_t2="fail")))
    assert "### t2: host_coupling — quarantine the agent" in md
    assert "box-b attempt 0 (fail): predicate exit 1" in md
    assert "  - `python`: CPython 3.11.2 → CPython 3.11.9" in md
    assert "### t1" not in md  # agreeing tasks get no details


def test_table_marks_the_flipped_verdict(tmp_path):
    console = Console(width=160, record=True, color_system=None)
    console.print(render_table(analyse_run(_run(tmp_path, box_b_t2="fail"))))
    text = console.export_text()
    row = next(line for line in text.splitlines() if " t2 " in line)
    assert "fail*" in row and "<- flip" in row and "host_coupling" in row
    assert "ABOVE gate=0.10" in text and "\nvalid\n" in text
