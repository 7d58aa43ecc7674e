"""The run directory: ``runs/<run_id>/`` (docs/run-directory.md), written atomically.

Every file is written to a temporary name and renamed, so a crash or Ctrl-C never leaves half a
manifest; a run id is a sortable UTC timestamp plus a random suffix and its directory is created
exclusively, so two concurrent replays never share one.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import secrets
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.errors import CrosshostError, InputError, TraceError

MANIFEST_SCHEMA = "crosshost.manifest/1"
_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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


class SuiteRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    sha: str
    path: str


class HostRecord(BaseModel):
    """What happened on one host. ``reachable`` false means no verdict of it is the agent's."""

    model_config = ConfigDict(extra="forbid")
    reachable: bool = False
    error: str | None = None
    fingerprint: str | None = None
    python: str | None = None
    bundle_pushed: bool | None = None
    runner_exit: int | None = None
    workspace_removed: bool | None = None
    stages: dict[str, float] = Field(default_factory=dict)  # stage -> seconds


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_: str = Field(default=MANIFEST_SCHEMA, alias="schema")
    run_id: str
    kind: str = "replay"
    started: str
    finished: str | None = None
    suite: SuiteRef
    bundle_sha: str | None = None
    runner_sha: str | None = None
    gate: float | None = None
    alpha: float | None = None  # the suite's [gate] alpha: significance of a host difference
    sampled: list[str] = Field(default_factory=list)  # tasks whose agent is sampled
    tasks: list[str] = Field(default_factory=list)
    repeat: int = 1
    pins: dict[str, Any] = Field(default_factory=dict)
    inventory: dict[str, Any] = Field(default_factory=dict)
    reference: str
    crosshost_version: str
    retries: list[dict[str, Any]] = Field(default_factory=list)
    hosts: dict[str, HostRecord] = Field(default_factory=dict)
    interrupted: bool = False

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


class RunDir:
    """One ``runs/<run_id>/`` directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.run_id = path.name

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
            except FileExistsError:
                if run_id is not None:
                    raise CrosshostError(f"{out_root / rid}: run directory exists already") from None
                continue
            return cls(out_root / rid)
        raise CrosshostError(f"{out_root}: could not allocate a fresh run directory")

    @property
    def manifest_path(self) -> Path:
        return self.path / "manifest.json"

    @property
    def results_path(self) -> Path:
        return self.path / "results.jsonl"

    def host_dir(self, host: str) -> Path:
        if not _HOST_NAME.match(host):
            raise CrosshostError(f"host name {host!r} is not usable as a directory name")
        return self.path / "hosts" / host

    def write_manifest(self, manifest: Manifest) -> None:
        # Unsorted: ``hosts`` keeps inventory order (the first is the reference).
        write_json_atomic(self.manifest_path, manifest.dump(), sort_keys=False)

    def write_contract(self, contract_json: bytes) -> None:
        write_bytes_atomic(self.path / "contract.json", contract_json)

    def write_results(self, rows: Iterable[dict[str, Any]]) -> None:
        data = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
        write_bytes_atomic(self.results_path, data.encode())


def load_manifest(run_dir: Path) -> Manifest:
    path = run_dir / "manifest.json"
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise TraceError(f"{path}: no manifest; is {run_dir} a crosshost run directory?") from None
    except ValueError as exc:
        raise TraceError(f"{path}: not a valid crosshost manifest ({exc})") from exc


def iter_jsonl(
    path: Path, *, missing_ok: bool = False, on_bad_line: Callable[[str, str], None] | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The JSON objects of a JSONL file, streamed as (``file:line``, object); blank lines are skipped.

    A line that is not UTF-8, not JSON or not an object is a TraceError naming file and line, unless
    ``on_bad_line(where, why)`` takes it and reading goes on (tolerant readers collect problems).
    A missing file holds nothing with ``missing_ok``; otherwise it is unreadable, like any OSError.
    """
    try:
        fh = Path(path).open("rb")  # noqa: SIM115 -- closed by the `with fh` below; opening errors differ
    except OSError as exc:
        if missing_ok and isinstance(exc, FileNotFoundError):
            return
        why = f"cannot read: {exc.strerror or exc}"
        if on_bad_line is None:
            raise TraceError(f"{path}: {why}") from exc
        on_bad_line(str(path), why)
        return
    with fh:
        for lineno, raw in enumerate(fh, 1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                why = "not UTF-8 text"
            else:
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    why = f"not JSON ({exc.msg})"
                else:
                    if isinstance(row, dict):
                        yield where, row
                        continue
                    why = "expected a JSON object"
            if on_bad_line is None:
                raise TraceError(f"{where}: {why}")
            on_bad_line(where, why)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file (none when it is missing); a bad line is a TraceError naming file:line."""
    return [row for _, row in iter_jsonl(path, missing_ok=True)]
