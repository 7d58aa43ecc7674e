"""The run history: an SQLite index (``runs/index.sqlite``) over the run directories.

The run directories stay the source of truth; the index only makes "what changed since last
time" cheap to ask. ``record_run`` indexes one finished run dir, ``rebuild`` recreates the whole
index from every run dir and yields exactly the rows incremental recording would.

Concurrency: WAL mode, a busy timeout, one connection per writer and one short ``BEGIN IMMEDIATE``
transaction per run, so two replays finishing at the same moment serialise instead of failing or
interleaving half-written rows.
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
from typing import Any, NotRequired, TypedDict

from agent_runner.records import Fingerprint
from orchestrator.analysis.attribution import fingerprint_differences
from orchestrator.analysis.models import REPORT_NAME, RunReport
from orchestrator.analysis.stats import pass_counts, pass_rate
from orchestrator.dotted import flatten
from orchestrator.errors import CrosshostError, InputError
from orchestrator.exit_policy import BAD_INPUT, compare_last_exit
from orchestrator.hints import command, out_words
from orchestrator.store.failures import Failure, failures
from orchestrator.store.rundir import Manifest, RunDir, parse_utc

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
"""


class HostSummary(TypedDict):
    """One host of an indexed run (the ``hosts`` column holds a JSON list of them)."""

    name: str
    fingerprint: str | None
    reachable: bool | None
    python: NotRequired[str]  # the manifest's, when it named one
    error: NotRequired[str]  # why the run failed there


class TaskOutcome(TypedDict):
    """One task of an indexed run (a ``task_results`` row)."""

    classification: str | None
    flip: bool


class PinMove(TypedDict):
    pin: str  # dotted: ``t1.prompt_sha``, or ``suite_sha``
    old: Any  # a pin's value: whatever JSON the trace header held
    new: Any


class FieldChange(TypedDict):
    """One fingerprint field that changed: a list field as what came and went, any other as old/new."""

    field: str  # dotted: ``locale.LANG``
    added: NotRequired[list[str]]
    removed: NotRequired[list[str]]
    old: NotRequired[Any]  # a fingerprint value: whatever JSON the host wrote
    new: NotRequired[Any]


class FingerprintChange(TypedDict):
    host: str
    old: str | None
    new: str | None
    python_old: str | None
    python_new: str | None
    fields: NotRequired[list[FieldChange]]  # when both runs' fingerprint.json could be read


class RunRowJson(TypedDict):
    """A ``RunRow`` as ``history --json`` prints it."""

    run_id: str
    kind: str
    started: str | None
    finished: str | None
    suite: str | None
    suite_sha: str | None
    pins: Any
    hosts: list[HostSummary]
    flip_rate: float | None
    valid: bool | None
    pass_rate: dict[str, float | None]
    tasks: dict[str, TaskOutcome]
    repeat: int | None


class ChangesJson(TypedDict):
    """``Changes`` as ``history --json`` prints it."""

    previous: str
    current: str
    newly_flipping: list[str]
    stopped_flipping: list[str]
    pins_moved: list[PinMove]
    hosts_added: list[str]
    hosts_removed: list[str]
    tasks_added: list[str]
    tasks_removed: list[str]
    repeat: dict[str, int | None] | None
    fingerprints_changed: list[FingerprintChange]


@dataclass
class RunRow:
    """One indexed run, as ``history`` returns it."""

    run_id: str
    kind: str
    started: str | None
    finished: str | None
    suite: str | None
    suite_sha: str | None
    pins: Any
    hosts: list[HostSummary]
    flip_rate: float | None
    valid: bool | None
    pass_rate: dict[str, float | None]
    tasks: dict[str, TaskOutcome] = field(default_factory=dict)
    repeat: int | None = None

    @property
    def flipping(self) -> set[str]:
        return {t for t, r in self.tasks.items() if r["flip"]}

    def to_json(self) -> RunRowJson:
        return RunRowJson(
            run_id=self.run_id, kind=self.kind, started=self.started, finished=self.finished, suite=self.suite,
            suite_sha=self.suite_sha, pins=self.pins, hosts=self.hosts, flip_rate=self.flip_rate,
            valid=self.valid, pass_rate=self.pass_rate, tasks=self.tasks, repeat=self.repeat,
        )  # fmt: skip


@dataclass
class Changes:
    """What moved between two runs of the same suite."""

    previous: str
    current: str
    newly_flipping: list[str]
    stopped_flipping: list[str]
    pins_moved: list[PinMove]
    # what makes the two runs not the same measurement: compare them knowing it
    hosts_added: list[str] = field(default_factory=list)
    hosts_removed: list[str] = field(default_factory=list)
    tasks_added: list[str] = field(default_factory=list)
    tasks_removed: list[str] = field(default_factory=list)
    repeat: dict[str, int | None] | None = None  # {"old": n, "new": m} when they differ
    # hosts in both runs whose fingerprint changed
    fingerprints_changed: list[FingerprintChange] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (
            self.newly_flipping or self.stopped_flipping or self.pins_moved or self.hosts_added
            or self.hosts_removed or self.tasks_added or self.tasks_removed or self.repeat
            or self.fingerprints_changed
        )  # fmt: skip

    def to_json(self) -> ChangesJson:
        return ChangesJson(
            previous=self.previous, current=self.current, newly_flipping=self.newly_flipping,
            stopped_flipping=self.stopped_flipping, pins_moved=self.pins_moved, hosts_added=self.hosts_added,
            hosts_removed=self.hosts_removed, tasks_added=self.tasks_added, tasks_removed=self.tasks_removed,
            repeat=self.repeat, fingerprints_changed=self.fingerprints_changed,
        )  # fmt: skip


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
            conn.executescript(_SCHEMA)
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


# ---------------------------------------------------------------- reading a run dir


def _iso(value: str | None) -> str | None:
    """Timestamps as ISO-8601 UTC strings of one fixed width, so ordering by text is ordering by time."""
    parsed = parse_utc(value)
    if parsed is None:
        return value or None
    # one fixed width (microseconds): text order must be time order, even within one second
    return parsed.astimezone(_dt.UTC).isoformat(timespec="microseconds")


def _hosts(manifest: Manifest, report: RunReport | None) -> list[HostSummary]:
    """The report's hosts, else the manifest's; the manifest's python beside each (it names what moved
    when a fingerprint does: cron vs a shell) and the host's error where it failed."""
    if report is not None and report.hosts:
        hosts = [HostSummary(name=h.name, fingerprint=h.fingerprint, reachable=h.reachable) for h in report.hosts]
    else:
        hosts = [
            HostSummary(name=name, fingerprint=rec.fingerprint, reachable=rec.reachable)
            for name, rec in manifest.hosts.items()
        ]
    for h in hosts:
        rec = manifest.hosts.get(h["name"])
        if rec is not None and rec.python:
            h["python"] = rec.python
        if rec is not None and rec.error:  # why the run failed there, for `history` to say
            h["error"] = rec.error
    return hosts


def _pass_rates(run_dir: RunDir, report: RunReport | None, host_names: list[str]) -> dict[str, float | None]:
    """Per host: passes / attempts with a verdict on the agent (``error`` is the host's, not counted),
    from the report's verdicts, else from results.jsonl."""
    verdicts: dict[str, list[str]] = {name: [] for name in host_names}
    tasks = report.tasks if report is not None else []
    if any(t.verdicts for t in tasks):
        for t in tasks:
            for host, seq in t.verdicts.items():
                verdicts.setdefault(host, []).extend(seq)
    else:
        for _, row in run_dir.iter_results():
            verdicts.setdefault(row.env, []).append(row.verdict)
    rates = {h: pass_counts(seq) for h, seq in sorted(verdicts.items())}
    return {h: pass_rate(c.passes, c.n) for h, c in rates.items()}


def read_run(run_dir: Path) -> RunRow:
    """Read one finished run directory into the row the index keeps for it."""
    rundir = RunDir(Path(run_dir))
    manifest = rundir.read_manifest()
    if manifest.shard is not None:  # a part of a run: its merged run is the one indexed
        raise InputError(
            f"{rundir.path}: {manifest.shard.label} of run {manifest.shard.run_id}, not a run of its own "
            "(crosshost merge joins the shards into the run)"
        )
    report_path = rundir.path / REPORT_NAME
    report = RunReport.read(report_path) if report_path.is_file() else None
    repro = rundir.read_repro()
    if report is None and repro is None:
        raise InputError(f"{report_path}: missing; the run has not finished (or crashed before its report)")

    kind = "repro" if repro is not None or manifest.kind == "repro" else "replay"
    suite = manifest.suite.name if manifest.suite else report.suite if report is not None else None
    suite_sha = manifest.suite.sha if manifest.suite else None
    if kind == "repro" and not suite and repro is not None:
        suite = repro.suite
    hosts = _hosts(manifest, report)
    if kind == "repro" and not hosts and repro is not None:
        hosts = [HostSummary(name=h, fingerprint=None, reachable=None) for h in repro.hosts]
    tasks = {t.task: TaskOutcome(classification=t.classification, flip=t.flip) for t in report.tasks} if report else {}
    valid = report.valid if report is not None else None
    flip_rate = report.flip_rate if report is not None else None
    return RunRow(
        run_id=manifest.run_id,
        kind=kind,
        started=_iso(manifest.started),
        finished=_iso(manifest.finished),
        suite=str(suite) if suite else None,
        suite_sha=suite_sha,
        pins=manifest.pins,
        hosts=hosts,
        flip_rate=float(flip_rate) if flip_rate is not None else None,
        valid=bool(valid) if valid is not None else None,
        pass_rate=_pass_rates(rundir, report, [h["name"] for h in hosts]),
        tasks=tasks,
        repeat=manifest.repeat,
    )


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


def record_run(runs_dir: Path, run_dir: Path) -> RunRow:
    """Index one finished run directory (idempotent: recording it again replaces its rows)."""
    row = read_run(run_dir)  # read everything before taking the write lock: keep it short
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


def _fingerprint(run_dir: Path, host: str) -> Fingerprint | None:
    """The host's fingerprint.json in that run; None when it was removed or never written (the
    digests still say it changed)."""
    return RunDir(run_dir).read_fingerprint(host)[0]


def _finding(f: Any) -> str:
    return f"{f.get('detail') or f.get('kind')} ({f.get('action')})" if isinstance(f, dict) else str(f)


def fingerprint_fields(old: Fingerprint, new: Fingerprint) -> list[FieldChange]:
    """What changed between two fingerprints of one host, as a user reads it: the isolation findings
    and environment keys that came or went, then every other field that differs."""
    out: list[FieldChange] = []
    for name, show in (("findings", _finding), ("env_keys", str)):
        before = {show(x) for x in getattr(old, name) or []}
        after = {show(x) for x in getattr(new, name) or []}
        if before != after:
            out.append(FieldChange(field=name, added=sorted(after - before), removed=sorted(before - after)))
    out += [
        FieldChange(field=key, old=a, new=b)
        for key, a, b in fingerprint_differences(old, new)
        if key.split(".", 1)[0] not in ("findings", "env_keys")
    ]
    return out


def changes(prev: RunRow, cur: RunRow, runs_dir: Path | None = None) -> Changes:
    """Tasks that newly flip, tasks that stopped flipping, and pins that moved, from prev to cur;
    with ``runs_dir``, also which fingerprint fields changed (from the run dirs' fingerprint.json).

    Only tasks both runs replayed are compared: a `--tasks` subset run says nothing about the tasks it
    left out (they neither "stopped flipping" nor had their pins "moved")."""
    both = prev.tasks.keys() & cur.tasks.keys()
    left_out = (prev.tasks.keys() | cur.tasks.keys()) - both
    old_pins, new_pins = flatten(prev.pins), flatten(cur.pins)
    moved = [
        PinMove(pin=k, old=old_pins.get(k), new=new_pins.get(k))
        for k in sorted(old_pins.keys() | new_pins.keys())
        if old_pins.get(k) != new_pins.get(k) and k.split(".", 1)[0] not in left_out
    ]
    if prev.suite_sha != cur.suite_sha:
        moved.insert(0, PinMove(pin="suite_sha", old=prev.suite_sha, new=cur.suite_sha))
    old_hosts = {str(h.get("name")): h for h in prev.hosts}
    new_hosts = {str(h.get("name")): h for h in cur.hosts}
    fingerprints = [
        FingerprintChange(
            host=name, old=old_hosts[name].get("fingerprint"), new=h.get("fingerprint"),
            python_old=old_hosts[name].get("python"), python_new=h.get("python"),
        )  # fmt: skip
        for name, h in new_hosts.items()
        if name in old_hosts
        and old_hosts[name].get("fingerprint") and h.get("fingerprint")
        and old_hosts[name].get("fingerprint") != h.get("fingerprint")
    ]
    for f in fingerprints:
        if runs_dir is None:
            break
        before, after = (_fingerprint(runs_dir / r.run_id, f["host"]) for r in (prev, cur))
        if before is not None and after is not None:
            f["fields"] = fingerprint_fields(before, after)
    repeat_moved = prev.repeat is not None and cur.repeat is not None and prev.repeat != cur.repeat
    return Changes(
        previous=prev.run_id,
        current=cur.run_id,
        newly_flipping=sorted((cur.flipping - prev.flipping) & both),
        stopped_flipping=sorted((prev.flipping - cur.flipping) & both),
        pins_moved=moved,
        hosts_added=[h for h in new_hosts if h not in old_hosts],
        hosts_removed=[h for h in old_hosts if h not in new_hosts],
        tasks_added=sorted(cur.tasks.keys() - prev.tasks.keys()),
        tasks_removed=sorted(prev.tasks.keys() - cur.tasks.keys()),
        repeat={"old": prev.repeat, "new": cur.repeat} if repeat_moved else None,
        fingerprints_changed=fingerprints,
    )


def compare_last(runs_dir: Path, run_dir: Path) -> list[str]:
    """Tasks of ``run_dir`` that flip now and did not in the previous run of the same suite.

    Records the run first (idempotent), so the answer never depends on whether the caller did.
    No previous run: nothing is "newly" flipping, the list is empty.
    """
    row = record_run(runs_dir, run_dir)
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


def after_replay(run_dir: Path, *, compare: bool = False) -> AfterReplay:
    """Record a finished replay in ``<its parent>/index.sqlite``; with ``compare``, what newly flips.

    An index failure never costs the run: the run dir is the source of truth and ``history --rebuild``
    recovers the index, so it comes back as a warning.
    """
    runs_dir = Path(run_dir).parent
    try:
        if compare:
            return AfterReplay(compare_last(runs_dir, run_dir))
        record_run(runs_dir, run_dir)
        return AfterReplay([])
    except CrosshostError as exc:
        if compare:
            return AfterReplay([], warning=f"--compare-last could not compare: {exc}", compared=False)
        return AfterReplay([], warning=f"history index not updated: {exc}")
