"""A real chat-completions provider on the controller's loopback, for tests.

It speaks the OpenAI ``POST /v1/chat/completions`` protocol over a real socket. Its answers follow
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
Every request is recorded (path, headers, parsed body) in ``requests``.
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

    def answer(self, headers: dict[str, str], body: Any) -> tuple[int, bytes]:
        if self.on_request is not None:
            self.on_request()
        with self._lock:
            self.requests.append(Received("/v1/chat/completions", headers, body))
            if self.fail_first:
                status = self.fail_first.pop(0)
                return status, json.dumps({"error": {"message": f"scripted {status}", "type": "x"}}).encode()
        if headers.get("authorization") != f"Bearer {self.key}":
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
        return 200, json.dumps(self._completion(turn, step)).encode()

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
            if self.path != "/v1/chat/completions":
                status, data = 404, b'{"error": {"message": "no such path"}}'
                with provider._lock:
                    provider.requests.append(Received(self.path, headers, None))
            else:
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                status, data = provider.answer(headers, body)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def unused_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
