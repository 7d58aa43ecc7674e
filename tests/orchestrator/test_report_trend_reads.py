"""The report page's trend reads the newest runs' rates only: the page is byte for byte the page
the trend read from the whole index made (the plain way, kept here as the reference), and what it
reads of the index does not grow with the index."""

from __future__ import annotations

import dataclasses
import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis import analyse_run
from orchestrator.analysis.models import RunReport
from orchestrator.errors import CrosshostError
from orchestrator.report import analyse_and_write, html, trend
from orchestrator.report.trend import MAX_TREND_RUNS, TrendPoint
from orchestrator.store import history as history_module
from orchestrator.store.history import history, index_path, record_run
from orchestrator.store.run_row import RunRow, read_run
from tests.support.html_run import build_known_run
from tests.support.rundirs import Attempt

THIS = "20250101T000000Z-abcdef"  # build_known_run's run id: the run whose page is rendered


def _plain_trend_points(report: RunReport, run_dir: Path, started: str | None) -> list[TrendPoint]:
    """The trend as it was read: every run of the suite, each with its task rows."""
    runs_dir = run_dir.parent
    if not index_path(runs_dir).is_file():
        return []
    try:
        rows = history(runs_dir, report.suite, kind="replay")
    except CrosshostError:
        return []
    points = [TrendPoint(r.run_id, r.started or r.finished, r.flip_rate, r.pass_rate) for r in rows]
    if not points:
        return []
    this = TrendPoint(report.run_id, started, report.flip_rate, {s.host: s.pass_rate for s in report.stats})
    points = [p for p in points if p.run_id != report.run_id] + [this]
    points.sort(key=lambda p: (p.started or "", p.run_id))
    return points[-trend.MAX_TREND_RUNS :]


def _templates(root: Path) -> list[RunRow]:
    """Real run directories, analysed and read as the index keeps them: the rows the many are made of."""
    rows = []
    for i in range(3):
        extra = {("box-c", "agree-task", n): Attempt("fail" if i else "pass") for n in (0, 1)}
        run = build_known_run(root, f"20240101T00000{i}Z-tmpl{i:02d}", extra_attempts=extra)
        analyse_and_write(run)
        rows.append(read_run(run))
    return rows


def _many(templates: list[RunRow], n: int) -> Iterator[RunRow]:
    """``n`` runs made of the templates: other suites, repros, runs with no start time, runs that
    started at the same moment, and an earlier row of the run whose page is rendered."""
    for i in range(n):
        t = templates[i % len(templates)]
        started: str | None = f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}T{i % 24:02d}:00:00.000000+00:00"
        if i % 7 == 0:
            started = "2024-06-01T00:00:00.000000+00:00"  # ties: the run id decides
        finished = started
        if i % 11 == 0:
            started, finished = None, f"2024-07-{1 + i % 28:02d}T00:00:00.000000+00:00"
        pass_rate = {h: (None if (i + k) % 9 == 0 else ((i * (k + 3)) % 13) / 12) for k, h in enumerate(t.pass_rate)}
        if i % 5 == 0:
            pass_rate[f"host-{i % 4}"] = (i % 6) / 5  # a host only some runs had
        yield dataclasses.replace(
            t,
            run_id=f"2024{i:04d}T000000Z-{i:06x}",
            started=started,
            finished=finished,
            suite="other-suite" if i % 6 == 0 else t.suite,
            kind="repro" if i % 8 == 0 else "replay",
            flip_rate=None if i % 10 == 0 else (i % 17) / 16,
            pass_rate=pass_rate,
        )
    # what the index holds for this run: the page shows the report being written instead
    yield dataclasses.replace(templates[0], run_id=THIS, flip_rate=0.99, started="2024-03-03T00:00:00.000000+00:00")


def _index(runs_dir: Path, rows: Iterator[RunRow]) -> None:
    """Written by the store's own writer, in one transaction."""
    with history_module._connect(runs_dir) as conn, history_module._write(conn):
        for row in rows:
            history_module._insert(conn, row)


def _page(report: RunReport, run: Path, plain: bool, monkeypatch: pytest.MonkeyPatch) -> str:
    with monkeypatch.context() as m:
        if plain:
            m.setattr(html, "trend_points", _plain_trend_points)
        page = html.render_html(report, run)
    return re.sub(r"written \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "written <now>", page)


@pytest.mark.parametrize("others", [0, 1, 40, 90, 200])
def test_the_page_is_the_page_the_whole_index_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, others: int
) -> None:
    templates = _templates(tmp_path / "templates")
    runs = tmp_path / "runs"
    _index(runs, _many(templates, others))
    pages = []
    for started in ("2025-01-01T00:00:00Z", "2024-02-01T00:00:00Z", None):  # newest, among the others, none
        run = build_known_run(runs, THIS, manifest_extra={"started": started})
        report = analyse_run(run)
        for stale in ("2024-03-03T00:00:00.000000+00:00", "2099-12-31T00:00:00.000000+00:00"):
            # what the index holds for this run: in the middle of the others, or the newest of all
            _index(runs, iter([dataclasses.replace(templates[0], run_id=THIS, flip_rate=0.99, started=stale)]))
            for suite in (report.suite, "other-suite", "no-such-suite", None):
                report.suite = suite
                plain, new = _page(report, run, True, monkeypatch), _page(report, run, False, monkeypatch)
                assert new == plain, (started, stale, suite)
                pages.append(new)
        shutil.rmtree(run)
    shown = [p for p in pages if '<section id="trend">' in p]
    assert shown and (others < 100 or any(f"{MAX_TREND_RUNS} run(s) of" in p for p in shown))


def test_a_page_written_by_a_replay_is_the_page_the_whole_index_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs recorded as a replay records them (report, then the index), the last one's page rendered;
    the trend drawn shorter so that a few runs are more than it draws."""
    monkeypatch.setattr(trend, "MAX_TREND_RUNS", 5)
    runs = tmp_path / "runs"
    for i in range(8):
        extra = {("box-c", "agree-task", n): Attempt("fail" if i % 3 == n else "pass") for n in (0, 1)}
        run = build_known_run(
            runs, f"20250101T{i:06d}Z-run{i:03d}", extra_attempts=extra,
            manifest_extra={"started": f"2025-01-01T{i // 60:02d}:{i % 60:02d}:00Z"},
        )  # fmt: skip
        report = analyse_and_write(run)
        record_run(runs, run, report)
    plain, new = _page(report, run, True, monkeypatch), _page(report, run, False, monkeypatch)
    assert new == plain and "5 run(s) of triage" in new


class _Counted:
    """What the trend asks of the index: statements run, and rows the store decodes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.statements: list[str] = []
        self.decoded = 0
        connect, rates = sqlite3.connect, history_module._rates

        def counting_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            conn = connect(*args, **kwargs)
            conn.set_trace_callback(self.statements.append)
            return conn

        def counting_rates(r: tuple[Any, ...]) -> history_module.RunRates:
            self.decoded += 1
            return rates(r)

        monkeypatch.setattr(history_module.sqlite3, "connect", counting_connect)
        monkeypatch.setattr(history_module, "_rates", counting_rates)


@pytest.mark.parametrize("plain", [False, True])
def test_what_the_trend_reads_does_not_grow_with_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plain: bool
) -> None:
    """The plain way is measured too, so the count is shown to see the index's growth when it reads it."""
    templates = _templates(tmp_path / "templates")
    reads = []
    for size in (100, 400):
        runs = tmp_path / f"runs-{size}"
        _index(runs, _many(templates, size))
        run = build_known_run(runs, THIS)
        report = analyse_run(run)
        with monkeypatch.context() as m:
            counted = _Counted(m)
            points = (_plain_trend_points if plain else trend.trend_points)(report, run, None)
        assert len(points) == MAX_TREND_RUNS
        tasks_read = sum("FROM task_results" in s for s in counted.statements)
        reads.append((len(counted.statements), tasks_read, counted.decoded))
        if not plain:
            # the runs are read in the order of an index, newest first: none but those shown is read
            (query,) = [s for s in counted.statements if s.startswith("SELECT") and "FROM runs" in s]
            conn = sqlite3.connect(index_path(runs))
            plan = " ".join(r[-1] for r in conn.execute(f"EXPLAIN QUERY PLAN {query}"))
            conn.close()
            assert "USING INDEX runs_newest" in plan and "TEMP B-TREE" not in plan, plan
    if plain:
        assert reads[1][0] > reads[0][0] + 200  # the plain way asks for every run's task rows
    else:
        assert reads[0] == reads[1]  # the same statements and rows for 100 runs as for 400
        assert reads[0][1] == 0 and reads[0][2] <= MAX_TREND_RUNS + 1


def test_an_index_written_before_the_newest_runs_index_gets_it(tmp_path: Path) -> None:
    """An index an older crosshost wrote has no index of the newest runs: the next open adds it."""
    runs = tmp_path / "runs"
    old = build_known_run(runs, "20241231T000000Z-000001")
    analyse_and_write(old)
    record_run(runs, old)
    conn = sqlite3.connect(index_path(runs))
    conn.execute("DROP INDEX runs_newest")
    conn.close()
    run = build_known_run(runs)
    points = trend.trend_points(analyse_run(run), run, "2099-01-01T00:00:00Z")
    assert [p.run_id for p in points] == ["20241231T000000Z-000001", THIS]
    conn = sqlite3.connect(index_path(runs))
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'runs_newest'").fetchall() == [("runs_newest",)]
    conn.close()
