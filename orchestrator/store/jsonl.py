"""JSONL files of a run read as a stream of objects, a bad line named by ``file:line`` (an error,
or a problem a tolerant reader collects); ``results.jsonl`` read into ``ResultRow``s."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

from agent_runner.jsonfile import MAX_LINE_BYTES, JSONObject, bounded_lines, open_regular
from agent_runner.jsonfile import loads as json_loads
from agent_runner.records import ResultRow
from orchestrator.errors import TraceError


def iter_jsonl(
    path: Path, *, missing_ok: bool = False, on_bad_line: Callable[[str, str], None] | None = None
) -> Iterator[tuple[str, JSONObject]]:
    """The JSON objects of a JSONL file, streamed as (``file:line``, object); blank lines are skipped.

    A line that is not UTF-8, not JSON or not an object is a TraceError naming file and line, unless
    ``on_bad_line(where, why)`` takes it and reading goes on (tolerant readers collect problems).
    A missing file holds nothing with ``missing_ok``; otherwise it is unreadable, like any OSError.
    """
    try:  # a FIFO or a device is refused before it is read: it would hang or never end
        fh = open_regular(path)
    except OSError as exc:
        if missing_ok and isinstance(exc, FileNotFoundError):
            return
        why = f"cannot read: {exc.strerror or exc}"
        if on_bad_line is None:
            raise TraceError(f"{path}: {why}") from exc
        on_bad_line(str(path), why)
        return
    with fh:
        for lineno, raw in enumerate(bounded_lines(fh), 1):
            where = f"{path}:{lineno}"
            row, why = _jsonl_row(raw)
            if row is not None:
                yield where, row
            elif why:
                if on_bad_line is None:
                    raise TraceError(f"{where}: {why}")
                on_bad_line(where, why)


def _jsonl_row(raw: bytes | None) -> tuple[JSONObject | None, str]:
    """One JSONL line as (object, "") or (None, why it is not one); (None, "") for a blank line."""
    if raw is None:
        return None, f"a line longer than {MAX_LINE_BYTES} bytes"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    if not line.strip():
        return None, ""
    try:
        row = json_loads(line)
    except json.JSONDecodeError as exc:
        return None, f"not JSON ({exc.msg})"
    return (row, "") if isinstance(row, dict) else (None, "expected a JSON object")


def read_jsonl(path: Path) -> list[JSONObject]:
    """Rows of a JSONL file (none when it is missing); a bad line is a TraceError naming file:line."""
    return [row for _, row in iter_jsonl(path, missing_ok=True)]


def iter_results(
    path: Path, *, missing_ok: bool = False, on_bad_line: Callable[[str, str], None] | None = None
) -> Iterator[tuple[str, ResultRow]]:
    """The rows of a ``results.jsonl`` of any known shape, as (``file:line``, row). A line that is not
    a row is a TraceError naming file and line, or goes to ``on_bad_line`` (as in ``iter_jsonl``)."""
    for where, obj in iter_jsonl(path, missing_ok=missing_ok, on_bad_line=on_bad_line):
        try:
            row = ResultRow.from_json(obj)
        except TraceError as exc:
            if on_bad_line is None:
                raise TraceError(f"{where}: {exc}") from exc
            on_bad_line(where, str(exc))
            continue
        yield where, row
