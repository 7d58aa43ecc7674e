"""The run directory ``runs/<run_id>/``: the one module that creates, writes and reads it (what its
records are is ``store/records.py``, how its JSONL files are read ``store/jsonl.py``).

Layout and every file's fields: docs/run-directory.md. Writing is atomic (a temporary name, then a
rename), so a crash or Ctrl-C never leaves half a manifest; a run id is a sortable UTC timestamp plus
a random suffix and its directory is created exclusively, so two concurrent replays never share one.

The runner's records (trace header/turn/finish, results row, fingerprint) are ``agent_runner.records``;
the controller's own file, ``manifest.json``, is ``Manifest`` in ``store/records.py``. Old shapes are
accepted in one place each: ``migrate_manifest`` there, and the ``migrate_*`` functions of ``agent_runner.records``
(which every ``from_json`` applies). No reader anywhere else knows an old key name.

``load_run`` reads everything the analysis needs, tolerantly: a missing or unreadable contract or
fingerprint, or a bad results row, is a recorded problem (it makes the run invalid, and the report
must say so), not an exception. Only a directory without a readable manifest is not a run (exit 2).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import secrets
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent_runner.jsonfile import JSONObject, decode_text, read_regular
from agent_runner.jsonfile import loads as json_loads
from agent_runner.records import Fingerprint, ResultRow, TraceHeader
from agent_runner.suite import MAX_REPEAT
from agent_runner.trace import iter_trace
from orchestrator.errors import CrosshostError, InputError, TraceError, not_the_record
from orchestrator.store.jsonl import iter_results
from orchestrator.store.records import HostRecord, Manifest, ReproRecord, migrate_manifest

_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

AttemptKey = tuple[str, str, int]  # (host, task, attempt)


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_utc(value: object) -> _dt.datetime | None:
    """A manifest timestamp (ISO-8601, ``Z`` or an offset; naive means UTC) as an aware datetime;
    None when it is not one."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=_dt.UTC)


def new_run_id(now: _dt.datetime | None = None) -> str:
    """``20250102T030405Z-1a2b3c``: sorts by time; the suffix keeps simultaneous runs apart."""
    now = now or _dt.datetime.now(_dt.UTC)
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"


def write_bytes_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any, *, sort_keys: bool = True) -> None:
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=sort_keys) + "\n").encode())




def _read_json_object(path: Path) -> tuple[JSONObject | None, str | None]:
    """(object, None) or (None, why) — why names the file."""
    try:
        text = decode_text(read_regular(path, follow_links=False))
    except FileNotFoundError:
        return None, f"{path}: missing"
    except UnicodeDecodeError as exc:
        return None, f"{path}: cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})"
    except OSError as exc:
        return None, f"{path}: cannot read: {exc.strerror or exc}"
    try:
        obj = json_loads(text)
    except json.JSONDecodeError as exc:
        return None, f"{path}:{exc.lineno}: not JSON: {exc.msg}"
    if not isinstance(obj, dict):
        return None, f"{path}: must hold a JSON object"
    return obj, None


# --- the directory ------------------------------------------------------------------------------------


class RunDir:
    """One ``runs/<run_id>/`` directory: where each file lives, writing it, reading it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.run_id = self.path.name

    @classmethod
    def create(cls, out_root: Path, run_id: str | None = None) -> RunDir:
        try:
            out_root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"{out_root}: cannot create the runs directory ({exc.strerror or exc}); check --out") from exc
        for _ in range(20):
            rid = run_id or new_run_id()
            try:
                (out_root / rid).mkdir()  # exclusive: an existing directory is never reused
            except FileExistsError as exc:
                if run_id is not None:
                    raise CrosshostError(f"{out_root / rid}: run directory exists already") from exc
                continue
            return cls(out_root / rid)
        raise CrosshostError(f"{out_root}: could not allocate a fresh run directory")

    # where things are

    @property
    def manifest_path(self) -> Path:
        return self.path / "manifest.json"

    @property
    def results_path(self) -> Path:
        return self.path / "results.jsonl"

    @property
    def contract_path(self) -> Path:
        return self.path / "contract.json"

    @property
    def model_hold_path(self) -> Path:
        """A held model's summary: what was held, what diverged (orchestrator/model/hold.py)."""
        return self.path / "model_hold.json"

    @property
    def model_record_path(self) -> Path:
        """A held model's record: the reference host's model exchanges, per task and attempt."""
        return self.path / "model_record.jsonl"

    @property
    def explain_path(self) -> Path:
        """``crosshost explain``'s evidence per flipped task (orchestrator/commands/explain.py)."""
        return self.path / "explain.json"

    @property
    def explain_runs(self) -> Path:
        """Where ``crosshost explain`` keeps the run directories of its own replays."""
        return self.path / "explain"

    def host_dir(self, host: str) -> Path:
        if not _HOST_NAME.match(host):
            raise CrosshostError(f"host name {host!r} is not usable as a directory name")
        return self.path / "hosts" / host

    def trace_path(self, host: str, task: str, attempt: int) -> Path:
        return self.host_dir(host) / "traces" / f"{task}.{attempt}.jsonl"

    def fingerprint_path(self, host: str) -> Path:
        return self.host_dir(host) / "fingerprint.json"

    def host_results_path(self, host: str) -> Path:
        """The rows one host's runner sent, until the replay merges them into ``results.jsonl``."""
        return self.host_dir(host) / "results.jsonl"

    # writing

    def write_manifest(self, manifest: Manifest) -> None:
        # Unsorted: ``hosts`` keeps inventory order (the first is the reference).
        write_json_atomic(self.manifest_path, manifest.dump(), sort_keys=False)

    def write_contract(self, contract_json: bytes) -> None:
        write_bytes_atomic(self.contract_path, contract_json)

    def write_results(self, rows: Iterable[ResultRow]) -> None:
        data = "".join(json.dumps(r.to_json(), sort_keys=True) + "\n" for r in rows)
        write_bytes_atomic(self.results_path, data.encode())

    def write_fingerprint(self, host: str, fingerprint: Fingerprint) -> None:
        write_json_atomic(self.fingerprint_path(host), fingerprint.to_json())

    # reading

    def read_manifest(self) -> Manifest:
        """The manifest, migrated; a directory without a readable one is not a run (InputError)."""
        data, problem = _read_json_object(self.manifest_path)
        if data is None:
            raise InputError(f"{problem}; is {self.path} a crosshost run directory (runs/<run_id>/)?")
        try:
            return Manifest.model_validate(migrate_manifest(data, self.path))
        except ValidationError as exc:
            raise not_the_record(self.manifest_path, exc) from exc

    @property
    def repro_path(self) -> Path:
        """``crosshost repro``'s record (orchestrator/commands/repro.py)."""
        return self.path / "repro.json"

    def read_repro(self) -> ReproRecord | None:
        """``repro.json``, or None when the run is not a reproduction; a damaged one is an InputError."""
        if not self.repro_path.exists():
            return None
        data, problem = _read_json_object(self.repro_path)
        if data is None:
            raise InputError(str(problem))
        try:
            return ReproRecord.model_validate(data)
        except ValidationError as exc:
            raise not_the_record(self.repro_path, exc) from exc

    def read_contract(self) -> tuple[JSONObject | None, str | None]:
        """(contract, None) or (None, why it is not usable)."""
        return _read_json_object(self.contract_path)

    def read_fingerprint(self, host: str) -> tuple[Fingerprint | None, str | None]:
        """(fingerprint, None) or (None, why it is not usable)."""
        data, problem = _read_json_object(self.path / "hosts" / host / "fingerprint.json")
        return (Fingerprint.from_json(data), None) if data is not None else (None, problem)

    def iter_results(
        self, on_bad_line: Callable[[str, str], None] | None = None
    ) -> Iterator[tuple[str, ResultRow]]:
        return iter_results(self.results_path, missing_ok=True, on_bad_line=on_bad_line)

    def hosts_on_disk(self) -> list[str]:
        hosts_dir = self.path / "hosts"
        return sorted(p.name for p in hosts_dir.iterdir() if p.is_dir()) if hosts_dir.is_dir() else []

    def trace_files(self) -> Iterator[tuple[AttemptKey, Path]]:
        """Every ``hosts/<host>/traces/<task>.<attempt>.jsonl``; sidecars and strays are skipped."""
        for host in self.hosts_on_disk():
            traces = self.path / "hosts" / host / "traces"
            try:  # names, not paths, listed and sorted: a replay lists every trace four times
                names = sorted(e.name for e in os.scandir(traces) if e.name.endswith(".jsonl"))
            except OSError:  # no traces directory (a host that sent none), or not one that can be read
                continue
            for name in names:
                task, _, attempt = name[: -len(".jsonl")].rpartition(".")
                if task and attempt.isdigit():
                    yield (host, task, int(attempt)), traces / name

    def trace_pins(self, hosts: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Per task, the pins of the first host (in ``hosts`` order) whose trace header has them."""
        pins: dict[str, dict[str, Any]] = {}
        order = {h: i for i, h in enumerate(hosts)}
        for (host, task, _), path in sorted(self.trace_files(), key=lambda kv: order.get(kv[0][0], len(order))):
            if host not in order or task in pins:
                continue
            header = _trace_header(path)
            if header is not None and header.pins:
                pins[task] = header.pins
        return pins


def _trace_header(path: Path) -> TraceHeader | None:
    """A trace's header (its first record, an older schema's migrated), or None without one."""
    try:
        for _, record in iter_trace(path):
            return record if isinstance(record, TraceHeader) else None
    except (TraceError, OSError):
        pass
    return None


# --- a run, read for analysis -------------------------------------------------------------------------


@dataclass
class Run:
    """Everything the analysis reads of one run directory (``load_run``)."""

    dir: RunDir
    manifest: Manifest
    hosts: list[str]
    reference: str | None
    contract: JSONObject | None  # contract.json as stored: the checker narrows each key it reads
    contract_problem: str | None
    fingerprints: dict[str, Fingerprint] = field(default_factory=dict)
    fingerprint_problems: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.dir.path

    @property
    def run_id(self) -> str:
        return self.manifest.run_id

    @property
    def gate(self) -> float | None:
        return self.manifest.gate

    @property
    def alpha(self) -> float | None:
        """The run's significance level, when it names a usable one (strictly between 0 and 1)."""
        alpha = self.manifest.alpha
        return alpha if alpha is not None and 0 < alpha < 1 else None

    @property
    def sampled(self) -> set[str]:
        return set(self.manifest.sampled)

    def host_record(self, host: str) -> HostRecord | None:
        return self.manifest.hosts.get(host)

    def outside_manifest(self, key: AttemptKey) -> str | None:
        """Why an attempt a host sent is none the run asked for (its task is not in the manifest, its
        number is past the repeat), else None. Hosts name attempts; the manifest bounds them: a
        trace named ``t.3000000.jsonl`` must not make the analysis build three million rows."""
        _, task, attempt = key
        first = self.manifest.first_attempt
        repeat = self.manifest.task_repeat.get(task) or self.manifest.repeat or MAX_REPEAT
        if attempt >= first + repeat:
            return f"attempt {attempt} of {task} is past the run's {first + repeat} attempt(s); not counted"
        if attempt < first:
            return f"attempt {attempt} of {task} is before this round's first attempt {first}; not counted"
        if self.manifest.tasks and task not in self.manifest.tasks:
            return f"task {task!r} is not one the run asked for; not counted"
        return None

    def trace_files(self) -> Iterator[tuple[AttemptKey, Path]]:
        """The traces of attempts the manifest asked for; any other is a problem, not a row."""
        for key, path in self.dir.trace_files():
            why = self.outside_manifest(key)
            if why is None:
                yield key, path
            else:
                self.problems.append(f"{path}: {why}")

    def results(self) -> dict[AttemptKey, ResultRow]:
        """``results.jsonl`` rows by (host, task, attempt); a bad row, or one of an attempt the
        manifest did not ask for, is a problem, not a crash and not a row."""

        def problem(where: str, why: str) -> None:
            self.problems.append(f"{where}: {why}")

        rows: dict[AttemptKey, ResultRow] = {}
        for where, r in self.dir.iter_results(on_bad_line=problem):
            key = (r.env, r.task, r.attempt)
            outside = self.outside_manifest(key)
            if outside is None:
                rows[key] = r
            else:
                problem(where, outside)
        return rows


def load_run(path: Path) -> Run:
    """Read ``runs/<run_id>/`` for analysis; InputError (exit 2) only when it holds no readable manifest."""
    rundir = RunDir(path)
    manifest = rundir.read_manifest()
    hosts = list(manifest.hosts)
    for entry in manifest.inventory.get("hosts") or []:
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str) and name not in hosts:
            hosts.append(name)
    # hosts with traces the manifest forgot still get analysed
    hosts += [h for h in rundir.hosts_on_disk() if h not in hosts]
    reference = manifest.reference or (hosts[0] if hosts else None)
    if reference is not None and reference not in hosts:
        hosts.insert(0, reference)
    contract, contract_problem = rundir.read_contract()
    run = Run(rundir, manifest, hosts, reference, contract, contract_problem)
    for host in hosts:
        fingerprint, problem = rundir.read_fingerprint(host)
        if fingerprint is not None:
            run.fingerprints[host] = fingerprint
        elif problem is not None:
            run.fingerprint_problems[host] = problem
    return run
