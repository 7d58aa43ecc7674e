"""Trace turns from the model exchanges of an exec agent, in OpenAI chat-completions or Anthropic
messages format, streamed or not.

An exec agent runs its own tools; the proxy sees only what it asks the model and what the model
answers. That is enough for a trace: every tool call the model asked for (tool name, arguments) is a
turn, and the tool's result is the one the agent sends back in its next request (OpenAI: a ``tool``
message with the call's ``tool_call_id``; Anthropic: a ``tool_result`` block with its ``tool_use_id``).
A call whose result never came back (the agent stopped) keeps an empty observation.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Answer:
    """What one model answer asked for: tool calls (id, name, arguments) and tokens."""

    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str | None = None
    finish_reason: str | None = None  # OpenAI's finish_reason, Anthropic's stop_reason


@dataclass
class AttemptLog:
    """The turns of one attempt, as the proxy saw them; ``stopped``/``error`` say why the model stopped
    answering (a cap: ``budget_model``; the provider failed: its message)."""

    turns: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0
    stopped: str | None = None
    error: str | None = None
    #: the proxy's record of each request, as the built-in agent keeps it (``model`` of its first turn)
    calls: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0  # every answer's, also those without a tool call
    completion_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"turns": self.turns, "requests": self.requests, "stopped": self.stopped, "error": self.error,
                "calls": self.calls, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens}


class ExchangeBook:
    """Every exec attempt's turns on one proxy, filled as requests and answers pass."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._attempts: dict[str, AttemptLog] = {}

    def log(self, attempt: str) -> AttemptLog:
        with self._lock:
            return self._attempts.setdefault(attempt, AttemptLog())

    def request(self, attempt: str, api: str, body: dict[str, Any]) -> None:
        """A request: its tool results complete the turns that asked for them."""
        results = tool_results(api, body)
        with self._lock:
            log = self._attempts.setdefault(attempt, AttemptLog())
            log.requests += 1
            for turn in log.turns:
                if turn["observation"] is None and turn["call_id"] in results:
                    turn["observation"], turn["error"] = results[turn["call_id"]]

    def call(self, attempt: str, record: dict[str, Any]) -> None:
        """The proxy's record of one request of ``attempt`` (answered, held, refused or failed)."""
        with self._lock:
            self._attempts.setdefault(attempt, AttemptLog()).calls.append(record)

    def answer(self, attempt: str, answer: Answer, record: dict[str, Any] | None = None) -> None:
        with self._lock:
            log = self._attempts.setdefault(attempt, AttemptLog())
            log.prompt_tokens += answer.prompt_tokens
            log.completion_tokens += answer.completion_tokens
            for i, (call_id, name, args) in enumerate(answer.calls):
                log.turns.append({
                    "call_id": call_id, "tool": name, "args": args, "observation": None, "error": None,
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

    def snapshot(self, attempt: str) -> dict[str, Any]:
        with self._lock:
            log = self._attempts.get(attempt, AttemptLog())
            return json.loads(json.dumps(log.to_json()))


def _args(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str) and raw.strip():
        try:
            value = json.loads(raw)
        except ValueError:
            return {"_unparsed": raw[:2000]}
        return value if isinstance(value, dict) else {"_value": value}
    return {}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else json.dumps(content)


def tool_results(api: str, body: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    """call id -> (observation, error) for every tool result in a request's messages."""
    out: dict[str, tuple[str, str | None]] = {}
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        if api == "openai" and message.get("role") == "tool":
            out[str(message.get("tool_call_id", ""))] = (_text(message.get("content")), None)
        elif api == "anthropic" and isinstance(message.get("content"), list):
            for block in message["content"]:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    text = _text(block.get("content"))
                    out[str(block.get("tool_use_id", ""))] = (text, text if block.get("is_error") else None)
    return out


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def parse_answer(api: str, answer: dict[str, Any]) -> Answer:
    """A complete (not streamed) answer."""
    out = Answer(model=answer.get("model") if isinstance(answer.get("model"), str) else None)
    raw_usage = answer.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    if api == "openai":
        out.prompt_tokens, out.completion_tokens = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
        choices = answer.get("choices") or [{}]
        message = choices[0].get("message") if isinstance(choices[0], dict) else None
        reason = choices[0].get("finish_reason") if isinstance(choices[0], dict) else None
        out.finish_reason = reason if isinstance(reason, str) else None
        for call in (message or {}).get("tool_calls") or []:
            function = call.get("function") or {}
            out.calls.append((str(call.get("id", "")), str(function.get("name", "")), _args(function.get("arguments"))))
    else:
        out.prompt_tokens, out.completion_tokens = _count(usage.get("input_tokens")), _count(usage.get("output_tokens"))
        out.finish_reason = answer["stop_reason"] if isinstance(answer.get("stop_reason"), str) else None
        for block in answer.get("content") or []:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                out.calls.append((str(block.get("id", "")), str(block.get("name", "")), _args(block.get("input"))))
    return out


def is_answer(api: str, answer: Any) -> bool:
    """Whether a provider's JSON is an answer of ``api`` (else: a bad answer, an error verdict)."""
    if not isinstance(answer, dict):
        return False
    if api == "openai":
        return isinstance(answer.get("choices"), list) and bool(answer["choices"])
    return isinstance(answer.get("content"), list)


class StreamReader:
    """Accumulates the server-sent events of a streamed answer into an ``Answer``, line by line."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.answer = Answer()
        self._calls: dict[int, dict[str, Any]] = {}
        self.events = 0

    def line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").strip()
        if not text.startswith("data:"):
            return
        data = text[5:].strip()
        if not data or data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError:
            return
        if isinstance(event, dict):
            self.events += 1
            (self._openai if self.api == "openai" else self._anthropic)(event)

    def _openai(self, event: dict[str, Any]) -> None:
        if isinstance(event.get("model"), str):
            self.answer.model = event["model"]
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.answer.prompt_tokens = _count(usage.get("prompt_tokens"))
            self.answer.completion_tokens = _count(usage.get("completion_tokens"))
        for choice in event.get("choices") or []:
            if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                self.answer.finish_reason = choice["finish_reason"]
            delta = choice.get("delta") if isinstance(choice, dict) else None
            for call in (delta or {}).get("tool_calls") or []:
                slot = self._calls.setdefault(int(call.get("index", 0)), {"id": "", "name": "", "arguments": ""})
                function = call.get("function") or {}
                slot["id"] = call.get("id") or slot["id"]
                slot["name"] += function.get("name") or ""
                slot["arguments"] += function.get("arguments") or ""

    def _anthropic(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self.answer.model = message.get("model") if isinstance(message.get("model"), str) else None
            usage = message.get("usage") or {}
            self.answer.prompt_tokens = _count(usage.get("input_tokens"))
            self.answer.completion_tokens = _count(usage.get("output_tokens"))
        elif kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") == "tool_use":
                self._calls[int(event.get("index", 0))] = {"id": block.get("id", ""), "name": block.get("name", ""),
                                                           "arguments": ""}
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            slot = self._calls.get(int(event.get("index", 0)))
            if slot is not None and delta.get("type") == "input_json_delta":
                slot["arguments"] += delta.get("partial_json") or ""
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            if isinstance(delta.get("stop_reason"), str):
                self.answer.finish_reason = delta["stop_reason"]
            usage = event.get("usage") or {}
            if "output_tokens" in usage:
                self.answer.completion_tokens = _count(usage.get("output_tokens"))

    def finish(self) -> Answer:
        self.answer.calls = [
            (str(c["id"]), str(c["name"]), _args(c["arguments"])) for _, c in sorted(self._calls.items())
        ]
        return self.answer
