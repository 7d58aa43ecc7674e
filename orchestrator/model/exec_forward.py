"""An exec agent's request served (its own SDK, any wire API of the suite's family, streamed or
not): the proxy's gate (model, held model, caps), the real key added, the provider asked with retries
before the first byte, server-sent events relayed as they arrive, and the attempt's turns booked."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from agent_runner import jsonfile
from agent_runner.jsonfile import JSONObject, JSONValue
from agent_runner.wire import (
    ERR_BAD_JSON,
    ERR_BUDGET,
    ERR_DIVERGED,
    ERR_PROVIDER,
    ERR_REFUSED,
    FINISH_BUDGET_MODEL,
    FINISH_MODEL_DIVERGED,
)
from orchestrator.model.apis import family_api
from orchestrator.model.apis.base import WireApi
from orchestrator.model.exchanges import StreamReader
from orchestrator.model.records import ModelCall, call_record
from orchestrator.model.upstream import MAX_RESPONSE_BYTES, Final, Transient, ms_since

if TYPE_CHECKING:
    from orchestrator.model.proxy import ModelProxy
    from orchestrator.model.server import Reply

#: a held streamed answer: the reference's server-sent event lines, as the provider sent them
HELD_EVENTS = "crosshost_events"

#: the most a streamed answer's relay reads at once: a burst of events is one send, and a stream waiting
#: on its provider holds this much (make bench: 8 KiB cost ~30 KiB more per stream than 2 KiB)
RELAY_BYTES = 2 * 1024


def serve_exec_request(proxy: ModelProxy, raw: bytes, attempt: str, headers: Mapping[str, str], reply: Reply,
                       api: WireApi | None = None, path: str = "", query: str = "") -> None:
    """Serve one exec agent request of ``attempt`` ("<task>.<attempt>") to ``path`` of ``api``:
    caps, the real key, retries before the first byte, server-sent events relayed as they arrive,
    the turns booked."""
    api = api or family_api(proxy.api)
    path = path or api.example_path
    started = time.monotonic()
    call = proxy.new_call()
    call.path = path

    def refuse(status: int, kind: str, message: str, code: str | None = None) -> None:
        call.status, call.error, call.message, call.latency_ms = status, kind, message, ms_since(started)
        proxy.record(call)
        proxy.book.call(attempt, call_record(call))
        if kind == ERR_REFUSED:  # the proxy would not forward it: the harness's failure, not the agent's
            proxy.book.stop(attempt, error=message)
        reply.json(status, api.error_body(kind, message, code), call)

    try:
        body: JSONValue = jsonfile.loads(raw)
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        refuse(400, ERR_REFUSED, f"request body is not a JSON object: {exc}")
        return
    if proxy.model is not None and api.model_of(path, body) != proxy.model:
        refuse(403, ERR_REFUSED, f"model {api.model_of(path, body)!r} refused: the suite pins model {proxy.model!r}")
        return
    if api.auxiliary(path):
        _auxiliary(proxy, raw, api, path, query, headers, call, started, reply)
        return
    try:  # what the proxy adds to the request, checked before anything is booked or spent
        prepared = api.prepare(body, api.streamed(path, query, body))
    except ValueError as exc:
        refuse(400, ERR_REFUSED, str(exc))
        return
    proxy.book.request(attempt, api, body)
    if proxy.hold is not None and proxy.host != proxy.hold.reference:
        held = proxy.hold.follow(proxy.host, attempt, body, proxy.roots.get(attempt), api.comparable)
        if held is not None:
            _answer_held(proxy, attempt, held, call, started, reply, api)
            return
        if proxy.hold.mode == "strict" and proxy.hold.diverged(proxy.host, attempt):
            message = f"held model: this request of {attempt} differs from the reference's (hold_model = \"strict\")"
            proxy.book.stop(attempt, stopped=FINISH_MODEL_DIVERGED)
            refuse(409, ERR_DIVERGED, message, FINISH_MODEL_DIVERGED)
            return
    refusal = proxy.admit()
    if refusal is not None:
        proxy.book.stop(attempt, stopped=FINISH_BUDGET_MODEL)
        refuse(403, ERR_BUDGET, refusal, FINISH_BUDGET_MODEL)
        return
    stream = api.streamed(path, query, body)
    if prepared is not None:
        raw = json.dumps(prepared).encode()
    upstream = api.upstream_headers(proxy.upstream.key, dict(headers), stream)
    url = api.upstream_url(proxy.base_url, path, query)
    recording = proxy.hold is not None and proxy.host == proxy.hold.reference
    events: list[JSONValue] = []  # a streamed answer's lines, for a held model's record
    try:
        resp = proxy.upstream.open(url, raw, upstream, call)
        with resp:
            if stream:
                if not (resp.headers.get("Content-Type") or "").startswith("text/event-stream"):
                    raise Final(ERR_BAD_JSON, 200, "a streamed answer that is not server-sent events")
                reader = StreamReader(api)
                call.status, call.latency_ms = 200, ms_since(started)  # the record header: as of the first byte
                reply.start_stream(resp.headers.get("Content-Type") or "text/event-stream", call)
                for line in relay_lines(resp, reply):
                    reader.line(line)
                    if recording:
                        events.append(line.decode("utf-8", "replace"))
                answer = reader.finish()
                answer_body: JSONObject | None = None
            else:
                data = resp.read(MAX_RESPONSE_BYTES + 1)
                try:
                    parsed: JSONValue = json.loads(data)
                except ValueError:
                    raise Final(ERR_BAD_JSON, 200, "answer is not JSON") from None
                if not api.is_answer(parsed) or not isinstance(parsed, dict):
                    raise Final(ERR_BAD_JSON, 200, f"answer is JSON but not an {proxy.api} answer")
                answer_body = parsed
                answer = api.parse_answer(answer_body)
    except (Transient, Final) as exc:
        message = proxy.provider_failure(exc, call)
        proxy.book.stop(attempt, error=message)
        if isinstance(exc, Final) and exc.body and exc.status is not None:
            # the provider's own error, as it said it (an SDK recovers by its wording); still the run's error
            call.status, call.message, call.latency_ms = exc.status, message, ms_since(started)
            proxy.record(call)
            proxy.book.call(attempt, call_record(call))
            reply.raw(exc.status, exc.body, call)
            return
        refuse(502, call.error or ERR_PROVIDER, message)
        return
    call.status, call.latency_ms, call.model = 200, ms_since(started), answer.model
    call.prompt_tokens, call.completion_tokens = answer.prompt_tokens, answer.completion_tokens
    call.total_tokens = answer.prompt_tokens + answer.completion_tokens
    with proxy._lock:
        proxy._tokens += call.total_tokens
    proxy.record(call)
    record = call_record(call, answer.finish_reason)
    proxy.book.call(attempt, record)
    proxy.book.answer(attempt, answer, record)
    if recording and proxy.hold is not None:
        # a streamed answer is held as its events, relayed as they were to the reference
        proxy.hold.record(attempt, body, answer_body if answer_body is not None else {HELD_EVENTS: events},
                         proxy.roots.get(attempt))
    if answer_body is not None:
        reply.raw(200, data, call)  # the provider's bytes: checked and parsed above, never re-serialised

def _auxiliary(proxy: ModelProxy, raw: bytes, api: WireApi, path: str, query: str, headers: Mapping[str, str],
               call: ModelCall, started: float, reply: Reply) -> None:
    """A request that is no model answer (``count_tokens``): the provider's answer relayed as it is."""
    try:
        resp = proxy.upstream.open(api.upstream_url(proxy.base_url, path, query), raw,
                                  api.upstream_headers(proxy.upstream.key, dict(headers), False), call)
        with resp:
            status, data = int(resp.status), resp.read(MAX_RESPONSE_BYTES)
    except (Transient, Final) as exc:
        call.message = proxy.provider_failure(exc, call)
        status = exc.status if isinstance(exc, Final) and exc.body and exc.status else 502
        data = exc.body if isinstance(exc, Final) and exc.body else json.dumps(
            api.error_body(call.error or ERR_PROVIDER, call.message)).encode()
    call.status, call.latency_ms = status, ms_since(started)
    proxy.record(call)
    reply.raw(status, data, call)

def _answer_held(proxy: ModelProxy, attempt: str, held: JSONObject, call: ModelCall, started: float,
                 reply: Reply, api: WireApi) -> None:
    """Answer an exec agent's request from the reference's record: its events again when it was
    streamed, its body when not; the provider is not asked and no cap is spent."""
    call.status, call.held, call.latency_ms = 200, True, ms_since(started)
    events = held.get(HELD_EVENTS)
    if isinstance(events, list):
        reader = StreamReader(api)
        for line in events:
            reader.line(str(line).encode())
        answer = reader.finish()
    else:
        answer = api.parse_answer(held)
    call.model = answer.model
    proxy.record(call)
    record = call_record(call, answer.finish_reason)
    proxy.book.call(attempt, record)
    proxy.book.answer(attempt, answer, record)
    if not isinstance(events, list):
        reply.json(200, held, call)
        return
    reply.start_stream("text/event-stream", call)
    reply.chunk("".join(str(line) for line in events).encode())  # all there already: one send

def relay_lines(resp: Any, reply: Reply) -> Iterator[bytes]:
    """Relay a streamed answer as it arrives and yield its lines (each with its ``\\n``) once relayed.

    Whatever one read brings is passed on in one write: a provider's burst of events is one send, a
    slow provider's each event as it comes, never held back waiting for a line's end. A line past
    ``MAX_RESPONSE_BYTES`` is yielded in pieces of about that size, as ``readline(limit)`` would."""
    parts: list[bytes] = []  # the line so far: joined once it ends, never copied per read
    size = 0
    while data := resp.read1(RELAY_BYTES):
        reply.chunk(data)
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            parts.append(data[start:end + 1])
            yield b"".join(parts)
            parts, size, start = [], 0, end + 1
        if start < len(data):
            parts.append(data[start:])
            size += len(data) - start
            if size >= MAX_RESPONSE_BYTES:
                yield b"".join(parts)
                parts, size = [], 0
    if parts:
        yield b"".join(parts)

