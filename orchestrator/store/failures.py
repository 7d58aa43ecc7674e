"""Scheduled replays that failed before their run started: ``<runs>/failures.jsonl``, one line each.

Such a replay has no run directory to index, so ``crosshost history`` reads these lines beside the
index. Writing one never hides the failure itself, and a torn or foreign line is skipped.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypedDict

from orchestrator.errors import CrosshostError


class FailureJson(TypedDict):
    failure: bool
    at: str
    suite: str
    exit_code: int
    reason: str


FAILURES_NAME = "failures.jsonl"
FAILURES_READ = 1000  # the newest lines of failures.jsonl that history reads


@dataclass
class Failure:
    """A scheduled replay that failed before its run started (no run directory to index)."""

    at: str  # ISO-8601 UTC
    suite: str
    exit_code: int
    reason: str  # the one line the replay printed

    def to_json(self) -> FailureJson:
        return FailureJson(failure=True, at=self.at, suite=self.suite, exit_code=self.exit_code, reason=self.reason)


def failures_path(runs_dir: Path) -> Path:
    return Path(runs_dir) / FAILURES_NAME


def _suite_name(suite_dir: Path) -> str:
    """The suite's name as its suite.toml says, else its directory's (the toml may be the failure)."""
    import tomllib

    try:
        name = tomllib.loads((suite_dir / "suite.toml").read_text(encoding="utf-8")).get("name")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        name = None
    return name if isinstance(name, str) and name else suite_dir.name


def record_failure(runs_dir: Path, suite_dir: Path, exc: CrosshostError) -> None:
    """Append ``exc``'s one line to ``<runs_dir>/failures.jsonl``, where ``crosshost history`` shows it.
    Writing it must never hide the failure itself: an error here is dropped."""
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    failure = Failure(now, _suite_name(Path(suite_dir)), exc.exit_code, exc.one_line())
    with contextlib.suppress(OSError):
        Path(runs_dir).mkdir(parents=True, exist_ok=True)
        with open(failures_path(runs_dir), "a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(failure), ensure_ascii=False) + "\n")


def failures(runs_dir: Path, suite: str | None = None, last: int | None = None) -> list[Failure]:
    """Recorded failures, oldest first (of ``suite`` only when given; the newest ``last``)."""
    try:
        lines = failures_path(runs_dir).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    found: list[Failure] = []
    for line in lines[-FAILURES_READ:]:
        try:
            d = json.loads(line)
            f = Failure(str(d["at"]), str(d["suite"]), int(d["exit_code"]), str(d["reason"]))
        except (ValueError, KeyError, TypeError):
            continue  # a torn or foreign line: the others still count
        if suite is None or f.suite == suite:
            found.append(f)
    return found[-last:] if last else found
