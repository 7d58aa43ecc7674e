"""What a trace keeps of the model, typed: one request (``CallRecord``, each try at the provider a
``TryRecord``), never its prompt or key; an attempt's requests, tokens and sampling settings in its
finish record (``ModelUsage``, ``ModelSettings``, ``AgentFinish``)."""

from __future__ import annotations

from typing import List, Optional, TypedDict, Union

from .jsonfile import JSONObject, JSONValue, int_or_none, list_or_empty, str_or_none


class TryRecord(TypedDict):
    """One try at the provider of one model request (a retried request has several)."""

    status: Optional[int]  # None: no HTTP answer
    latency_ms: Optional[int]
    error: Optional[str]
    wait_s: Optional[float]  # backoff slept after this try before the next one


class CallRecord(TypedDict, total=False):
    """A trace turn's ``model`` (and an entry of the finish record's ``model.calls``): what the runner
    keeps of one model request, never its prompt or key. A failed request has ``error`` and ``message``
    instead of the answer's ``model``, ``system_fingerprint`` and ``finish_reason``; ``args_error`` says
    the model's arguments of the turn's call were not a JSON object (alone on a turn's later calls)."""

    request: Union[int, str, None]  # the proxy's id of the request (an int; other tools write strings)
    status: Optional[int]
    retries: int
    attempts: List[TryRecord]
    model: Optional[str]
    system_fingerprint: Optional[str]
    finish_reason: Optional[str]
    held: bool
    error: Optional[str]
    message: Optional[str]
    args_error: str


class ModelSettings(TypedDict, total=False):
    """The finish record's ``model.settings``: the sampling pins (built-in agent) or the model and wire
    format (exec agent)."""

    model: Optional[str]
    temperature: Optional[float]
    seed: Optional[int]
    max_tokens: Optional[int]
    api: str


class ModelUsage(TypedDict):
    """The finish record's ``model``: an attempt's model requests, tokens and each request's record."""

    settings: ModelSettings
    requests: int
    retries: int
    prompt_tokens: int
    completion_tokens: int
    calls: List[CallRecord]


class AgentFinish(TypedDict, total=False):
    """What an agent adds to its attempt's finish record (``Agent.finish_record``)."""

    model: ModelUsage


def call_record_of(value: JSONValue) -> Optional[CallRecord]:
    """A trace's ``model`` record as read back: the fields of the wrong type read as empty."""
    if not isinstance(value, dict):
        return None
    record: CallRecord = {}
    if "request" in value:
        request = value["request"]
        record["request"] = request if isinstance(request, (int, str)) and not isinstance(request, bool) else None
    if "status" in value:
        record["status"] = int_or_none(value["status"])
    if "retries" in value:
        record["retries"] = int_or_none(value["retries"]) or 0
    if "attempts" in value:
        record["attempts"] = [try_record_of(a) for a in list_or_empty(value["attempts"]) if isinstance(a, dict)]
    if "model" in value:
        record["model"] = str_or_none(value["model"])
    if "system_fingerprint" in value:
        record["system_fingerprint"] = str_or_none(value["system_fingerprint"])
    if "finish_reason" in value:
        record["finish_reason"] = str_or_none(value["finish_reason"])
    if "error" in value:
        record["error"] = str_or_none(value["error"])
    if "message" in value:
        record["message"] = str_or_none(value["message"])
    if value.get("held") is True:
        record["held"] = True
    if isinstance(value.get("args_error"), str):
        record["args_error"] = str(value["args_error"])
    return record


def try_record_of(value: JSONObject) -> TryRecord:
    wait = value.get("wait_s")
    return {"status": int_or_none(value.get("status")), "latency_ms": int_or_none(value.get("latency_ms")),
            "error": str_or_none(value.get("error")),
            "wait_s": float(wait) if isinstance(wait, (int, float)) and not isinstance(wait, bool) else None}
