"""Trace turns from the model exchanges of an exec agent, in any wire API the proxy speaks
(``orchestrator/model/apis/``), streamed or not.

An exec agent runs its own tools; the proxy sees only what it asks the model and what the model
answers. That is enough for a trace: every tool call the model asked for (tool name, arguments) is a
turn, and the tool's result is the one the agent sends back in its next request (each API's module
says where: OpenAI chat, a ``tool`` message with the call's ``tool_call_id``; Anthropic, a
``tool_result`` block with its ``tool_use_id``).
A call whose result never came back (the agent stopped) keeps an empty observation. The two may
arrive in either order: a streamed answer's turns are booked once its stream has ended, and a fast
agent's next request (another connection, another thread) can be booked before that; its results
then wait for the calls they answer.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from agent_runner.jsonfile import JSONObject, JSONValue
from agent_runner.model_records import CallRecord

if TYPE_CHECKING:
    from orchestrator.model.apis.base import WireApi

#: what a request carries back of one tool call: (observation, error)
ToolResult = tuple[str, "str | None"]


@dataclass
class Answer:
    """What one model answer asked for: tool calls (id, name, arguments) and tokens."""

    calls: list[tuple[str, str, JSONObject]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str | None = None
    finish_reason: str | None = None  # OpenAI's finish_reason, Anthropic's stop_reason
    text: str | None = None  # what the model said besides its tool calls


@dataclass
class CallSlot:
    """One tool call of a streamed answer as its pieces arrive: its arguments are JSON text gathered
    piece by piece, or (Gemini) the object the provider sent whole."""

    id: str = ""
    name: str = ""
    arguments: str | JSONObject = ""


class Turn(TypedDict):
    """One tool call the model asked for, and what the agent sent back for it (a trace turn)."""

    call_id: str
    tool: str
    args: JSONObject
    observation: str | None  # None until the agent's next request carries the result
    error: str | None
    prompt_tokens: int
    completion_tokens: int
    model: CallRecord | None  # the request's record, on its answer's first call


class AttemptTurns(TypedDict):
    """``/crosshost/turns``: an exec attempt's turns and records, as the runner writes them into its trace."""

    turns: list[Turn]
    requests: int
    stopped: str | None
    error: str | None
    calls: list[CallRecord]
    prompt_tokens: int
    completion_tokens: int
    text: str | None


@dataclass
class AttemptLog:
    """The turns of one attempt, as the proxy saw them; ``stopped``/``error`` say why the model stopped
    answering (a cap: ``budget_model``; the provider failed: its message)."""

    turns: list[Turn] = field(default_factory=list)
    requests: int = 0
    stopped: str | None = None
    error: str | None = None
    #: the proxy's record of each request, as the built-in agent keeps it (``model`` of its first turn)
    calls: list[CallRecord] = field(default_factory=list)
    prompt_tokens: int = 0  # every answer's, also those without a tool call
    completion_tokens: int = 0
    text: str | None = None  # what the model said last (an exec agent's final answer)
    #: results a request carried for calls not booked yet (their answer's stream still ending)
    early: dict[str, ToolResult] = field(default_factory=dict)

    def to_json(self) -> AttemptTurns:
        return {"turns": self.turns, "requests": self.requests, "stopped": self.stopped, "error": self.error,
                "calls": self.calls, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "text": self.text}


class ExchangeBook:
    """Every exec attempt's turns on one proxy, filled as requests and answers pass."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._attempts: dict[str, AttemptLog] = {}

    def log(self, attempt: str) -> AttemptLog:
        with self._lock:
            return self._attempts.setdefault(attempt, AttemptLog())

    def request(self, attempt: str, api: WireApi, body: JSONObject) -> None:
        """A request: its tool results complete the turns that asked for them."""
        results = api.tool_results(body)
        with self._lock:
            log = self._attempts.setdefault(attempt, AttemptLog())
            log.requests += 1
            for call_id, result in results.items():
                same = [t for t in log.turns if t["call_id"] == call_id]
                waiting = [t for t in same if t["observation"] is None]
                for turn in waiting:
                    turn["observation"], turn["error"] = result
                if not waiting and (not same or (same[-1]["observation"], same[-1]["error"]) != result):
                    # no booked call has it (yet): a request resends every earlier result, so one
                    # already booked is the last call's of that id (a provider without ids: its name)
                    log.early[call_id] = result

    def call(self, attempt: str, record: CallRecord) -> None:
        """The proxy's record of one request of ``attempt`` (answered, held, refused or failed)."""
        with self._lock:
            self._attempts.setdefault(attempt, AttemptLog()).calls.append(record)

    def answer(self, attempt: str, answer: Answer, record: CallRecord | None = None) -> None:
        with self._lock:
            log = self._attempts.setdefault(attempt, AttemptLog())
            log.prompt_tokens += answer.prompt_tokens
            log.completion_tokens += answer.completion_tokens
            if answer.text and answer.text.strip():
                log.text = answer.text.strip()
            for i, (call_id, name, args) in enumerate(answer.calls):
                observation, error = log.early.pop(call_id, (None, None))
                log.turns.append({
                    "call_id": call_id, "tool": name, "args": args, "observation": observation, "error": error,
                    # the answer's tokens and request record go to its first call, like the built-in agent's
                    "prompt_tokens": answer.prompt_tokens if i == 0 else 0,
                    "completion_tokens": answer.completion_tokens if i == 0 else 0,
                    "model": record if i == 0 else None,
                })

    def stop(self, attempt: str, *, stopped: str | None = None, error: str | None = None) -> None:
        with self._lock:
            log = self._attempts.setdefault(attempt, AttemptLog())
            log.stopped = log.stopped or stopped
            log.error = log.error or error

    def snapshot(self, attempt: str) -> AttemptTurns:
        with self._lock:
            log = self._attempts.get(attempt, AttemptLog())
            copy: AttemptTurns = json.loads(json.dumps(log.to_json()))  # the same shape, none of it shared
            return copy


def json_args(raw: JSONValue) -> JSONObject:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str) and raw.strip():
        try:
            value: JSONValue = json.loads(raw)
        except ValueError:
            return {"_unparsed": raw[:2000]}
        return value if isinstance(value, dict) else {"_value": value}
    return {}


def text_of(content: JSONValue) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else json.dumps(content)


def text_piece(value: JSONValue) -> str:
    """A piece of streamed text: ``value`` when it is a string, else nothing."""
    return value if isinstance(value, str) else ""


def mapping(value: JSONValue) -> JSONObject:
    """``value`` when it is a JSON object, else an empty one (a provider's answer is not trusted)."""
    return value if isinstance(value, dict) else {}


def listing(value: JSONValue) -> list[JSONValue]:
    """``value`` when it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def count(value: JSONValue) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class StreamReader:
    """Accumulates the server-sent events of a streamed answer into an ``Answer``, line by line."""

    def __init__(self, api: WireApi) -> None:
        self.api = api
        self.answer = Answer()
        self._calls: dict[int, CallSlot] = {}
        self.events = 0

    def line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").strip()
        if not text.startswith("data:"):
            return
        data = text[5:].strip()
        if not data or data == "[DONE]":
            return
        try:
            event: JSONValue = json.loads(data)
        except ValueError:
            return
        if isinstance(event, dict):
            self.events += 1
            self.api.stream_event(event, self.answer, self._calls)

    def finish(self) -> Answer:
        self.answer.calls = [
            (slot.id, slot.name, json_args(slot.arguments)) for _, slot in sorted(self._calls.items())
        ]
        return self.answer
