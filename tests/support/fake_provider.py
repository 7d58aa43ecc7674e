"""A real chat-completions provider on the controller's loopback, for tests.

It speaks the OpenAI ``POST /v1/chat/completions`` and the Anthropic ``POST /v1/messages`` protocols
over a real socket, each streamed (server-sent events, written one at a time) when the request asks. Its answers follow
a script in the format of a task's ``script.json`` (``{"tool_calls": [{"name", "args"}]}`` or
``{"content", "finish": "stop"}``); the turn is chosen by the number of assistant messages already in
the request, so concurrent conversations (several hosts at once) each follow the script.

Modes:
    "script"   the script, then ``stop`` once it runs out
    "forever"  a tool call on every turn (a model that never stops)
    "bad_json" 200 with a body that is not JSON
    "random"   the script's tool calls, each with one of four argument sets drawn at random (a sampled
               model: the same conversation gets different tool calls)
Plus ``fail_first = [429, 429]``: the first requests get those statuses, then the mode applies.
Every request is recorded (path, headers, parsed body) in ``requests``. ``after_first_event`` is called
between a stream's first event and the rest: a test that returns only once the agent has seen the
first event proves the stream reaches it incrementally (``stream_gates`` records each wait's outcome).
"""

from __future__ import annotations

import json
import random
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any


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

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._rng = random.Random(7)
        self._server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> FakeProvider:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    def answer(self, headers: dict[str, str], body: Any, path: str = "/v1/chat/completions") -> tuple[int, bytes]:
        if self.on_request is not None:
            self.on_request()
        with self._lock:
            self.requests.append(Received(path, headers, body))
            if self.fail_first:
                status = self.fail_first.pop(0)
                return status, json.dumps({"error": {"message": f"scripted {status}", "type": "x"}}).encode()
        given = headers.get("x-api-key") if path == "/v1/messages" else headers.get("authorization")
        if given != (self.key if path == "/v1/messages" else f"Bearer {self.key}"):
            return 401, json.dumps({"error": {"message": "Incorrect API key provided: sk-wr***ng"}}).encode()
        if self.mode == "bad_json":
            return 200, b"<html>upstream gateway says hello</html>"
        messages = body.get("messages", []) if isinstance(body, dict) else []
        turn = sum(1 for m in messages if m.get("role") == "assistant")
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
        if path == "/v1/messages":
            return 200, json.dumps(self._message(turn, step)).encode()
        return 200, json.dumps(self._completion(turn, step)).encode()

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

        if path == "/v1/messages":
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
        if message.get("content"):
            out.append(sse({**base, "choices": [{"index": 0, "delta": {"content": message["content"]},
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


def _handler(provider: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def do_POST(self) -> None:  # noqa: N802
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            headers = {k.lower(): v for k, v in self.headers.items()}
            if self.path not in ("/v1/chat/completions", "/v1/messages"):
                status, data = 404, b'{"error": {"message": "no such path"}}'
                with provider._lock:
                    provider.requests.append(Received(self.path, headers, None))
            else:
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                status, data = provider.answer(headers, body, self.path)
                if status == 200 and isinstance(body, dict) and body.get("stream") is True and data.startswith(b"{"):
                    self._stream(provider.events(self.path, json.loads(data)))
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
                self.wfile.write(event)
                self.wfile.flush()
                if i == 0 and provider.after_first_event is not None:
                    seen = provider.after_first_event()
                    with provider._lock:
                        provider.stream_gates.append(seen)

    return Handler


def unused_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
