"""A replay records its run in the history index from the report its analysis holds, not read back
from report.json: the row, the index and what --compare-last finds are those of reading the file
(the plain way, kept here as the reference)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator.analysis.models import RunReport
from orchestrator.report import analyse_and_write
from orchestrator.store.history import after_replay, history
from orchestrator.store.run_row import read_run
from tests.support.html_run import build_known_run
from tests.support.rundirs import Attempt, RunSpec, build_run, two_hosts


def _runs(root: Path) -> list[Path]:
    """Runs of one suite: the known run (three hosts, a flip, hostile markup), a sampled run of
    six attempts, and a later run where another task flips."""
    known = build_known_run(root / "a", run_id="20250101T000000Z-aaaaaa")
    sampled: dict[tuple[str, str, int], Attempt] = {}
    for n in range(6):
        sampled[("local", "s", n)] = Attempt("pass")
        sampled[("box-b", "s", n)] = Attempt("fail" if n % 2 else "pass")
        sampled[("local", "agree-task", n)] = Attempt("pass")
        sampled[("box-b", "agree-task", n)] = Attempt("fail")
    later = build_run(root / "b", RunSpec(hosts=two_hosts(), attempts=sampled, manifest_extra={"sampled": ["s"]}),
                      run_id="20250102T000000Z-bbbbbb")  # fmt: skip
    return [known, later]


def test_the_row_from_the_held_report_is_the_row_read_from_report_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for run in _runs(tmp_path):
        report = analyse_and_write(run)
        plain = read_run(run)
        monkeypatch.setattr(RunReport, "read", None)  # the held report is not read back
        assert read_run(run, report) == plain
        monkeypatch.undo()


def test_the_index_and_compare_last_are_those_of_reading_report_json(tmp_path: Path) -> None:
    said: dict[bool, list[list[str]]] = {False: [], True: []}
    for built in _runs(tmp_path / "built"):
        for held in (False, True):
            run = tmp_path / ("held" if held else "plain") / built.name
            shutil.copytree(built, run)
            report = analyse_and_write(run)
            after = after_replay(run, compare=True, report=report if held else None)
            assert after.warning is None and after.compared
            said[held].append(after.newly_flipping)
    assert said[True] == said[False] == [[], ["agree-task"]]  # flips in the later run, not in the first
    assert history(tmp_path / "held") == history(tmp_path / "plain") and len(history(tmp_path / "plain")) == 2
