"""The trace: one JSONL file per task attempt per host (records in ``records.py``, docs/run-directory.md).

Reading is streaming and forgiving: ``iter_records`` yields ``(line_number, record)`` one line at a time
(bounded memory, a million-line trace is fine). A line that is not a JSON object does not raise: it is
yielded as ``{"type": "corrupt", "error": "<what is wrong>", "text": "<first 200 chars>"}`` so callers
see exactly where a trace is damaged. ``read_trace`` turns those (and records that break the schema)
into ``Trace.problems``, each ``"<file>:<line>: <what is wrong>"``; it raises ``TraceError`` only when
the file cannot be read or holds no trace at all. It also accepts the single-document form
``{"tool_calls": [{"name": ..., "args": ...}]}`` (``records.migrate_tool_calls_document``), and headers of
older schemas (``records.migrate_trace_header``).

Writing goes through ``TraceWriter``, which redacts every record before it touches the disk.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import (
    IO,
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Tuple,
    TypedDict,
    Union,
)

from .digests import HashingWriter
from .errors import TraceError
from .jsonfile import MAX_LINE_BYTES, JSONObject, JSONValue, bounded_lines, loads, open_regular, too_deep
from .model_records import CallRecord
from .recordclass import dataclass, field
from .records import (
    FINISH_REASONS,
    TRACE_SCHEMA,
    VERDICTS,
    FindingJSON,
    TraceFinish,
    TraceHeader,
    TraceTurn,
    TraceTurnJSON,
    migrate_tool_calls_document,
    migrate_trace_header,
)
from .redact import redact

if TYPE_CHECKING:
    from .trace_stream import TraceStream

PathArg = Union[str, "os.PathLike[str]"]
SCHEMA = TRACE_SCHEMA
__all__ = ["FINISH_REASONS", "SCHEMA", "VERDICTS", "CorruptLine", "Trace", "TraceRecord", "TraceWriter", "fp", "typed_records",
           "iter_observations", "iter_records", "iter_trace", "read_trace"]
# A {"tool_calls": [...]} JSON document is loaded whole; JSONL is streamed. Bigger JSON documents are refused.
_MAX_JSON_DOCUMENT = 64 * 1024 * 1024


def fp(obj: Any) -> str:
    """The 12-hex fingerprint of a JSON-able value (args_fp, obs_fp)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


def _open(path: PathArg) -> IO[str]:
    try:
        return open(path, encoding="utf-8", errors="replace", newline="")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace: {exc.strerror or exc}") from exc


# The C scanner that json.loads ends in. Called on the raw line it skips loads' Python layers (BOM
# check, two whitespace matches, the trailing-data check) - a tenth of the parse on a trace line.
_scan_once: Callable[[str, int], Tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def iter_records(path: PathArg) -> Iterator[Tuple[int, Dict[str, Any]]]:
    """Stream ``(line_number, record)``; a damaged line becomes a record of type ``"corrupt"``."""
    try:  # a FIFO or a device is refused before it is read: it would hang or never end
        handle = open_regular(path)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace: {exc.strerror or exc}") from exc
    with handle:
        for number, raw in enumerate(bounded_lines(handle), start=1):
            if raw is None:
                yield number, {"type": "corrupt", "error": f"a line longer than {MAX_LINE_BYTES} bytes", "text": ""}
                continue
            try:  # a line that is not UTF-8 is damage, never text with replacement characters
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield number, {"type": "corrupt", "error": f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                               "text": raw[:200].decode("utf-8", "replace")}
                continue
            # Fast path: one JSON value from the first character, then only whitespace. Anything else
            # (blank or indented line, trailing data, damage) goes the full way, whose answer it is.
            try:
                record, end = _scan_once(line, 0)
                if end != len(line) and not line[end:].isspace():
                    raise ValueError("trailing data")
                if too_deep(line, record):  # loads below names it
                    raise ValueError("nested too deep")
            except (StopIteration, ValueError, RecursionError):
                text = line.strip()
                if not text:
                    continue
                try:
                    record = loads(text)
                except ValueError as exc:
                    yield number, {"type": "corrupt", "error": f"not JSON ({exc.args[0] if exc.args else exc})",
                                   "text": text[:200]}
                    continue
            if not isinstance(record, dict):
                yield number, {"type": "corrupt", "error": f"a JSON {type(record).__name__}, not an object",
                               "text": line.strip()[:200]}
                continue
            yield number, record


class ObsRecord(TypedDict):
    """A record of the ``.obs.jsonl`` sidecar: one turn's raw observation (redacted)."""

    type: str  # "obs"
    step: int
    tool: str
    content: str


@dataclass
class CorruptLine:
    """A trace line that holds no record: not UTF-8, not JSON, not an object, or too long."""

    error: str
    text: str = ""


TraceRecord = Union[TraceHeader, TraceTurn, TraceFinish, CorruptLine]


def iter_trace(path: PathArg) -> Iterator[Tuple[int, TraceRecord]]:
    """``iter_records`` typed: ``(line_number, record)`` with each header, turn and finish as its class
    in ``records.py`` (an older header migrated there) and a damaged line as ``CorruptLine``. A record
    of any other type is left out; ``read_trace`` is the reader that names every problem."""
    return typed_records(iter_records(path))


def typed_records(records: Iterable[Tuple[int, Dict[str, Any]]]) -> Iterator[Tuple[int, TraceRecord]]:
    """``iter_trace``'s typing of records already read (``iter_records``'s pairs)."""
    for number, record in records:
        kind = record.get("type")
        if kind == "turn":
            yield number, TraceTurn.from_json(record)
        elif kind == "header":
            yield number, TraceHeader.from_json(record)
        elif kind == "finish":
            yield number, TraceFinish.from_json(record)
        elif kind == "corrupt":
            yield number, CorruptLine(str(record.get("error") or ""), str(record.get("text") or ""))


def iter_observations(path: PathArg) -> Iterator[Tuple[int, Union[ObsRecord, CorruptLine]]]:
    """The ``.obs.jsonl`` sidecar typed: ``(line_number, record)``, each observation an ``ObsRecord``
    (a content that is not text as its JSON) and a damaged line a ``CorruptLine``. A record of another
    type, or without an integer step, is left out."""
    for number, record in iter_records(path):
        kind = record.get("type", "obs")
        step = record.get("step")
        if kind == "corrupt":
            yield number, CorruptLine(str(record.get("error") or ""), str(record.get("text") or ""))
        elif kind == "obs" and isinstance(step, int) and not isinstance(step, bool):
            content = record.get("content")
            yield number, ObsRecord(type="obs", step=step, tool=str(record.get("tool") or ""),
                                    content=content if isinstance(content, str) else json.dumps(content, sort_keys=True))


@dataclass
class Trace:
    """A trace file read back: header, turns and finish record."""

    path: str
    header: Optional[Dict[str, Any]] = None
    turns: List[TraceTurn] = field(default_factory=list)
    finish: Optional[Dict[str, Any]] = None
    problems: List[str] = field(default_factory=list)
    form: str = "jsonl"  # "jsonl" (ours) or "seed" ({"tool_calls": [...]})


def _turn_problem(record: JSONObject) -> Optional[str]:
    """Why a turn record as read (JSON, not yet a ``TraceTurn``) is not one, or None."""
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        return "turn without a positive integer 'step'"
    if not isinstance(record.get("tool"), str) or not record.get("tool"):
        return f"turn {step} without a 'tool' name"
    if not isinstance(record.get("args"), dict):
        return f"turn {step}: 'args' is not an object"
    return None


def _looks_like_seed(path: str) -> Optional[JSONObject]:
    """The ``{"tool_calls": [...]}`` JSON form, if that is what the file holds (it may span many lines)."""
    with _open(path) as handle:
        first = handle.readline()
        try:
            doc = loads(first)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            return doc if "tool_calls" in doc and "type" not in doc else None
        if not first.lstrip().startswith("{"):
            return None
        try:
            if os.path.getsize(path) > _MAX_JSON_DOCUMENT:
                return None
        except OSError:
            return None
        handle.seek(0)
        try:
            doc = loads(handle.read())
        except ValueError:
            return None
    return doc if isinstance(doc, dict) and "tool_calls" in doc else None


def read_trace(path: PathArg) -> Trace:
    """Read a trace without ever crashing on a damaged line; see the module docstring."""
    name = os.fspath(path)
    if os.path.isdir(name):
        raise TraceError(f"{name}: is a directory, not a trace file")
    seed = _looks_like_seed(name)
    if seed is not None:
        trace = Trace(path=name, form="seed")
        trace.turns = [TraceTurn.from_json(t) for t in migrate_tool_calls_document(seed, name, trace.problems)]
        return trace

    trace = Trace(path=name)
    recognised = 0
    for number, record in iter_records(name):
        kind = record.get("type")
        where = f"{name}:{number}"
        if kind == "corrupt":
            trace.problems.append(f"{where}: {record['error']}")
        elif kind == "header":
            recognised += 1
            record = migrate_trace_header(record)
            if trace.header is not None:
                trace.problems.append(f"{where}: a second header")
            elif trace.turns or trace.finish is not None:
                trace.problems.append(f"{where}: the header is not the first record")
                trace.header = record
            else:
                trace.header = record
            if record.get("schema") != SCHEMA:
                trace.problems.append(f"{where}: schema {record.get('schema')!r}, expected {SCHEMA!r}")
        elif kind == "turn":
            recognised += 1
            problem = _turn_problem(record)
            if problem:
                trace.problems.append(f"{where}: {problem}")
                continue
            if trace.finish is not None:
                trace.problems.append(f"{where}: a turn after the finish record")
            expected = len(trace.turns) + 1
            if record["step"] != expected:
                trace.problems.append(f"{where}: step {record['step']}, expected {expected}")
            trace.turns.append(TraceTurn.from_json(record))
        elif kind == "finish":
            recognised += 1
            if trace.finish is not None:
                trace.problems.append(f"{where}: a second finish record")
                continue
            if record.get("reason") not in FINISH_REASONS:
                trace.problems.append(f"{where}: finish reason {record.get('reason')!r} is not one of "
                                      f"{', '.join(FINISH_REASONS)}")
            if record.get("verdict") not in VERDICTS:
                trace.problems.append(f"{where}: verdict {record.get('verdict')!r} is not one of "
                                      f"{', '.join(VERDICTS)}")
            trace.finish = record
        else:
            trace.problems.append(f"{where}: unknown record type {kind!r}")
    if recognised == 0:
        raise TraceError(f"{name}: not a trace (no header, turn or finish record, and not the "
                         f"{{\"tool_calls\": [...]}} form)")
    if trace.header is None:
        trace.problems.append(f"{name}: no header record")
    if trace.finish is None:
        trace.problems.append(f"{name}: no finish record (the attempt was cut short)")
    return trace


class TraceWriter:
    """Writes header/turn/finish records (``records.py``), redacting each one first.

    Raw observations go to the sidecar ``<task>.<attempt>.obs.jsonl`` (records of type ``"obs"``), so
    the trace itself stays small and ``crosshost repro`` can answer fixture tools from it. The sidecar
    is made with the first turn: an attempt without turns (a predicate-only task) has none, which
    saves the file (and its copy home) that would hold nothing.
    """

    def __init__(self, path: PathArg, obs_path: Optional[PathArg] = None, *,
                 announce_under: Optional[PathArg] = None, stream: "Optional[TraceStream]" = None) -> None:
        self.path = os.fspath(path)
        # Open for the writer's lifetime; close() (or the with-block) releases them. With
        # ``announce_under`` (the runner's out/), each file's digest is announced when it closes; with
        # ``stream`` too, both files are frames of that run's stream (trace_stream.py).
        out = Path(announce_under) if announce_under is not None else None
        self._handle = HashingWriter(out, Path(self.path), stream)
        self._out = out
        self._stream = stream
        self._obs_path = Path(obs_path) if obs_path else None
        self._obs: Optional[HashingWriter] = None
        self.steps = 0

    def _write(self, handle: HashingWriter, record: "Union[JSONObject, TraceTurnJSON, ObsRecord, Dict[str, Any]]") -> None:
        handle.write(json.dumps(redact(record), sort_keys=False, ensure_ascii=False) + "\n")
        handle.flush()

    def header(self, *, run_id: str, host: str, task: str, attempt: int, fingerprint: str,
               pins: Dict[str, Any], env_sha: Optional[str] = None, agent: Optional[str] = None,
               **extra: JSONValue) -> None:
        record = TraceHeader(run_id=run_id, host=host, task=task, attempt=attempt, fingerprint=fingerprint,
                             pins=pins, env_sha=env_sha, agent=agent, extra=extra)
        self._write(self._handle, record.to_json())

    def turn(self, *, tool: str, args: JSONObject, observation: str, error: Optional[str],
             prompt_tokens: int = 0, completion_tokens: int = 0, latency_ms: int = 0,
             reason: str = "tool_calls", model: Optional[CallRecord] = None) -> TraceTurnJSON:
        """Write one turn; returns the record as written (redacted), which is what the checker reads."""
        self.steps += 1
        safe_args = redact(args)
        safe_obs = redact(observation)
        record = TraceTurn(step=self.steps, tool=tool, args=safe_args, args_fp=fp(safe_args),
                           obs_fp=fp(safe_obs), error=redact(error), prompt_tokens=prompt_tokens,
                           completion_tokens=completion_tokens, latency_ms=latency_ms, reason=reason,
                           model=model).to_json()
        self._write(self._handle, record)
        if self._obs_path is not None:
            if self._obs is None:
                self._obs = HashingWriter(self._out, self._obs_path, self._stream)
            self._write(self._obs, {"type": "obs", "step": self.steps, "tool": tool, "content": safe_obs})
        return record  # args and observation fingerprints are already of the redacted values

    def finish(self, *, reason: str, final: str, predicate_exit: Optional[int], verdict: str, why: str,
               wall_ms: int, steps: Optional[int] = None, findings: Optional[List[FindingJSON]] = None,
               predicate_output: Optional[str] = None, **extra: Any) -> Dict[str, Any]:
        """``extra``: the agent's own finish fields (``Agent.finish_record``)."""
        record = TraceFinish(reason=reason, final=final, predicate_exit=predicate_exit, verdict=verdict,
                             why=why, wall_ms=wall_ms, steps=steps, findings=findings,
                             predicate_output=predicate_output, extra=extra).to_json()
        self._write(self._handle, record)
        return record

    def close(self) -> None:
        self._handle.close()
        if self._obs is not None:
            self._obs.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
