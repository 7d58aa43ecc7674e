"""The history index created in one transaction and written without waiting on the disk for each
commit holds what the index created table by table held (the plain way, kept here as the
reference): the same schema, the same rows, in WAL mode, intact; and what ``history`` reads back."""

from __future__ import annotations

import fcntl
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from orchestrator.report import analyse_and_write
from orchestrator.store import history as history_module
from orchestrator.store.history import history, index_path, record_run
from tests.support.html_run import build_known_run
from tests.support.rundirs import Attempt, RunSpec, build_run, two_hosts


def _plain_initialise(conn: sqlite3.Connection, path: Path) -> None:
    """The index's first step as it was: each CREATE its own transaction."""
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(history_module._SCHEMA)
            history_module._add_missing_columns(conn)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _built(root: Path) -> list[Path]:
    runs = [build_known_run(root / "a", run_id="20250101T000000Z-aaaaaa")]
    attempts = {(h, f"t{i}", 0): Attempt("pass" if h == "local" or i % 3 else "fail") for h in ("local", "box-b")
                for i in range(12)}  # fmt: skip
    runs.append(build_run(root / "b", RunSpec(hosts=two_hosts(), attempts=attempts), run_id="20250102T000000Z-bbbbbb"))
    for run in runs:
        analyse_and_write(run)
    return runs


def _content(runs_dir: Path) -> dict[str, Any]:
    conn = sqlite3.connect(index_path(runs_dir))
    try:
        return {
            "schema": conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name").fetchall(),
            "runs": conn.execute("SELECT * FROM runs ORDER BY run_id").fetchall(),
            "tasks": conn.execute("SELECT * FROM task_results ORDER BY run_id, task").fetchall(),
            "journal": conn.execute("PRAGMA journal_mode").fetchone(),
            "intact": conn.execute("PRAGMA integrity_check").fetchall(),
        }
    finally:
        conn.close()


def test_the_index_holds_what_the_plain_index_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _built(tmp_path / "built")
    plain_dir, new_dir = tmp_path / "plain", tmp_path / "new"
    for run in runs:
        record_run(new_dir, run)
        record_run(new_dir, run)  # recorded again: replaced, not doubled
    read_new = history(new_dir)
    with monkeypatch.context() as m:
        m.setattr(history_module, "_initialise", _plain_initialise)
        for run in runs:
            record_run(plain_dir, run)
            record_run(plain_dir, run)
        read_plain = history(plain_dir)
    new, plain = _content(new_dir), _content(plain_dir)
    assert new == plain
    assert new["journal"] == ("wal",) and new["intact"] == [("ok",)] and len(new["runs"]) == 2
    assert read_new == read_plain and [r.run_id for r in read_new] == [r.name for r in runs]


def test_an_index_the_plain_way_created_is_written_on_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An index created by an earlier crosshost (table by table) is opened, and written, as it is."""
    first, second = _built(tmp_path / "built")
    for runs_dir, plain_first in ((tmp_path / "mixed", True), (tmp_path / "new", False)):
        with monkeypatch.context() as m:
            if plain_first:
                m.setattr(history_module, "_initialise", _plain_initialise)
            record_run(runs_dir, first)
        record_run(runs_dir, second)
    assert _content(tmp_path / "mixed") == _content(tmp_path / "new")
