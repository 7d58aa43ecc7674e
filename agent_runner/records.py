"""The records the runner writes, typed: trace header, turn and finish, the results row, the fingerprint.

Each record has ``to_json`` (the exact object written to disk) and ``from_json`` (which accepts
today's shape and every older one). Old shapes become today's in ONE place, the ``migrate_*``
functions below; nothing else in crosshost knows an old key name. docs/run-directory.md describes
every field and what is migrated.

Format versions: a trace header carries ``schema`` (``TRACE_SCHEMA``); results rows and
fingerprints carry none and are recognised by their keys.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, TypedDict

from .errors import TraceError
from .jsonfile import JSONObject, JSONValue, int_or_none, str_or_none
from .model_records import CallRecord, call_record_of
from .recordclass import dataclass, field, fields

TRACE_SCHEMA = "crosshost.trace/2"
#: /1 named the runner's source digest ``pins.runner_sha``; /2 calls it ``pins.runner_source_sha``
OLD_TRACE_SCHEMAS = ("crosshost.trace/1",)
FINISH_REASONS = ("stop", "budget_steps", "budget_bytes", "budget_model", "model_diverged", "timeout",
                  "agent_error")
VERDICTS = ("pass", "fail", "error")
#: the pin holding the digest of the runner's own sources (the zipapp's digest is the manifest's)
RUNNER_SOURCE_PIN = "runner_source_sha"


# --- the one migration step ------------------------------------------------------------------------

# Keys other tools (and earlier crosshost versions) used for the fingerprint's digest, most likely first.
_DIGEST_ALIASES = ("fingerprint", "id", "digest", "sha", "env_sha")


def migrate_pins(pins: Mapping[str, JSONValue]) -> JSONObject:
    """A task's pins as written today: ``runner_sha`` (trace /1) is ``runner_source_sha``."""
    out = dict(pins)
    if "runner_sha" in out and RUNNER_SOURCE_PIN not in out:
        out[RUNNER_SOURCE_PIN] = out.pop("runner_sha")
    return out


def migrate_trace_header(record: Mapping[str, JSONValue]) -> JSONObject:
    """A header of an older trace schema as today's (a header of an unknown schema is left as is)."""
    out = dict(record)
    if out.get("schema") in OLD_TRACE_SCHEMAS:
        out["schema"] = TRACE_SCHEMA
        pins = out.get("pins")
        if isinstance(pins, dict):
            out["pins"] = migrate_pins(pins)
    return out


def migrate_result_row(row: Mapping[str, Any]) -> Dict[str, Any]:
    """A results row of any known shape as today's.

    Rows other tools write (crosshost's first format among them) name the host ``host`` instead of
    ``env``, may carry only ``passed`` (a boolean, or 0/1) instead of ``verdict``, and no ``attempt``
    (one run each)."""
    out = dict(row)
    if "env" not in out and "host" in out:
        out["env"] = out.pop("host")
    if out.get("verdict") is None and "passed" in out:
        passed = out["passed"]
        if isinstance(passed, bool) or passed in (0, 1):
            out["verdict"] = "pass" if passed else "fail"
    out.setdefault("attempt", 0)
    return out


def migrate_fingerprint(data: Mapping[str, Any]) -> Dict[str, Any]:
    """A fingerprint.json of any known shape as today's: the digest under ``fingerprint`` (others
    wrote ``id``, ``digest``, ``sha`` or ``env_sha``) and ``python`` as ``"<implementation> <version>"``
    (others wrote ``{"implementation": ..., "version": ...}``). One written before the machine
    identity has none (``machine_identity_complete`` false): it is never taken for the same machine."""
    out = dict(data)
    if not (isinstance(out.get("fingerprint"), str) and out["fingerprint"]):
        for key in _DIGEST_ALIASES[1:]:
            value = out.get(key)
            if isinstance(value, str) and value:
                out["fingerprint"] = value
                break
    for key in _DIGEST_ALIASES[1:]:
        out.pop(key, None)
    if "machine_identity" not in out:
        out["machine_identity_complete"] = False
    python = out.get("python")
    if isinstance(python, dict):
        parts = [str(python[k]) for k in ("implementation", "version") if python.get(k)]
        out["python"] = " ".join(parts) or None
    return out


def migrate_tool_calls_document(doc: Mapping[str, JSONValue], path: str, problems: List[str]) -> List[TurnCall]:
    """A single-document trace ``{"tool_calls": [{"name", "args"}]}`` as turn records
    (steps 1..n). OpenAI-style ``arguments`` (a JSON string) and ``tool`` for ``name`` are accepted;
    a call that cannot be read is a problem ``<file>:tool_calls[i]: ...`` and is left out."""
    calls = doc.get("tool_calls")
    if not isinstance(calls, list):
        raise TraceError(f"{path}: 'tool_calls' is not a list")
    turns: List[TurnCall] = []
    for index, call in enumerate(calls):
        if not isinstance(call, dict):
            problems.append(f"{path}:tool_calls[{index}]: not an object")
            continue
        name = call.get("name", call.get("tool"))
        args = call.get("args", call.get("arguments", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                problems.append(f"{path}:tool_calls[{index}]: 'arguments' is not JSON")
                args = {}
        if not isinstance(name, str) or not name:
            problems.append(f"{path}:tool_calls[{index}]: no tool name")
            continue
        if not isinstance(args, dict):
            problems.append(f"{path}:tool_calls[{index}]: args is not an object")
            args = {}
        turns.append({"step": len(turns) + 1, "tool": name, "args": args})
    return turns


#: per record class, the keys its fields read (and "type"): built at its first record, not at every one
_READ_KEYS: Dict[Any, "frozenset[str]"] = {}


def _extra(obj: Mapping[str, JSONValue], known: Any) -> JSONObject:
    names = _READ_KEYS.get(known)
    if names is None:
        names = _READ_KEYS[known] = frozenset({f.name for f in fields(known)} | {"type"})
    return {k: v for k, v in obj.items() if k not in names}


def _where(where: str) -> str:
    return f"{where}: " if where else ""


# --- trace records ---------------------------------------------------------------------------------


class TurnCall(TypedDict):
    """A trace turn's call, checked when read (``trace.read_trace``): what the contract checker and
    golden scoring read of a turn."""

    step: int
    tool: str
    args: JSONObject


class _FindingJSONBase(TypedDict):
    kind: str
    message: str
    step: Optional[int]
    tool: Optional[str]


class FindingJSON(_FindingJSONBase, total=False):
    """One of the finish record's ``findings`` (``checker.Finding``); a leak rule's carry ``rule``,
    ``evidence`` and ``weak``."""

    rule: str
    evidence: str
    weak: bool


def finding_of(value: JSONValue) -> Optional[FindingJSON]:
    """A finding as read back (None: not an object); fields of the wrong type read as empty."""
    if not isinstance(value, dict):
        return None
    found: FindingJSON = {"kind": str_or_none(value.get("kind")) or "", "message": str_or_none(value.get("message")) or "",
                          "step": int_or_none(value.get("step")), "tool": str_or_none(value.get("tool"))}
    if "rule" in value:
        found["rule"] = str_or_none(value["rule"]) or ""
    if "evidence" in value:
        found["evidence"] = str_or_none(value["evidence"]) or ""
    if "weak" in value:
        found["weak"] = value["weak"] is True
    return found


class _TurnJSONBase(TurnCall):
    type: str  # "turn"
    role: str
    args_fp: str
    obs_fp: str
    error: Optional[str]
    prompt_tokens: int
    completion_tokens: int
    latency_ms: int
    reason: str


class TraceTurnJSON(_TurnJSONBase, total=False):
    """A turn record as written."""

    model: CallRecord


@dataclass
class TraceHeader:
    """The first record of a trace: which attempt of which task on which host, and what it ran with."""

    run_id: str
    host: str
    task: str
    attempt: int
    fingerprint: str
    pins: Dict[str, Any]
    env_sha: Optional[str] = None
    agent: Optional[str] = None
    schema: str = TRACE_SCHEMA
    #: the runner's ``dirs`` (the attempt's directories) and any field another tool's header holds
    extra: JSONObject = field(default_factory=dict)

    def to_json(self) -> JSONObject:
        """The header as written: its fields, then ``extra``'s."""
        record: JSONObject = {"type": "header", "schema": self.schema, "run_id": self.run_id,
                                  "host": self.host, "task": self.task, "attempt": self.attempt,
                                  "fingerprint": self.fingerprint, "pins": self.pins}
        if self.env_sha is not None:
            record["env_sha"] = self.env_sha
        if self.agent is not None:
            record["agent"] = self.agent
        record.update(self.extra)
        return record

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "TraceHeader":
        """Lenient: a field of the wrong type reads as empty; the trace reader reports the schema."""
        data = migrate_trace_header(obj)
        pins = data.get("pins")
        return cls(run_id=str(data.get("run_id") or ""), host=str(data.get("host") or ""),
                   task=str(data.get("task") or ""), attempt=int_or_none(data.get("attempt")) or 0,
                   fingerprint=str(data.get("fingerprint") or ""),
                   pins=pins if isinstance(pins, dict) else {}, env_sha=str_or_none(data.get("env_sha")),
                   agent=str_or_none(data.get("agent")), schema=str_or_none(data.get("schema")) or "",
                   extra=_extra(data, cls))


@dataclass
class TraceTurn:
    """One tool call of the agent and what came back (fingerprinted; the raw observation is in the
    ``.obs.jsonl`` sidecar). ``model`` is the openai agent's request record, when there is one."""

    step: int
    tool: str
    args: JSONObject
    args_fp: str
    obs_fp: str
    error: Optional[str] = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: int = 0
    reason: str = "tool_calls"
    role: str = "assistant"
    model: Optional[CallRecord] = None

    def to_json(self) -> TraceTurnJSON:
        record: TraceTurnJSON = {"type": "turn", "step": self.step, "role": self.role, "tool": self.tool,
                                  "args": self.args, "args_fp": self.args_fp, "obs_fp": self.obs_fp,
                                  "error": self.error, "prompt_tokens": self.prompt_tokens,
                                  "completion_tokens": self.completion_tokens,
                                  "latency_ms": self.latency_ms, "reason": self.reason}
        if self.model is not None:
            record["model"] = self.model
        return record

    def call(self) -> TurnCall:
        return {"step": self.step, "tool": self.tool, "args": self.args}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "TraceTurn":
        args = obj.get("args")
        model = obj.get("model")
        return cls(step=int_or_none(obj.get("step")) or 0, tool=str(obj.get("tool") or ""),
                   args=args if isinstance(args, dict) else {}, args_fp=str(obj.get("args_fp") or ""),
                   obs_fp=str(obj.get("obs_fp") or ""), error=str_or_none(obj.get("error")),
                   prompt_tokens=int_or_none(obj.get("prompt_tokens")) or 0,
                   completion_tokens=int_or_none(obj.get("completion_tokens")) or 0,
                   latency_ms=int_or_none(obj.get("latency_ms")) or 0, reason=str(obj.get("reason") or "tool_calls"),
                   role=str(obj.get("role") or "assistant"), model=call_record_of(model))


@dataclass
class TraceFinish:
    """The last record: why the attempt ended and its verdict. ``extra`` holds the agent's own
    finish fields (the openai agent's usage and model)."""

    reason: str
    final: str
    predicate_exit: Optional[int]
    verdict: str
    why: str
    wall_ms: int
    steps: Optional[int] = None
    findings: Optional[List[FindingJSON]] = None
    #: the predicate's output (its last bytes, capped by the runner), for a pass as for a fail
    predicate_output: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> Dict[str, Any]:
        record: Dict[str, Any] = {"type": "finish", "reason": self.reason, "final": self.final,
                                  "predicate_exit": self.predicate_exit, "verdict": self.verdict,
                                  "why": self.why, "wall_ms": self.wall_ms}
        if self.steps is not None:
            record["steps"] = self.steps
        if self.findings is not None:
            record["findings"] = self.findings
        if self.predicate_output is not None:
            record["predicate_output"] = self.predicate_output
        record.update(self.extra)
        return record

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "TraceFinish":
        findings = obj.get("findings")
        return cls(reason=str(obj.get("reason") or ""), final=str(obj.get("final") or ""),
                   predicate_exit=int_or_none(obj.get("predicate_exit")), verdict=str(obj.get("verdict") or ""),
                   why=str(obj.get("why") or ""), wall_ms=int_or_none(obj.get("wall_ms")) or 0,
                   steps=int_or_none(obj.get("steps")),
                   findings=[f for f in map(finding_of, findings) if f is not None] if isinstance(findings, list) else None,
                   predicate_output=str_or_none(obj.get("predicate_output")), extra=_extra(obj, cls))


# --- results.jsonl ---------------------------------------------------------------------------------


class _ResultRowJSONBase(TypedDict):
    run_id: Optional[str]
    task: str
    env: str
    env_sha: Optional[str]
    attempt: int
    exit_code: Optional[int]
    passed: bool
    wall_ms: int
    verdict: str
    reason: str
    fingerprint: Optional[str]


class ResultRowJSON(_ResultRowJSONBase, total=False):
    """A ``results.jsonl`` line as written."""

    why: str


@dataclass
class ResultRow:
    """One line of ``results.jsonl``: one attempt of one task on one host (``env``).

    ``passed`` is written for tools that read only it; it is ``verdict == "pass"``. The controller's
    rows for attempts a host never delivered have ``env_sha``/``exit_code`` null and no ``why``."""

    task: str
    env: str
    attempt: int
    verdict: str
    reason: str = ""
    run_id: Optional[str] = None
    env_sha: Optional[str] = None
    exit_code: Optional[int] = None
    wall_ms: int = 0
    fingerprint: Optional[str] = None
    why: Optional[str] = None

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_json(self) -> "ResultRowJSON":
        row: ResultRowJSON = {"run_id": self.run_id, "task": self.task, "env": self.env,
                               "env_sha": self.env_sha, "attempt": self.attempt, "exit_code": self.exit_code,
                               "passed": self.passed, "wall_ms": self.wall_ms, "verdict": self.verdict,
                               "reason": self.reason, "fingerprint": self.fingerprint}
        if self.why is not None:
            row["why"] = self.why
        return row

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str = "") -> "ResultRow":
        """Any known shape (see ``migrate_result_row``); a row that names no task, host, verdict or
        attempt is a TraceError starting with ``where`` (``file:line``)."""
        row = migrate_result_row(obj)
        at = _where(where)
        for key in ("task", "env"):
            if not isinstance(row.get(key), str):
                raise TraceError(f"{at}row lacks the string field {key!r}")
        verdict = row.get("verdict")
        if verdict is None:
            raise TraceError(f"{at}row has neither 'verdict' nor a boolean 'passed'")
        if verdict not in VERDICTS:
            raise TraceError(f"{at}verdict must be pass, fail or error, not {verdict!r}")
        attempt = int_or_none(row.get("attempt"))
        if attempt is None or attempt < 0:
            raise TraceError(f"{at}attempt must be a non-negative integer, not {row.get('attempt')!r}")
        return cls(task=row["task"], env=row["env"], attempt=attempt, verdict=str(verdict),
                   reason=str_or_none(row.get("reason")) or "", run_id=str_or_none(row.get("run_id")),
                   env_sha=str_or_none(row.get("env_sha")), exit_code=int_or_none(row.get("exit_code")),
                   wall_ms=int_or_none(row.get("wall_ms")) or 0, fingerprint=str_or_none(row.get("fingerprint")),
                   why=str_or_none(row.get("why")))


# --- fingerprint.json ------------------------------------------------------------------------------


@dataclass
class Fingerprint:
    """What a host is, as far as an agent run can tell (``fingerprint.collect`` fills it).

    ``fingerprint`` is the 16-hex digest of every other field but ``captured_at``. Fields a newer
    runner adds are kept in ``extra`` and written back unchanged."""

    fingerprint: Optional[str] = None
    hostname: Optional[str] = None
    platform: Optional[str] = None
    machine: Optional[str] = None
    python: Optional[str] = None  # "CPython 3.11.2"
    python_executable: Optional[str] = None
    cwd: Optional[str] = None
    cwd_exists: Optional[bool] = None
    #: the type of the file system the attempts work on ("tmpfs": a root runner's, agent_runner/attempt_memory.py)
    cwd_fs: Optional[str] = None
    user_home_in_cwd: Optional[bool] = None
    env_keys: List[str] = field(default_factory=list)
    #: the runner's PATH, which an attempt starts from when the allowlist passes PATH (None: it had none)
    path: Optional[str] = None
    has_local_dotenv: Optional[bool] = None
    cpu_count: Optional[int] = None
    locale: Dict[str, Any] = field(default_factory=dict)
    tz: Dict[str, Any] = field(default_factory=dict)
    uid: Optional[int] = None
    home: Optional[str] = None
    tool_versions: Dict[str, Optional[str]] = field(default_factory=dict)
    findings: List[Dict[str, str]] = field(default_factory=list)
    #: how attempts are kept from the runner here: "pidns+uid", "pidns" or "none" (agent_runner/sandbox.py)
    isolation: Optional[str] = None
    #: which machine this is: 32 hex of a sha256 of /etc/machine-id and the boot id (never the ids)
    machine_identity: Optional[str] = None
    #: the identity was made from both ids (without a machine-id, from the boot id alone)
    machine_identity_complete: Optional[bool] = None
    captured_at: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> Dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        data.update(self.extra)
        return dict(sorted(data.items()))

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Fingerprint":
        """Any known shape (see ``migrate_fingerprint``); fields of the wrong type are kept as read,
        because attribution compares what the host said, not what we expected."""
        data = migrate_fingerprint(obj)
        known = {f.name for f in fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in data.items() if k in known}, extra=_extra(data, cls))

    @property
    def same_machine_key(self) -> Optional[str]:
        """The machine identity when it can say "the same machine": complete (both ids), else None.
        A fingerprint written before the identity existed has none."""
        if self.machine_identity_complete is True and isinstance(self.machine_identity, str) and self.machine_identity:
            return self.machine_identity
        return None


# --- files/<task>.<attempt>.json -------------------------------------------------------------------


@dataclass
class EvidenceCut:
    """What one side's file evidence dropped past ``filetrace.MAX_PATHS``: how many paths, and how many
    under each top directory (``/usr/lib``, ...)."""

    dropped: int = 0
    under: Dict[str, int] = field(default_factory=dict)

    def to_json(self) -> Dict[str, object]:
        return {"dropped": self.dropped, "under": self.under}

    @classmethod
    def from_json(cls, obj: Mapping[str, object]) -> "EvidenceCut":
        under = obj.get("under")
        return cls(dropped=int_or_none(obj.get("dropped")) or 0,
                   under={str(k): n for k, n in under.items() if isinstance(n, int) and not isinstance(n, bool)}
                   if isinstance(under, dict) else {})


@dataclass
class FileEvidence:
    """``files/<task>.<attempt>.json``: the paths an attempt touched outside its own directories
    (``filetrace.py``; ``crosshost explain``'s evidence). ``paths`` are the predicate's, ``agent_paths``
    the agent's and its tools', each path -> the system calls that named it. Untraced (no strace on the
    host): ``why`` says why. ``env_path`` is the attempt's PATH, None when it looked like a secret.
    ``cut``: per side (``predicate``, ``agent``) that dropped paths past the cap, what it dropped."""

    traced: bool
    paths: Dict[str, List[str]] = field(default_factory=dict)
    agent_paths: Dict[str, List[str]] = field(default_factory=dict)
    why: str = ""
    env_path: Optional[str] = None
    cut: Dict[str, EvidenceCut] = field(default_factory=dict)

    def to_json(self) -> Dict[str, object]:
        record: Dict[str, object] = (
            {"traced": True, "paths": self.paths, "agent_paths": self.agent_paths,
             "cut": {side: c.to_json() for side, c in self.cut.items()}}
            if self.traced else {"traced": False, "why": self.why}
        )
        record["env_path"] = self.env_path
        return record

    @classmethod
    def from_json(cls, obj: object, where: str = "") -> "FileEvidence":
        """A TraceError starting with ``where`` when ``obj`` is not evidence (a host's damaged file)."""
        if not isinstance(obj, dict):
            raise TraceError(f"{_where(where)}file evidence is not a JSON object")
        env_path = str_or_none(obj.get("env_path"))
        if not obj.get("traced"):
            return cls(traced=False, why=str(obj.get("why") or "not traced"), env_path=env_path)
        tables: List[Dict[str, List[str]]] = []
        for key in ("paths", "agent_paths"):
            table = obj.get(key, {})
            if not isinstance(table, dict):
                raise TraceError(f"{_where(where)}file evidence {key!r} is not an object")
            tables.append({str(k): [str(c) for c in v] for k, v in table.items() if isinstance(v, list)})
        cut = obj.get("cut")
        cuts = {str(side): EvidenceCut.from_json(c) for side, c in cut.items() if isinstance(c, dict)} \
            if isinstance(cut, dict) else {}
        return cls(traced=True, paths=tables[0], agent_paths=tables[1], env_path=env_path, cut=cuts)
