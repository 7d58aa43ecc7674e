"""The model proxy's HTTP side: a loopback server whose handler reads a request, asks the proxy
(``orchestrator/model/proxy.py``; an exec agent's request through ``exec_forward.py``) and writes its
answer, one JSON body or a stream relayed as it arrives.

Paths: ``POST /v1/chat/completions`` (the built-in agent, naming its attempt in ``X-Crosshost-Attempt``),
``POST /attempt/<task>.<attempt>/<an API's path>`` (an exec agent), ``POST /crosshost/turns`` and
``/crosshost/attempt`` (the runner, naming the attempt in the body); each with the placeholder of the
attempt it names, else a 401 in the API's error format, recorded. Every other method or path is
refused; a request the proxy cannot serve (a body nested past ``jsonfile.MAX_DEPTH``, a field of the
wrong type) is a 400, recorded, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from agent_runner import jsonfile
from agent_runner.jsonfile import JSONObject, JSONValue
from agent_runner.textguard import one_line
from agent_runner.wire import (
    API_BASE_PATH,
    ATTEMPT_HEADER,
    ATTEMPT_PATH,
    CALL_HEADER,
    CHAT_PATH,
    ERR_REFUSED,
    EXEC_PREFIX,
    TURNS_PATH,
)
from orchestrator.httpserver import READ_TIMEOUT_S
from orchestrator.model.apis import api_for
from orchestrator.model.exchanges import AttemptTurns
from orchestrator.model.exec_forward import serve_exec_request
from orchestrator.model.hold import attempt_root
from orchestrator.model.records import ModelCall, error_body

if TYPE_CHECKING:
    from orchestrator.model.proxy import ModelProxy

FORWARDED_PATH = API_BASE_PATH + CHAT_PATH  # the one path the built-in agent POSTs
MAX_REQUEST_BYTES = 8 * 1024 * 1024


def handler_for(proxy: ModelProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "crosshost-proxy"
        sys_version = ""
        timeout = READ_TIMEOUT_S  # a client that sends its request slowly holds a thread this long at most
        # an answer's headers and body leave in one send, a stream's in one send per flush (``Reply``)
        wbufsize = 8 * 1024
        disable_nagle_algorithm = True  # every flush is a whole answer or what the provider sent: no trickle

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            # Silence the default stderr log: the records are the log, and they hold no secrets.
            pass

        def _refuse(self, status: int, message: str, *, exec_api: bool = False) -> None:
            """A refusal in the API's own error format (an exec agent's: the suite's ``api``), recorded."""
            call = proxy.refusal(status, f"{self.command} {one_line(self.path[:200])}", message)
            body = proxy.api_error(ERR_REFUSED, message) if exec_api else error_body(ERR_REFUSED, message)
            self._send(status, body, call)

        def _send(self, status: int, body: JSONObject | AttemptTurns, call: ModelCall | None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if call is not None:
                self.send_header(CALL_HEADER, json.dumps(call.to_json(), sort_keys=True))
            self.end_headers()
            with contextlib.suppress(OSError):
                self.wfile.write(data)
                self.wfile.flush()

        def _body(self, exec_api: bool) -> bytes | None:
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self._refuse(411, "a Content-Length is required", exec_api=exec_api)
                return None
            if length < 0 or length > MAX_REQUEST_BYTES:
                self._refuse(413, f"request body over {MAX_REQUEST_BYTES} bytes", exec_api=exec_api)
                return None
            return self.rfile.read(length)

        def _unauthorised(self, attempt: str | None, exec_api: bool, query: str = "") -> bool:
            """Refuse (401) a request without the placeholder of the attempt it names."""
            if proxy.authorised(dict(self.headers.items()), attempt, query):
                return False
            self._refuse(401, "the proxy needs the placeholder of the attempt the request names as its API key",
                         exec_api=exec_api)
            return True

        def _runner(self, path: str, query: str) -> None:
            """The runner naming an exec attempt's directory, or asking for its turns."""
            raw = self._body(True)
            if raw is None:
                return
            try:
                given: JSONValue = jsonfile.loads(raw)
                if not isinstance(given, dict):
                    raise TypeError("not a JSON object")
                attempt = str(given["attempt"])
                root = attempt_root(given["root"]) if path == ATTEMPT_PATH else None
            except (ValueError, KeyError, TypeError):
                attempt, root = "", None
            if self._unauthorised(attempt or None, True, query):
                return
            if path == TURNS_PATH:
                self._send(200, proxy.book.snapshot(attempt), None)
                return
            if root is None:
                self._refuse(400, 'expected {"attempt": "<task>.<attempt>", "root": "<an absolute directory>"}',
                             exec_api=True)
                return
            proxy.attempt_directory(attempt, root)
            self._send(200, {}, None)

        def _exec(self, path: str, query: str) -> None:
            """An exec agent's request (``/attempt/<key>/...``)."""
            key, _, rest = path[len(EXEC_PREFIX):].partition("/")
            attempt = urllib.parse.unquote(key)
            if self._unauthorised(attempt, True, query):
                return
            api = api_for("/" + rest)
            if api is None or api.family != proxy.api:
                body, call = proxy.refuse_api(attempt, "/" + rest, api)
                self._send(404, body, call)
                return
            raw = self._body(True)
            if raw is None:
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            serve_exec_request(proxy, raw, attempt, headers, Reply(self, self._send), api, "/" + rest, query)

        def _builtin(self) -> None:
            """The runner's built-in agent: ``POST /v1/chat/completions`` of the attempt it names."""
            attempt = self.headers.get(ATTEMPT_HEADER) or None
            if self._unauthorised(attempt, False):
                return
            raw = self._body(False)
            if raw is None:
                return
            status, body, call = proxy.handle_chat(raw, attempt)
            self._send(status, body, call)

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            path, _, query = self.path.partition("?")
            exec_api = path in (TURNS_PATH, ATTEMPT_PATH) or path.startswith(EXEC_PREFIX)
            try:
                if path in (TURNS_PATH, ATTEMPT_PATH):
                    self._runner(path, query)
                elif path.startswith(EXEC_PREFIX):
                    self._exec(path, query)
                elif path == FORWARDED_PATH:
                    self._builtin()
                else:
                    self._refuse(404, f"path {one_line(self.path[:200])!r} refused: the proxy forwards only POST "
                                      f"{FORWARDED_PATH}")
            except Exception as exc:  # noqa: BLE001 - a request it cannot serve is a refusal, never a traceback
                self._refuse(400, f"the proxy cannot serve this request ({type(exc).__name__})", exec_api=exec_api)

        def _not_allowed(self) -> None:
            if self.path.startswith(EXEC_PREFIX) and "websocket" in (self.headers.get("Upgrade") or "").lower():
                # an agent that tries a WebSocket first (Codex's Responses transport) falls back to HTTP
                # on a 404; a 405 or 426 makes some retry and give up
                proxy.refused(f"{self.command} {self.path.split('?', 1)[0]} (WebSocket)")
                self._send(404, proxy.api_error(ERR_REFUSED, "no WebSocket transport here: POST over HTTP"), None)
                return
            self._refuse(405, f"{self.command} refused: the proxy forwards only POST {FORWARDED_PATH}")

        do_GET = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed  # noqa: N815

    return Handler


class Reply:
    """How ``ModelProxy.exchange`` answers: one JSON body, or a stream relayed as it arrives."""

    def __init__(self, handler: BaseHTTPRequestHandler,
                 send: Callable[[int, JSONObject, ModelCall | None], None]) -> None:
        self._handler = handler
        self._send = send

    def json(self, status: int, body: JSONObject, call: ModelCall | None) -> None:
        self._send(status, body, call)

    def raw(self, status: int, data: bytes, call: ModelCall) -> None:
        """The provider's own body and status, as it sent them (JSON)."""
        handler = self._handler
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header(CALL_HEADER, json.dumps(call.to_json(), sort_keys=True))
        handler.end_headers()
        with contextlib.suppress(OSError):
            handler.wfile.write(data)
            handler.wfile.flush()

    def start_stream(self, content_type: str, call: ModelCall) -> None:
        # no Content-Length: the stream ends when the connection closes (HTTP/1.0 framing)
        self._handler.send_response(200)
        self._handler.send_header("Content-Type", content_type)
        self._handler.send_header("Cache-Control", "no-cache")
        # the record as of the first byte (tokens come with the last event; the runner's trace has them)
        self._handler.send_header(CALL_HEADER, json.dumps(call.to_json(), sort_keys=True))
        self._handler.end_headers()
        with contextlib.suppress(OSError):
            self._handler.wfile.flush()  # the agent has the headers before the first event

    def chunk(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            self._handler.wfile.write(data)
            self._handler.wfile.flush()
