"""The run history: an SQLite index (``runs/index.sqlite``) over the run directories.

The run directories stay the source of truth; the index only makes "what changed since last
time" cheap to ask. ``record_run`` indexes one finished run dir, ``rebuild`` recreates the whole
index from every run dir and yields exactly the rows incremental recording would.

Concurrency: WAL mode, a busy timeout, one connection per writer and one short ``BEGIN IMMEDIATE``
transaction per run, so two replays finishing at the same moment serialise instead of failing or
interleaving half-written rows. Durability: ``synchronous = NORMAL``, WAL's own setting: a commit is
not flushed to disk by itself (a power cut may lose the last runs' rows, never damage the index),
and ``--rebuild`` recovers any row from its run directory; a replay does not wait on the disk for a
cache of what its run directory holds.

What the index keeps of a run is ``run_row.py``; what changed between two runs, ``run_changes.py``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import CrosshostError, InputError
from orchestrator.exit_policy import BAD_INPUT, compare_last_exit
from orchestrator.hints import command, out_words
from orchestrator.store.failures import Failure, failures
from orchestrator.store.run_changes import Changes, changes
from orchestrator.store.run_row import RunRow, TaskOutcome, read_run
from orchestrator.store.rundir import RunDir

if TYPE_CHECKING:
    from orchestrator.analysis.models import RunReport

INDEX_NAME = "index.sqlite"
BUSY_TIMEOUT_MS = 30_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id     TEXT PRIMARY KEY,
    kind       TEXT NOT NULL CHECK (kind IN ('replay', 'repro')),
    started    TEXT,
    finished   TEXT,
    suite      TEXT,
    suite_sha  TEXT,
    pins       TEXT NOT NULL,   -- JSON
    hosts      TEXT NOT NULL,   -- JSON: [{"name", "fingerprint", "reachable"}]
    flip_rate  REAL,
    valid      INTEGER,         -- 0/1, NULL when the run has no verdict on validity
    pass_rate  TEXT NOT NULL,   -- JSON: {"<host>": rate or null}
    repeat     INTEGER          -- attempts per task per host; NULL when the run did not record it
);
CREATE TABLE IF NOT EXISTS task_results (
    run_id         TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    task           TEXT NOT NULL,
    classification TEXT,
    flip           INTEGER NOT NULL,
    PRIMARY KEY (run_id, task)
);
CREATE INDEX IF NOT EXISTS runs_by_suite ON runs (suite, started, run_id);
-- a suite's newest runs read in order, without reading the others (the report page's trend)
CREATE INDEX IF NOT EXISTS runs_newest ON runs (kind, suite, COALESCE(started, finished, ''), run_id);
"""


# ---------------------------------------------------------------- connection


def index_path(runs_dir: Path) -> Path:
    return Path(runs_dir) / INDEX_NAME


@contextlib.contextmanager
def _connect(runs_dir: Path) -> Iterator[sqlite3.Connection]:
    path = index_path(runs_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so a writer takes the write lock
        # up front instead of failing on a read->write upgrade under contention.
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    except sqlite3.Error as exc:
        raise CrosshostError(f"{path}: cannot open the history index: {exc}") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA synchronous = NORMAL")  # the index is a cache of the run dirs (see above)
        _initialise(conn, path)
        yield conn
    except sqlite3.Error as exc:
        raise CrosshostError(
            f"{path}: history index error: {exc} (recreate it: {command('history', '--rebuild', *out_words(runs_dir))})"
        ) from exc
    finally:
        conn.close()


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    """An index written before ``repeat`` existed gets the column (NULL: unknown until --rebuild)."""
    have = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
    if "repeat" not in have:
        conn.execute("ALTER TABLE runs ADD COLUMN repeat INTEGER")


def _initialise(conn: sqlite3.Connection, path: Path) -> None:
    """Switch to WAL and create the tables, once, under a file lock.

    Changing the journal mode of a fresh database can fail with "database is locked" without
    waiting on the busy timeout when two processes create the index at the same moment; the lock
    serialises that first step. WAL is persistent, so later opens skip it.
    """
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(f"BEGIN;{_SCHEMA}COMMIT;")  # one transaction: a new index is one commit
            _add_missing_columns(conn)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def _write(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


# ---------------------------------------------------------------- writing


def _insert(conn: sqlite3.Connection, row: RunRow) -> None:
    conn.execute("DELETE FROM task_results WHERE run_id = ?", (row.run_id,))
    conn.execute("DELETE FROM runs WHERE run_id = ?", (row.run_id,))
    conn.execute(
        f"INSERT INTO runs ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            row.run_id,
            row.kind,
            row.started,
            row.finished,
            row.suite,
            row.suite_sha,
            json.dumps(row.pins, sort_keys=True),
            json.dumps(row.hosts, sort_keys=True),
            row.flip_rate,
            None if row.valid is None else int(row.valid),
            json.dumps(row.pass_rate, sort_keys=True),
            row.repeat,
        ),
    )
    conn.executemany(
        "INSERT INTO task_results VALUES (?,?,?,?)",
        [(row.run_id, t, r["classification"], int(r["flip"])) for t, r in sorted(row.tasks.items())],
    )


def record_run(runs_dir: Path, run_dir: Path, report: RunReport | None = None) -> RunRow:
    """Index one finished run directory (idempotent: recording it again replaces its rows);
    ``report``: its report.json as the analysis that wrote it holds it."""
    row = read_run(run_dir, report)  # read everything before taking the write lock: keep it short
    with _connect(runs_dir) as conn, _write(conn):
        _insert(conn, row)
    return row


def run_dirs(runs_dir: Path) -> list[Path]:
    """Every directory under ``runs_dir`` that looks like a run (has a manifest)."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        return []
    return sorted(p for p in runs_dir.iterdir() if RunDir(p).manifest_path.is_file())


def _set_aside(runs_dir: Path) -> Path:
    """Move a damaged index (and its WAL files) out of the way, kept for a post-mortem."""
    path = index_path(runs_dir)
    aside = path.with_name(f"{path.name}.damaged-{_dt.datetime.now(_dt.UTC):%Y%m%dT%H%M%S%fZ}")
    for suffix in ("", "-wal", "-shm"):
        part = Path(f"{path}{suffix}")
        if part.exists():
            part.replace(f"{aside}{suffix}")
    return aside


def rebuild(runs_dir: Path) -> tuple[int, list[str]]:
    """Recreate the index from every run dir. Returns (runs indexed, skipped dirs with the reason).
    An index that cannot be opened or read is set aside and a new one written: the run dirs are
    the source of truth, so this is the remedy for a damaged index."""
    rows, skipped = [], []
    for d in run_dirs(runs_dir):
        try:
            rows.append(read_run(d))
        except InputError as exc:
            skipped.append(f"{d.name}: {exc}")
    try:
        with _connect(runs_dir) as conn:
            conn.execute("PRAGMA quick_check").fetchall()
            conn.execute("SELECT count(*) FROM runs").fetchone()
    except CrosshostError:
        skipped.append(f"{index_path(runs_dir).name}: damaged, set aside as {_set_aside(runs_dir).name}")
    with _connect(runs_dir) as conn, _write(conn):
        conn.execute("DELETE FROM task_results")
        conn.execute("DELETE FROM runs")
        for row in rows:
            _insert(conn, row)
    return len(rows), skipped


# ---------------------------------------------------------------- reading the index


def _row(conn: sqlite3.Connection, r: tuple[Any, ...]) -> RunRow:
    run_id = r[0]
    tasks = {
        t: TaskOutcome(classification=c, flip=bool(f))
        for t, c, f in conn.execute(
            "SELECT task, classification, flip FROM task_results WHERE run_id = ? ORDER BY task", (run_id,)
        )
    }
    return RunRow(
        run_id=run_id,
        kind=r[1],
        started=r[2],
        finished=r[3],
        suite=r[4],
        suite_sha=r[5],
        pins=json.loads(r[6]),
        hosts=json.loads(r[7]),
        flip_rate=r[8],
        valid=None if r[9] is None else bool(r[9]),
        pass_rate=json.loads(r[10]),
        tasks=tasks,
        repeat=r[11],
    )


_COLUMNS = "run_id, kind, started, finished, suite, suite_sha, pins, hosts, flip_rate, valid, pass_rate, repeat"
# Newest first: by start time, the run id breaks ties (run ids sort by time too).
_NEWEST_FIRST = "COALESCE(started, finished, '') DESC, run_id DESC"


def history(
    runs_dir: Path, suite: str | None = None, last: int | None = None, kind: str | None = None
) -> list[RunRow]:
    """Indexed runs, oldest first; ``last`` keeps the newest N."""
    where, args = [], []
    if suite is not None:
        where.append("suite = ?")
        args.append(suite)
    if kind is not None:
        where.append("kind = ?")
        args.append(kind)
    sql = f"SELECT {_COLUMNS} FROM runs"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY {_NEWEST_FIRST}"
    if last is not None:
        sql += f" LIMIT {int(last)}"
    with _connect(runs_dir) as conn:
        rows = [_row(conn, r) for r in conn.execute(sql, args).fetchall()]
    return list(reversed(rows))


@dataclass(frozen=True)
class RunRates:
    """What a trend draws of one indexed run: its rates, none of its task rows."""

    run_id: str
    started: str | None
    finished: str | None
    flip_rate: float | None
    pass_rate: dict[str, float | None]


def _rates(r: tuple[Any, ...]) -> RunRates:
    return RunRates(run_id=r[0], started=r[1], finished=r[2], flip_rate=r[3], pass_rate=json.loads(r[4]))


def newest_rates(runs_dir: Path, suite: str | None, kind: str, last: int) -> list[RunRates]:
    """The newest ``last`` runs of ``suite`` (every suite's when None) and ``kind``, newest first:
    one query that reads the runs' rates only, so its cost is that of ``last`` rows, not of the index."""
    where, args = "kind = ?", [kind]
    if suite is not None:
        where += " AND suite = ?"
        args.append(suite)
    with _connect(runs_dir) as conn:
        found = conn.execute(
            f"SELECT run_id, started, finished, flip_rate, pass_rate FROM runs WHERE {where}"
            f" ORDER BY {_NEWEST_FIRST} LIMIT {int(last)}",
            args,
        ).fetchall()
    return [_rates(r) for r in found]


def previous_run(runs_dir: Path, row: RunRow) -> RunRow | None:
    """The run of the same suite and kind just before ``row`` in time, if any."""
    key = (row.started or row.finished or "", row.run_id)
    with _connect(runs_dir) as conn:
        r = conn.execute(
            f"SELECT {_COLUMNS} FROM runs WHERE suite IS ? AND kind = ? AND run_id != ?"
            f" AND (COALESCE(started, finished, ''), run_id) < (?, ?)"
            f" ORDER BY {_NEWEST_FIRST} LIMIT 1",
            (row.suite, row.kind, row.run_id, *key),
        ).fetchone()
        return _row(conn, r) if r else None


def compare_last(runs_dir: Path, run_dir: Path, report: RunReport | None = None) -> list[str]:
    """Tasks of ``run_dir`` that flip now and did not in the previous run of the same suite.

    Records the run first (idempotent), so the answer never depends on whether the caller did.
    No previous run: nothing is "newly" flipping, the list is empty.
    """
    row = record_run(runs_dir, run_dir, report)
    prev = previous_run(runs_dir, row)
    if prev is None:
        return []
    return changes(prev, row).newly_flipping


# ---------------------------------------------------------------- the `history` command


@dataclass
class HistoryEntry:
    row: RunRow
    changes: Changes | None  # against the previous run of the same suite and kind; None for the first


def history_view(runs_dir: Path, suite: str | None = None, last: int | None = None) -> list[HistoryEntry]:
    """The rows ``crosshost history`` shows, each with what changed since its predecessor."""
    if not index_path(runs_dir).is_file() and run_dirs(runs_dir):
        rebuild(runs_dir)  # run dirs exist but no index yet (e.g. copied from elsewhere): build it
    out = []
    for row in history(runs_dir, suite, last):
        prev = previous_run(runs_dir, row)
        out.append(HistoryEntry(row, changes(prev, row, runs_dir) if prev else None))
    return out


@dataclass
class HistoryListing:
    """What ``crosshost history`` shows: the entries, the scheduled runs that failed before they
    started, and what rebuilding the index said."""

    runs_dir: Path
    suite: str | None
    entries: list[HistoryEntry]
    notes: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)


def history_listing(
    runs_dir: Path, suite: str | None = None, last: int | None = None, *, rebuild_index: bool = False
) -> HistoryListing:
    """``crosshost history``: optionally rebuild the index, then the entries to show."""
    notes: list[str] = []
    if rebuild_index:
        n, skipped = rebuild(runs_dir)
        notes += [f"skipped {s}" for s in skipped]
        notes.append(f"rebuilt {index_path(runs_dir)} from {n} run(s)")
    failed = failures(runs_dir, suite, last)
    entries = history_view(runs_dir, suite, last) if index_path(runs_dir).is_file() or run_dirs(runs_dir) else []
    return HistoryListing(runs_dir, suite, entries, notes, failed)


# ---------------------------------------------------------------- the hook `replay` calls


@dataclass
class AfterReplay:
    newly_flipping: list[str]
    warning: str | None = None  # the index could not be written; the run dir is intact
    compared: bool = True  # False: --compare-last asked and the index could not answer

    def exit_code(self, replay_code: int) -> int:
        """``--compare-last``: a newly flipping task makes a passing replay exit 1, even under the gate;
        a comparison that could not be made is never a pass (2: the index named in the warning)."""
        if not self.compared and replay_code == 0:
            return BAD_INPUT
        return compare_last_exit(replay_code, self.newly_flipping)

    def message(self, suite: str | None) -> str | None:
        if not self.newly_flipping:
            return None
        return f"newly flipping against the previous run of {suite or 'this suite'}: {', '.join(self.newly_flipping)}"


def after_replay(run_dir: Path, *, compare: bool = False, report: RunReport | None = None) -> AfterReplay:
    """Record a finished replay in ``<its parent>/index.sqlite``; with ``compare``, what newly flips.
    ``report``: the run's report.json as the analysis that wrote it holds it (not read back).

    An index failure never costs the run: the run dir is the source of truth and ``history --rebuild``
    recovers the index, so it comes back as a warning.
    """
    runs_dir = Path(run_dir).parent
    try:
        if compare:
            return AfterReplay(compare_last(runs_dir, run_dir, report))
        record_run(runs_dir, run_dir, report)
        return AfterReplay([])
    except CrosshostError as exc:
        if compare:
            return AfterReplay([], warning=f"--compare-last could not compare: {exc}", compared=False)
        return AfterReplay([], warning=f"history index not updated: {exc}")
