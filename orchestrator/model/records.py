"""What the model proxy records of each request: its tries at the provider and the call as a whole.

``model_calls.jsonl`` has one ``ModelCall`` a line; an exec attempt's trace keeps ``call_record`` of
each (no prompt, no key).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from agent_runner.jsonfile import JSONObject
from agent_runner.model_records import CallRecord


class AttemptJSON(TypedDict):
    """One try at the provider, as ``model_calls.jsonl`` keeps it."""

    attempt: int
    status: int | None
    latency_ms: int
    error: str | None
    wait_s: float | None


class ModelCallJSON(TypedDict):
    """One line of ``model_calls.jsonl`` (and the ``X-Crosshost-Call`` header): a ``ModelCall``."""

    id: int
    status: int
    latency_ms: int
    attempts: list[AttemptJSON]
    error: str | None
    message: str | None
    model: str | None
    system_fingerprint: str | None
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    held: bool
    path: str | None
    retries: int


@dataclass
class Attempt:
    """One try at the provider; a retried request has several."""

    attempt: int
    status: int | None  # None: no HTTP answer (refused, timed out, DNS)
    latency_ms: int
    error: str | None = None
    wait_s: float | None = None  # backoff slept after this attempt before the next one


@dataclass
class ModelCall:
    """One request a runner made through the proxy, as the controller saw it."""

    id: int
    status: int  # what the proxy answered the runner
    latency_ms: int
    attempts: list[Attempt] = field(default_factory=list)
    error: str | None = None  # one of the ERR_* types, or None
    message: str | None = None
    model: str | None = None  # the provider's "model" field of the answer
    system_fingerprint: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    held: bool = False  # answered from the reference host's record (a held model), not the provider
    path: str | None = None  # an exec agent's request: the path it POSTed below its attempt's prefix

    @property
    def retries(self) -> int:
        return max(0, len(self.attempts) - 1)

    def to_json(self) -> ModelCallJSON:
        return {
            "id": self.id, "status": self.status, "latency_ms": self.latency_ms,
            "attempts": [{"attempt": a.attempt, "status": a.status, "latency_ms": a.latency_ms, "error": a.error,
                          "wait_s": a.wait_s} for a in self.attempts],
            "error": self.error, "message": self.message, "model": self.model,
            "system_fingerprint": self.system_fingerprint, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens, "total_tokens": self.total_tokens, "held": self.held,
            "path": self.path, "retries": self.retries,
        }


def call_record(call: ModelCall, finish_reason: str | None = None) -> CallRecord:
    """What an exec attempt's trace keeps about one request, as the built-in agent's turns do (no
    prompt, no key): the request id, status, each try, the provider's model, why the answer ended."""
    record: CallRecord = {
        "request": call.id, "status": call.status, "retries": call.retries,
        "attempts": [{"status": a.status, "latency_ms": a.latency_ms, "error": a.error, "wait_s": a.wait_s}
                     for a in call.attempts],
        "model": call.model, "system_fingerprint": call.system_fingerprint, "finish_reason": finish_reason,
    }
    if call.held:
        record["held"] = True
    if call.error is not None:
        record["error"], record["message"] = call.error, call.message
    return record


def error_body(kind: str, message: str, *, code: str | None = None) -> JSONObject:
    """A refusal or failure as the built-in agent (and OpenAI's SDKs) read it."""
    return {"error": {"type": kind, "code": code or kind, "message": message}}
