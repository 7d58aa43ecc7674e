"""A real model provider on the controller's loopback, for tests.

It speaks four wire APIs over a real socket: OpenAI ``POST /v1/chat/completions``, OpenAI Responses
``POST /v1/responses``, Anthropic ``POST /v1/messages`` and Gemini ``POST /v1beta/models/<model>:
generateContent`` / ``:streamGenerateContent?alt=sse``, each streamed (server-sent events, written one
at a time) when the request asks. Its answers follow
a script in the format of a task's ``script.json`` (``{"tool_calls": [{"name", "args"}]}`` or
``{"content", "finish": "stop"}``; a call with ``"custom": true`` is a Responses custom tool call whose
``args["input"]`` is its free-form input, as Codex's ``apply_patch``); the turn is chosen by the number
of model answers already in the request, so concurrent conversations (several hosts at once) each follow
the script.

Modes:
    "script"   the script, then ``stop`` once it runs out
    "forever"  a tool call on every turn (a model that never stops)
    "bad_json" 200 with a body that is not JSON
    "random"   the script's tool calls, each with one of four argument sets drawn at random (a sampled
               model: the same conversation gets different tool calls)
Plus ``fail_first = [429, 429]``: the first requests get those statuses, then the mode applies.
Every request is recorded (path, headers, parsed body) in ``requests`` (``record = False``: none kept,
for a load that would only grow it). A streamed OpenAI chat answer's text comes in ``stream_pieces``
deltas, ``event_delay_s`` apart (a model that writes slowly: ``make bench`` overlaps streams so).
``after_first_event`` is called
between a stream's first event and the rest: a test that returns only once the agent has seen the
first event proves the stream reaches it incrementally (``stream_gates`` records each wait's outcome).
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any
    query: str = ""


@dataclass
class FakeProvider:
    script: list[dict[str, Any]] = field(default_factory=list)
    mode: str = "script"
    key: str = "sk-test-key"
    fail_first: list[int] = field(default_factory=list)
    forever_tool: str = "read_unit_status"
    model: str = "fake-model-1"
    system_fingerprint: str = "fp_fake_0001"
    requests: list[Received] = field(default_factory=list)
    #: called on every request before it is answered (the runner is waiting then: a live snapshot)
    on_request: Callable[[], None] | None = None
    #: called after a stream's first event is written; returns whether the agent saw it in time
    after_first_event: Callable[[], bool] | None = None
    stream_gates: list[bool] = field(default_factory=list)
    stream_pieces: int = 1
    event_delay_s: float = 0.0
    record: bool = True

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._rng = random.Random(7)
        self._server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> FakeProvider:
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    def answer(self, headers: dict[str, str], body: Any, path: str = "/v1/chat/completions",
               query: str = "") -> tuple[int, bytes]:
        if self.on_request is not None:
            self.on_request()
        with self._lock:
            if self.record:
                self.requests.append(Received(path, headers, body, query))
            if self.fail_first:
                status = self.fail_first.pop(0)
                return status, json.dumps({"error": {"message": f"scripted {status}", "type": "x"}}).encode()
        api = api_of(path)
        if headers.get(KEY_HEADER.get(api, "authorization")) != (
            f"Bearer {self.key}" if api in ("openai", "responses") else self.key
        ):
            return 401, json.dumps({"error": {"message": "Incorrect API key provided: sk-wr***ng"}}).encode()
        if self.mode == "bad_json":
            return 200, b"<html>upstream gateway says hello</html>"
        turn = answers_so_far(api, body)
        if self.mode == "forever":
            step: dict[str, Any] = {"tool_calls": [{"name": self.forever_tool, "args": {}}]}
        elif turn < len(self.script):
            step = self.script[turn]
            if self.mode == "random" and step.get("tool_calls"):
                with self._lock:
                    extra = self._rng.choice(["", "why", "how", "when"])
                step = {
                    "tool_calls": [
                        {"name": c["name"], "args": {**c.get("args", {}), **({extra: "x"} if extra else {})}}
                        for c in step["tool_calls"]
                    ]
                }
        else:
            step = {"content": "done", "finish": "stop"}
        if api == "anthropic":
            return 200, json.dumps(self._message(turn, step)).encode()
        if api == "responses":
            return 200, json.dumps(self._response(turn, step)).encode()
        if api == "gemini":
            return 200, json.dumps(self._gemini(turn, step)).encode()
        return 200, json.dumps(self._completion(turn, step)).encode()

    def _response(self, turn: int, step: dict[str, Any]) -> dict[str, Any]:
        output: list[dict[str, Any]] = [
            # a reasoning item, as a reasoning model sends it: the agent passes it back next request
            {"type": "reasoning", "id": f"rs_{turn}", "summary": [], "encrypted_content": f"opaque-{turn}"}
        ]
        for i, c in enumerate(step.get("tool_calls") or []):
            if c.get("custom"):
                output.append({"type": "custom_tool_call", "id": f"ctc_{turn}_{i}", "call_id": f"call_{turn}_{i}",
                               "name": c["name"], "input": str(c.get("args", {}).get("input", "")),
                               "status": "completed"})
            else:
                output.append({"type": "function_call", "id": f"fc_{turn}_{i}", "call_id": f"call_{turn}_{i}",
                               "name": c["name"], "arguments": json.dumps(c.get("args", {})),
                               "status": "completed", **({"namespace": c["namespace"]} if c.get("namespace") else {})})
        if step.get("content"):
            output.append({"type": "message", "id": f"msg_{turn}", "role": "assistant", "status": "completed",
                           "content": [{"type": "output_text", "text": step["content"], "annotations": []}]})
        return {"id": f"resp_{turn}", "object": "response", "created_at": 1700000000, "status": "completed",
                "model": self.model, "output": output,
                "usage": {"input_tokens": 11, "output_tokens": 7, "total_tokens": 18}}

    def _gemini(self, turn: int, step: dict[str, Any]) -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        if step.get("content"):
            parts.append({"text": step["content"]})
        for c in step.get("tool_calls") or []:
            parts.append({"functionCall": {"name": c["name"], "args": c.get("args", {})}})
        return {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": 11, "candidatesTokenCount": 7, "totalTokenCount": 18},
                "modelVersion": self.model, "responseId": f"gem_{turn}"}

    def _message(self, turn: int, step: dict[str, Any]) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if step.get("content"):
            content.append({"type": "text", "text": step["content"]})
        for i, c in enumerate(step.get("tool_calls") or []):
            content.append({"type": "tool_use", "id": f"toolu_{turn}_{i}", "name": c["name"], "input": c.get("args", {})})
        return {
            "id": f"msg_{turn}", "type": "message", "role": "assistant", "model": self.model, "content": content,
            "stop_reason": "tool_use" if step.get("tool_calls") else "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 11, "output_tokens": 7},
        }

    def events(self, path: str, answer: dict[str, Any]) -> list[bytes]:
        """The server-sent events of ``answer`` as its API streams it (arguments in two pieces)."""
        def sse(data: Any, event: str | None = None) -> bytes:
            head = f"event: {event}\n" if event else ""
            return (head + "data: " + (data if isinstance(data, str) else json.dumps(data)) + "\n\n").encode()

        api = api_of(path)
        if api == "responses":
            return responses_events(answer, sse)
        if api == "gemini":
            return gemini_events(answer, sse)
        if api == "anthropic":
            out = [sse({"type": "message_start", "message": {**answer, "content": [], "stop_reason": None,
                                                            "usage": {"input_tokens": 11, "output_tokens": 1}}},
                       "message_start")]
            for i, block in enumerate(answer["content"]):
                if block["type"] == "text":
                    out.append(sse({"type": "content_block_start", "index": i,
                                    "content_block": {"type": "text", "text": ""}}, "content_block_start"))
                    out.append(sse({"type": "content_block_delta", "index": i,
                                    "delta": {"type": "text_delta", "text": block["text"]}}, "content_block_delta"))
                else:
                    args = json.dumps(block["input"])
                    out.append(sse({"type": "content_block_start", "index": i,
                                    "content_block": {**block, "input": {}}}, "content_block_start"))
                    for piece in (args[: len(args) // 2], args[len(args) // 2:]):
                        out.append(sse({"type": "content_block_delta", "index": i,
                                        "delta": {"type": "input_json_delta", "partial_json": piece}},
                                       "content_block_delta"))
                out.append(sse({"type": "content_block_stop", "index": i}, "content_block_stop"))
            out.append(sse({"type": "message_delta", "delta": {"stop_reason": answer["stop_reason"],
                                                                "stop_sequence": None},
                            "usage": {"output_tokens": 7}}, "message_delta"))
            out.append(sse({"type": "message_stop"}, "message_stop"))
            return out
        message = answer["choices"][0]["message"]
        base = {"id": answer["id"], "object": "chat.completion.chunk", "model": answer["model"],
                "system_fingerprint": answer["system_fingerprint"]}
        out = [sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "finish_reason": None}]})]
        text = message.get("content") or ""
        size = -(-len(text) // max(1, self.stream_pieces))
        for at in range(0, len(text), size or 1):
            out.append(sse({**base, "choices": [{"index": 0, "delta": {"content": text[at:at + size]},
                                                 "finish_reason": None}]}))
        for i, call in enumerate(message.get("tool_calls") or []):
            args = call["function"]["arguments"]
            out.append(sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": i, "id": call["id"], "type": "function",
                 "function": {"name": call["function"]["name"], "arguments": args[: len(args) // 2]}}]},
                "finish_reason": None}]}))
            out.append(sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": i, "function": {"arguments": args[len(args) // 2:]}}]}, "finish_reason": None}]}))
        out.append(sse({**base, "choices": [{"index": 0, "delta": {},
                                             "finish_reason": answer["choices"][0]["finish_reason"]}]}))
        out.append(sse({**base, "choices": [], "usage": answer["usage"]}))
        out.append(sse("[DONE]"))
        return out

    def _completion(self, turn: int, step: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": step.get("content")}
        finish = step.get("finish", "stop")
        if step.get("tool_calls"):
            message["tool_calls"] = [
                {
                    "id": f"call_{turn}_{i}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c.get("args", {}))},
                }
                for i, c in enumerate(step["tool_calls"])
            ]
            finish = "tool_calls"
        return {
            "id": f"chatcmpl-{turn}",
            "object": "chat.completion",
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        }


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # hundreds of streams opened at once wait in the backlog, not in SYN retries


def _handler(provider: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def do_POST(self) -> None:  # noqa: N802
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            headers = {k.lower(): v for k, v in self.headers.items()}
            path, _, query = self.path.partition("?")
            if api_of(path) == "gemini" and "key=" in query and "x-goog-api-key" not in headers:
                headers["x-goog-api-key"] = query.split("key=", 1)[1].split("&", 1)[0]
            if path == "/v1/messages/count_tokens":  # what a request would cost: no answer
                with provider._lock:
                    provider.requests.append(Received(path, headers, json.loads(raw or b"null")))
                data = json.dumps({"input_tokens": 11}).encode()
                status = 200 if headers.get("x-api-key") == provider.key else 401
            elif api_of(path) is None:
                status, data = 404, b'{"error": {"message": "no such path"}}'
                with provider._lock:
                    provider.requests.append(Received(self.path, headers, None))
            else:
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                status, data = provider.answer(headers, body, path, query)
                streamed = path.endswith(":streamGenerateContent") or (isinstance(body, dict) and body.get("stream") is True)
                if status == 200 and streamed and data.startswith(b"{"):
                    self._stream(provider.events(path, json.loads(data)))
                    return
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, events: list[bytes]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
            for i, event in enumerate(events):
                if i and provider.event_delay_s:
                    time.sleep(provider.event_delay_s)
                self.wfile.write(event)
                self.wfile.flush()
                if i == 0 and provider.after_first_event is not None:
                    seen = provider.after_first_event()
                    with provider._lock:
                        provider.stream_gates.append(seen)

    return Handler


#: the header each API's key travels in
KEY_HEADER = {"openai": "authorization", "responses": "authorization", "anthropic": "x-api-key",
              "gemini": "x-goog-api-key"}
_GEMINI = re.compile(r"^/v1beta/models/[^/:]+:(generateContent|streamGenerateContent)$")


def api_of(path: str) -> str | None:
    """The wire API of a provider path, or None for a path no API has."""
    if path == "/v1/chat/completions":
        return "openai"
    if path == "/v1/responses":
        return "responses"
    if path == "/v1/messages":
        return "anthropic"
    return "gemini" if _GEMINI.match(path) else None


def answers_so_far(api: str | None, body: Any) -> int:
    """How many model answers a request's conversation already holds (the script's next turn)."""
    if not isinstance(body, dict):
        return 0
    if api == "responses":
        items = body.get("input") if isinstance(body.get("input"), list) else []
        answers, inside = 0, False
        for item in items:
            produced = isinstance(item, dict) and (
                item.get("type") in ("function_call", "custom_tool_call", "reasoning")
                or (item.get("type", "message") == "message" and item.get("role") == "assistant"))
            answers += produced and not inside
            inside = bool(produced)
        return answers
    if api == "gemini":
        return sum(1 for c in body.get("contents") or [] if isinstance(c, dict) and c.get("role") == "model")
    return sum(1 for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "assistant")


def responses_events(answer: dict[str, Any], sse: Callable[..., bytes]) -> list[bytes]:
    """A Responses answer as its stream: created, each output item added / its deltas / done, completed."""
    shell = {**answer, "status": "in_progress", "output": [], "usage": None}
    seq = iter(range(10_000))
    out = [sse({"type": "response.created", "sequence_number": next(seq), "response": shell}, "response.created"),
           sse({"type": "response.in_progress", "sequence_number": next(seq), "response": shell},
               "response.in_progress")]

    def event(kind: str, **fields: Any) -> None:
        out.append(sse({"type": kind, "sequence_number": next(seq), **fields}, kind))

    for i, item in enumerate(answer["output"]):
        if item["type"] == "function_call":
            event("response.output_item.added", output_index=i, item={**item, "arguments": "", "status": "in_progress"})
            args = item["arguments"]
            for piece in (args[: len(args) // 2], args[len(args) // 2:]):
                event("response.function_call_arguments.delta", item_id=item["id"], output_index=i, delta=piece)
            event("response.function_call_arguments.done", item_id=item["id"], output_index=i, arguments=args)
        elif item["type"] == "custom_tool_call":
            event("response.output_item.added", output_index=i, item={**item, "input": "", "status": "in_progress"})
            event("response.custom_tool_call_input.delta", item_id=item["id"], output_index=i, delta=item["input"])
            event("response.custom_tool_call_input.done", item_id=item["id"], output_index=i, input=item["input"])
        elif item["type"] == "message":
            event("response.output_item.added", output_index=i, item={**item, "content": [], "status": "in_progress"})
            text = item["content"][0]["text"]
            event("response.content_part.added", item_id=item["id"], output_index=i, content_index=0,
                  part={"type": "output_text", "text": "", "annotations": []})
            event("response.output_text.delta", item_id=item["id"], output_index=i, content_index=0, delta=text)
            event("response.output_text.done", item_id=item["id"], output_index=i, content_index=0, text=text)
            event("response.content_part.done", item_id=item["id"], output_index=i, content_index=0,
                  part=item["content"][0])
        else:
            event("response.output_item.added", output_index=i, item=item)
        event("response.output_item.done", output_index=i, item=item)
    event("response.completed", response=answer)
    return out


def gemini_events(answer: dict[str, Any], sse: Callable[..., bytes]) -> list[bytes]:
    """A Gemini answer as ``alt=sse`` chunks: each part a chunk of its own, the last with the finish
    reason and the usage."""
    candidate = answer["candidates"][0]
    parts = candidate["content"]["parts"] or [{"text": ""}]
    out = []
    for i, part in enumerate(parts):
        chunk: dict[str, Any] = {"candidates": [{"content": {"role": "model", "parts": [part]}, "index": 0}],
                                 "modelVersion": answer["modelVersion"], "responseId": answer["responseId"]}
        if i == len(parts) - 1:
            chunk["candidates"][0]["finishReason"] = candidate["finishReason"]
            chunk["usageMetadata"] = answer["usageMetadata"]
        out.append(sse(chunk))
    return out


def unused_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def redirecting_provider() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A provider that answers every POST with a 302 to another origin on 127.0.0.1: yields the
    provider's base URL (``.../v1``) and the headers of each request the other origin received."""
    seen: list[dict[str, str]] = []

    class Elsewhere(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            seen.append(dict(self.headers.items()))
            self.send_response(200)
            self.end_headers()

        do_GET = do_POST  # noqa: N815

        def log_message(self, *args: Any) -> None:
            pass

    elsewhere = ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)
    target = f"http://localhost:{elsewhere.server_address[1]}/v1/chat/completions"

    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.send_response(302)  # urllib follows a 302 of a POST as a GET, headers and all
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    redirect = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    for server in (elsewhere, redirect):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{redirect.server_address[1]}/v1", seen
    finally:
        for server in (elsewhere, redirect):
            server.shutdown()
            server.server_close()
