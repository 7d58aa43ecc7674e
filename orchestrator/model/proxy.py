"""ModelProxy: the controller-side gate between runners and a live model provider.

The API key never leaves the controller. A runner (local, or remote through a reverse SSH port
forward) is given only ``CROSSHOST_MODEL_URL=http://127.0.0.1:<port>/v1``; the proxy adds
``Authorization: Bearer <key>`` and forwards to the suite's ``base_url``.

It is a gate, not a pipe:

- only ``POST /v1/chat/completions`` is forwarded; any other method or path is refused;
- a request for another model than the suite's is refused (the bill and the pins stay the suite's);
- per-run caps on requests and total tokens: past a cap the answer is a ``crosshost_budget`` error
  that the agent maps to the finish reason ``budget_model``;
- 429 and 5xx (and connection failures) are retried with jittered backoff (tenacity); every attempt
  is recorded, never hidden;
- provider unreachable, a provider error status, or a body that is not a chat completion become a
  ``502`` with a ``crosshost_provider_*`` error that the agent turns into an ``error`` verdict.

Every answer to the runner carries an ``X-Crosshost-Call`` header (JSON: request id, status,
latency, attempts, provider model / system_fingerprint, usage) so the runner writes it into the
trace; the controller keeps the same records in ``ModelProxy.calls``.

One proxy per host per run: records and caps are then attributable to the host that spent them.

An exec agent (``kind = "exec"``, its own program and SDK) reaches the proxy at
``/attempt/<task>.<attempt>/v1/chat/completions`` (``api = "openai"``) or ``.../v1/messages``
(``api = "anthropic"``), streamed or not, with the run's placeholder ``CROSSHOST_MODEL_STANDIN`` as its API
key; the proxy requires it, forwards with the real key, passes server-sent events through as they
arrive, and builds the attempt's trace turns from the exchanges (``orchestrator/model/exchanges.py``), which
the runner fetches from ``/crosshost/turns`` when the agent has exited.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt
from tenacity.wait import wait_random_exponential

from agent_runner.suite import MODEL_KINDS
from agent_runner.wire import (
    API_BASE_PATH,
    ATTEMPT_HEADER,
    ATTEMPT_PATH,
    CALL_HEADER,
    CHAT_PATH,
    ERR_BAD_JSON,
    ERR_BUDGET,
    ERR_DIVERGED,
    ERR_PROVIDER,
    ERR_REFUSED,
    ERR_UNREACHABLE,
    EXEC_PREFIX,
    FINISH_BUDGET_MODEL,
    FINISH_MODEL_DIVERGED,
    MESSAGES_PATH,
    MODEL_PASS_ENV,
    MODEL_URL_ENV,
    TURNS_PATH,
    model_url,
)
from orchestrator.errors import ApiKeyMissing, InputError, SuiteError
from orchestrator.hosts.transport.base import Host
from orchestrator.model.exchanges import ExchangeBook, StreamReader, is_answer, parse_answer
from orchestrator.model.hold import ModelHold, attempt_root

if TYPE_CHECKING:
    from agent_runner.suite import Suite

FORWARDED_PATH = API_BASE_PATH + CHAT_PATH  # the one path the proxy serves
#: a held streamed answer: the reference's server-sent event lines, as the provider sent them
HELD_EVENTS = "crosshost_events"
MAX_REQUEST_BYTES = 8 * 1024 * 1024
MAX_RESPONSE_BYTES = 16 * 1024 * 1024

# Provider error messages may quote a masked key ("sk-ab***yz"); never relay anything key-shaped.
_KEYISH = re.compile(r"\b(sk|pk|rk|key)[-_][A-Za-z0-9_\-*.]{4,}", re.IGNORECASE)


def openai_agent_config(suite: Suite, tasks: list[str] | None = None) -> dict[str, Any] | None:
    """The proxy's settings for a suite whose (selected) tasks use ``kind = "openai"`` or ``"exec"``.

    None when no selected task talks to a model. Each task's agent is the validated one (the suite's
    inherited by the suite's one rule). One proxy serves a host's whole run, so every such task must
    agree on ``base_url``, ``api_key_env`` and the caps; ``model`` is pinned only when they agree on it.
    """
    agents = [
        {**task.agent.to_dict(), "api": task.agent.options.get("api", "openai")}
        for task in suite.tasks
        if task.agent.kind in MODEL_KINDS and (tasks is None or task.id in tasks)
    ]
    if not agents:
        return None
    config = dict(agents[0])
    for key in ("base_url", "api_key_env", "max_requests", "max_total_tokens", "api"):
        if len({json.dumps(a.get(key)) for a in agents}) > 1:
            raise SuiteError(f"[agent] {key}: every live-model task of a suite must use the same {key}")
    if any(a["kind"] == "exec" for a in agents):
        config["kind"] = "exec"  # the placeholder for its program
    if len({a.get("model") for a in agents}) > 1:
        config["model"] = None
    return config


def require_api_key(
    api_key_env: str, environ: Mapping[str, str] | None = None, *, where: str = "suite.toml"
) -> str:
    """Return the key named by ``api_key_env`` or raise a one-line ``ApiKeyMissing`` before any run."""
    env = os.environ if environ is None else environ
    if not api_key_env:
        raise ApiKeyMissing(
            f"{where}: [agent] api_key_env is empty; name the variable that holds the API key"
        )
    value = env.get(api_key_env, "")
    if not value.strip():
        raise ApiKeyMissing(
            f"{where}: [agent] api_key_env = {api_key_env!r} is not set in the controller's environment; "
            f"export {api_key_env}=<key> and rerun (the key stays on the controller)"
        )
    return value.strip()


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

    @property
    def retries(self) -> int:
        return max(0, len(self.attempts) - 1)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["retries"] = self.retries
        return out


class _Transient(Exception):
    """A provider answer worth retrying (429, 5xx, no connection)."""

    def __init__(self, status: int | None, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class _Final(Exception):
    """A provider answer not worth retrying; becomes a 502 to the runner."""

    def __init__(self, kind: str, status: int | None, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


class ModelProxy:
    """A loopback HTTP proxy that adds the key, enforces caps, retries and records.

    Use as a context manager::

        with ModelProxy(base_url, "OPENAI_API_KEY", model="gpt-4o-mini", max_requests=200) as proxy:
            runner_env[MODEL_URL_ENV] = proxy.url
        proxy.calls  # every request, with its attempts

    ``ApiKeyMissing`` is raised by the constructor, so an unset key stops the run before it starts.
    """

    def __init__(
        self,
        base_url: str,
        api_key_env: str,
        *,
        model: str | None = None,
        max_requests: int | None = None,
        max_total_tokens: int | None = None,
        retry_attempts: int = 4,
        retry_wait_s: float = 1.0,
        retry_max_wait_s: float = 30.0,
        timeout_s: float = 120.0,
        environ: Mapping[str, str] | None = None,
        where: str = "suite.toml",
        sleep: Callable[[float], None] = time.sleep,
        hold: ModelHold | None = None,
        host: str = "",
        api: str = "openai",
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise InputError(f"{where}: [agent] base_url = {base_url!r} must start with http:// or https://")
        self._key = require_api_key(api_key_env, environ, where=where)
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.max_requests = max_requests
        self.max_total_tokens = max_total_tokens
        self.retry_attempts = max(1, retry_attempts)
        self.retry_wait_s = retry_wait_s
        self.retry_max_wait_s = retry_max_wait_s
        self.timeout_s = timeout_s
        self._sleep = sleep
        self.hold = hold
        self.host = host
        self.api = api
        #: what an exec agent is given as its API key; the proxy requires it and swaps in the real one
        self.token = "crosshost-" + secrets.token_hex(16)
        self.book = ExchangeBook()
        #: exec attempt -> its directory on the host (``ATTEMPT_PATH``), set aside by a held model
        self.roots: dict[str, str] = {}
        self.calls: list[ModelCall] = []
        self.refused_paths: list[str] = []
        self._lock = threading.Lock()
        self._seq = 0  # every chat request, refused or not
        self._admitted = 0  # requests that passed the caps (forwarded)
        self._tokens = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_agent(
        cls,
        agent: Mapping[str, Any],
        *,
        where: str = "suite.toml",
        environ: Mapping[str, str] | None = None,
        **kw: Any,
    ) -> ModelProxy:
        """A proxy for a validated ``[agent]`` of ``kind = "openai"`` (``AgentSpec.to_dict()``; not started)."""
        return cls(
            str(agent.get("base_url", "")),
            str(agent.get("api_key_env", "")),
            model=agent.get("model"),
            max_requests=agent.get("max_requests"),
            max_total_tokens=agent.get("max_total_tokens"),
            api=str(agent.get("api", "openai")),
            environ=environ,
            where=where,
            **kw,
        )

    def __repr__(self) -> str:  # never the key
        return f"ModelProxy(base_url={self.base_url!r}, port={self.port if self._server else None})"

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> ModelProxy:
        if self._server is not None:
            return self
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            # a short poll so stop() returns promptly at the end of every host's run
            target=server.serve_forever,
            args=(0.05,),
            name="crosshost-model-proxy",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ModelProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("ModelProxy is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """What a runner on the controller's own loopback is given as CROSSHOST_MODEL_URL."""
        return model_url(self.port)

    # -- records -------------------------------------------------------------------------------

    @property
    def requests_used(self) -> int:
        with self._lock:
            return self._admitted

    @property
    def tokens_used(self) -> int:
        with self._lock:
            return self._tokens

    def summary(self) -> dict[str, Any]:
        """Totals for the run record (manifest): no key, no prompts."""
        with self._lock:
            calls = list(self.calls)
        return {
            "base_url": self.base_url,
            "model": self.model,
            "requests": len(calls),
            "retries": sum(c.retries for c in calls),
            "prompt_tokens": sum(c.prompt_tokens for c in calls),
            "completion_tokens": sum(c.completion_tokens for c in calls),
            "total_tokens": sum(c.total_tokens for c in calls),
            "errors": sorted({c.error for c in calls if c.error}),
            "refused_paths": list(self.refused_paths),
            "caps": {"max_requests": self.max_requests, "max_total_tokens": self.max_total_tokens},
        }

    def write_jsonl(self, path: Path) -> None:
        """One line per call, in request order."""
        with self._lock:
            calls = sorted(self.calls, key=lambda c: c.id)
        path.write_text("".join(json.dumps(c.to_json(), sort_keys=True) + "\n" for c in calls))

    # -- the gate ------------------------------------------------------------------------------

    def _admit(self) -> str | None:
        """Take a request slot under the caps; return the refusal message when a cap is reached."""
        with self._lock:
            if self.max_requests is not None and self._admitted >= self.max_requests:
                return f"model request cap reached (max_requests = {self.max_requests})"
            if self.max_total_tokens is not None and self._tokens >= self.max_total_tokens:
                return (
                    f"model token cap reached ({self._tokens} of max_total_tokens = {self.max_total_tokens})"
                )
            self._admitted += 1
        return None

    def _refused(
        self, call: ModelCall, status: int, kind: str, message: str
    ) -> tuple[int, dict[str, Any], ModelCall]:
        call.status, call.error, call.message = status, kind, message
        self._record(call)
        code = FINISH_BUDGET_MODEL if kind == ERR_BUDGET else None
        return status, _error_body(kind, message, code=code), call

    def handle_chat(self, raw: bytes, attempt_key: str | None = None) -> tuple[int, dict[str, Any], ModelCall]:
        """Answer one chat-completions request body: (status, JSON body, record). ``attempt_key``
        ("<task>.<attempt>") lets a held model record (the reference) or answer (every other host)."""
        started = time.monotonic()
        with self._lock:
            self._seq += 1
            call = ModelCall(id=self._seq, status=0, latency_ms=0)
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            return self._refused(call, 400, ERR_REFUSED, f"request body is not a JSON object: {exc}")
        if self.model is not None and body.get("model") != self.model:
            msg = f"model {body.get('model')!r} refused: the suite pins model {self.model!r}"
            return self._refused(call, 403, ERR_REFUSED, msg)
        following = self.hold is not None and attempt_key is not None and self.host != self.hold.reference
        if following:
            assert self.hold is not None and attempt_key is not None
            held = self.hold.follow(self.host, attempt_key, body)
            if held is not None:
                call.status, call.held, call.latency_ms = 200, True, _ms(started)
                call.model = _str_or_none(held.get("model"))
                call.system_fingerprint = _str_or_none(held.get("system_fingerprint"))
                self._record(call)
                return 200, held, call
            if self.hold.mode == "strict" and self.hold.diverged(self.host, attempt_key):
                msg = f"held model: this request of {attempt_key} differs from the reference's (hold_model = \"strict\")"
                call.status, call.error, call.message = 409, ERR_DIVERGED, msg
                self._record(call)
                return 409, _error_body(ERR_DIVERGED, msg, code=FINISH_MODEL_DIVERGED), call
        refusal = self._admit()
        if refusal is not None:
            return self._refused(call, 403, ERR_BUDGET, refusal)

        try:
            answer = self._forward(raw, call)
        except _Transient as exc:
            kind = ERR_UNREACHABLE if exc.status is None else ERR_PROVIDER
            what = "unreachable" if exc.status is None else f"answered HTTP {exc.status}"
            call.error = kind
            call.message = (
                f"model provider {self.base_url} {what} after {len(call.attempts)} attempt(s): {exc}"
            )
        except _Final as exc:
            call.error = exc.kind
            call.message = f"model provider {self.base_url}: {exc}"
        call.latency_ms = _ms(started)
        if call.error is not None:
            call.status = 502
            self._record(call)
            return 502, _error_body(call.error, call.message or ""), call

        raw_usage = answer.get("usage")
        usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
        call.status = 200
        call.model = _str_or_none(answer.get("model"))
        call.system_fingerprint = _str_or_none(answer.get("system_fingerprint"))
        call.prompt_tokens = _int(usage.get("prompt_tokens"))
        call.completion_tokens = _int(usage.get("completion_tokens"))
        call.total_tokens = _int(usage.get("total_tokens")) or call.prompt_tokens + call.completion_tokens
        with self._lock:
            self._tokens += call.total_tokens
        self._record(call)
        if self.hold is not None and attempt_key is not None and self.host == self.hold.reference:
            self.hold.record(attempt_key, body, answer)
        return 200, answer, call

    def _record(self, call: ModelCall) -> None:
        with self._lock:
            self.calls.append(call)

    # -- exec agents: their own SDK, either wire format, streamed or not -----------------------------

    def authorised(self, headers: Mapping[str, str]) -> bool:
        """Whether a request carries this run's placeholder (``Authorization: Bearer`` or ``x-api-key``)."""
        headers = {k.lower(): v for k, v in headers.items()}
        auth = headers.get("authorization") or ""
        given = headers.get("x-api-key") or (auth[7:] if auth[:7].lower() == "bearer " else "")
        return secrets.compare_digest(given.strip().encode(), self.token.encode())

    def api_error(self, kind: str, message: str, *, code: str | None = None) -> dict[str, Any]:
        """An error body in the format of the suite's ``api`` (so the agent's SDK raises it as such)."""
        if self.api == "anthropic":
            return {"type": "error", "error": {"type": kind, "code": code or kind, "message": message}}
        return _error_body(kind, message, code=code)

    def exchange(self, raw: bytes, attempt: str, headers: Mapping[str, str], reply: _Reply) -> None:
        """Serve one exec agent request of ``attempt`` ("<task>.<attempt>"): caps, the real key,
        retries before the first byte, server-sent events relayed line by line, the turns booked."""
        started = time.monotonic()
        with self._lock:
            self._seq += 1
            call = ModelCall(id=self._seq, status=0, latency_ms=0)

        def refuse(status: int, kind: str, message: str, code: str | None = None) -> None:
            call.status, call.error, call.message, call.latency_ms = status, kind, message, _ms(started)
            self._record(call)
            self.book.call(attempt, call_record(call))
            reply.json(status, self.api_error(kind, message, code=code), call)

        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            refuse(400, ERR_REFUSED, f"request body is not a JSON object: {exc}")
            return
        if self.model is not None and body.get("model") != self.model:
            refuse(403, ERR_REFUSED, f"model {body.get('model')!r} refused: the suite pins model {self.model!r}")
            return
        self.book.request(attempt, self.api, body)
        if self.hold is not None and self.host != self.hold.reference:
            held = self.hold.follow(self.host, attempt, body, self.roots.get(attempt))
            if held is not None:
                self._answer_held(attempt, held, call, started, reply)
                return
            if self.hold.mode == "strict" and self.hold.diverged(self.host, attempt):
                message = f"held model: this request of {attempt} differs from the reference's (hold_model = \"strict\")"
                self.book.stop(attempt, stopped=FINISH_MODEL_DIVERGED)
                refuse(409, ERR_DIVERGED, message, FINISH_MODEL_DIVERGED)
                return
        refusal = self._admit()
        if refusal is not None:
            self.book.stop(attempt, stopped=FINISH_BUDGET_MODEL)
            refuse(403, ERR_BUDGET, refusal, FINISH_BUDGET_MODEL)
            return
        stream = body.get("stream") is True
        if stream and self.api == "openai":  # a streamed answer has its tokens only when asked for them
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
            raw = json.dumps(body).encode()
        upstream = {"Content-Type": "application/json",
                    "Accept": "text/event-stream" if stream else "application/json"}
        if self.api == "anthropic":
            upstream["x-api-key"] = self._key
            upstream["anthropic-version"] = headers.get("anthropic-version") or "2023-06-01"
            if headers.get("anthropic-beta"):
                upstream["anthropic-beta"] = str(headers.get("anthropic-beta"))
            url = self.base_url + API_BASE_PATH + MESSAGES_PATH
        else:
            upstream["Authorization"] = f"Bearer {self._key}"
            url = self.base_url + CHAT_PATH
        recording = self.hold is not None and self.host == self.hold.reference
        events: list[str] = []  # a streamed answer's lines, for a held model's record
        try:
            resp = self._open(url, raw, upstream, call)
            with resp:
                if stream:
                    if not (resp.headers.get("Content-Type") or "").startswith("text/event-stream"):
                        raise _Final(ERR_BAD_JSON, 200, "a streamed answer that is not server-sent events")
                    reader = StreamReader(self.api)
                    call.status, call.latency_ms = 200, _ms(started)  # the record header: as of the first byte
                    reply.start_stream(resp.headers.get("Content-Type") or "text/event-stream", call)
                    while True:
                        line = resp.readline(MAX_RESPONSE_BYTES)
                        if not line:
                            break
                        reader.line(line)
                        reply.chunk(line)
                        if recording:
                            events.append(line.decode("utf-8", "replace"))
                    answer = reader.finish()
                    answer_body: dict[str, Any] | None = None
                else:
                    data = resp.read(MAX_RESPONSE_BYTES + 1)
                    try:
                        answer_body = json.loads(data)
                    except ValueError:
                        raise _Final(ERR_BAD_JSON, 200, "answer is not JSON") from None
                    if not is_answer(self.api, answer_body):
                        raise _Final(ERR_BAD_JSON, 200, f"answer is JSON but not an {self.api} answer")
                    assert isinstance(answer_body, dict)
                    answer = parse_answer(self.api, answer_body)
        except _Transient as exc:
            what = "unreachable" if exc.status is None else f"answered HTTP {exc.status}"
            kind = ERR_UNREACHABLE if exc.status is None else ERR_PROVIDER
            message = f"model provider {self.base_url} {what} after {len(call.attempts)} attempt(s): {exc}"
            self.book.stop(attempt, error=message)
            refuse(502, kind, message)
            return
        except _Final as exc:
            message = f"model provider {self.base_url}: {exc}"
            self.book.stop(attempt, error=message)
            refuse(502, exc.kind, message)
            return
        call.status, call.latency_ms, call.model = 200, _ms(started), answer.model
        call.prompt_tokens, call.completion_tokens = answer.prompt_tokens, answer.completion_tokens
        call.total_tokens = answer.prompt_tokens + answer.completion_tokens
        with self._lock:
            self._tokens += call.total_tokens
        self._record(call)
        record = call_record(call, answer.finish_reason)
        self.book.call(attempt, record)
        self.book.answer(attempt, answer, record)
        if recording and self.hold is not None:
            # a streamed answer is held as its events, relayed as they were to the reference
            self.hold.record(attempt, body, answer_body if answer_body is not None else {HELD_EVENTS: events},
                             self.roots.get(attempt))
        if answer_body is not None:
            reply.json(200, answer_body, call)

    def _answer_held(self, attempt: str, held: dict[str, Any], call: ModelCall, started: float,
                     reply: _Reply) -> None:
        """Answer an exec agent's request from the reference's record: its events again when it was
        streamed, its body when not; the provider is not asked and no cap is spent."""
        call.status, call.held, call.latency_ms = 200, True, _ms(started)
        events = held.get(HELD_EVENTS)
        if isinstance(events, list):
            reader = StreamReader(self.api)
            for line in events:
                reader.line(str(line).encode())
            answer = reader.finish()
        else:
            answer = parse_answer(self.api, held)
        call.model = answer.model
        self._record(call)
        record = call_record(call, answer.finish_reason)
        self.book.call(attempt, record)
        self.book.answer(attempt, answer, record)
        if not isinstance(events, list):
            reply.json(200, held, call)
            return
        reply.start_stream("text/event-stream", call)
        for line in events:
            reply.chunk(str(line).encode())

    def _open(self, url: str, raw: bytes, headers: dict[str, str], call: ModelCall) -> Any:
        """The provider's open response (its body not read yet), retried like ``_forward`` while no
        byte of an answer has been passed on."""

        def one_attempt() -> Any:
            number = len(call.attempts) + 1
            t0 = time.monotonic()
            request = urllib.request.Request(url, data=raw, method="POST", headers=headers)
            try:
                resp = urllib.request.urlopen(request, timeout=self.timeout_s)  # noqa: S310 - the suite's URL
            except (urllib.error.URLError, OSError) as exc:
                self._failed_attempt(exc, call, number, t0)
            call.attempts.append(Attempt(number, int(resp.status), _ms(t0)))
            return resp

        return self._retrying(call)(one_attempt)

    def _failed_attempt(self, exc: OSError, call: ModelCall, number: int, t0: float) -> NoReturn:
        """Record a failed provider request in ``call.attempts`` and raise what the retry policy acts
        on: 429, 5xx and connection errors are transient; any other status is final."""
        if isinstance(exc, urllib.error.HTTPError):
            status = int(exc.code)
            data = exc.read(64 * 1024) if exc.fp is not None else b""
            message = self._redact(_provider_message(data) or exc.reason or "")
            call.attempts.append(Attempt(number, status, _ms(t0), error=message or f"HTTP {status}"))
            if status == 429 or status >= 500:
                raise _Transient(status, message or f"HTTP {status}", _retry_after(exc.headers)) from None
            if status in (401, 403):
                message = "the provider refused the API key (check the key in the controller's environment)"
            raise _Final(ERR_PROVIDER, status, f"HTTP {status}: {message}") from None
        text = self._redact(str(getattr(exc, "reason", exc)))
        call.attempts.append(Attempt(number, None, _ms(t0), error=text))
        raise _Transient(None, text) from None

    def _forward(self, raw: bytes, call: ModelCall) -> dict[str, Any]:
        """POST to the provider with retries; every attempt lands in ``call.attempts``."""

        def one_attempt() -> dict[str, Any]:
            number = len(call.attempts) + 1
            t0 = time.monotonic()
            request = urllib.request.Request(
                self.base_url + CHAT_PATH,
                data=raw,
                method="POST",
                headers={
                    "Content-Type": "application/json",
                    "Accept": "application/json",
                    "Authorization": f"Bearer {self._key}",
                },
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                    status = int(resp.status)
                    data = resp.read(MAX_RESPONSE_BYTES + 1)
            except (urllib.error.URLError, OSError) as exc:
                self._failed_attempt(exc, call, number, t0)
            call.attempts.append(Attempt(number, status, _ms(t0)))
            if len(data) > MAX_RESPONSE_BYTES:
                raise _Final(ERR_BAD_JSON, status, f"answer larger than {MAX_RESPONSE_BYTES} bytes")
            try:
                answer = json.loads(data)
            except ValueError:
                raise _Final(ERR_BAD_JSON, status, "answer is not JSON") from None
            if (
                not isinstance(answer, dict)
                or not isinstance(answer.get("choices"), list)
                or not answer["choices"]
            ):
                raise _Final(ERR_BAD_JSON, status, "answer is JSON but not a chat completion (no choices)")
            return answer

        result: dict[str, Any] = self._retrying(call)(one_attempt)
        return result

    def _retrying(self, call: ModelCall) -> Retrying:
        """Retries of transient failures: jittered backoff, at least a provider's Retry-After, each
        wait recorded on the attempt before it."""
        base_wait = wait_random_exponential(multiplier=self.retry_wait_s, max=self.retry_max_wait_s)

        def wait(state: RetryCallState) -> float:
            seconds = float(base_wait(state))
            exc = state.outcome.exception() if state.outcome else None
            if isinstance(exc, _Transient) and exc.retry_after is not None:
                seconds = max(seconds, min(exc.retry_after, self.retry_max_wait_s))
            return seconds

        def before_sleep(state: RetryCallState) -> None:
            if call.attempts and state.next_action is not None:
                call.attempts[-1].wait_s = round(float(state.next_action.sleep), 3)

        return Retrying(
            retry=retry_if_exception_type(_Transient),
            stop=stop_after_attempt(self.retry_attempts),
            wait=wait,
            before_sleep=before_sleep,
            sleep=self._sleep,
            reraise=True,
        )

    def _redact(self, text: str) -> str:
        text = text.replace(self._key, "[redacted]")
        return _KEYISH.sub("[redacted]", text)[:300]


def _handler_for(proxy: ModelProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "crosshost-proxy"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            # Silence the default stderr log: the records are the log, and they hold no secrets.
            pass

        def _refuse(self, status: int, message: str) -> None:
            with proxy._lock:
                proxy.refused_paths.append(f"{self.command} {self.path}")
            self._send(status, _error_body(ERR_REFUSED, message), None)

        def _send(self, status: int, body: dict[str, Any], call: ModelCall | None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if call is not None:
                self.send_header(CALL_HEADER, json.dumps(call.to_json(), sort_keys=True))
            self.end_headers()
            with contextlib.suppress(OSError):
                self.wfile.write(data)

        def _body(self) -> bytes | None:
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self._refuse(411, "a Content-Length is required")
                return None
            if length < 0 or length > MAX_REQUEST_BYTES:
                self._refuse(413, f"request body over {MAX_REQUEST_BYTES} bytes")
                return None
            return self.rfile.read(length)

        def _exec(self, path: str) -> None:
            """An exec agent's request (``/attempt/<key>/v1/...``) or the runner asking for its turns."""
            if not proxy.authorised(dict(self.headers.items())):
                with proxy._lock:
                    proxy.refused_paths.append(f"{self.command} {path} (no placeholder)")
                self._send(401, proxy.api_error(ERR_REFUSED, "the proxy needs this run's placeholder as the API key"),
                           None)
                return
            raw = self._body()
            if raw is None:
                return
            if path == TURNS_PATH:
                try:
                    attempt = str(json.loads(raw)["attempt"])
                except (ValueError, KeyError, TypeError):
                    self._refuse(400, 'expected {"attempt": "<task>.<attempt>"}')
                    return
                self._send(200, proxy.book.snapshot(attempt), None)
                return
            if path == ATTEMPT_PATH:
                try:
                    given = json.loads(raw)
                    attempt, root = str(given["attempt"]), attempt_root(given["root"])
                except (ValueError, KeyError, TypeError):
                    root = None
                if root is None:
                    self._refuse(400, 'expected {"attempt": "<task>.<attempt>", "root": "<an absolute directory>"}')
                    return
                with proxy._lock:
                    proxy.roots[attempt] = root
                self._send(200, {}, None)
                return
            key, _, rest = path[len(EXEC_PREFIX):].partition("/")
            wanted = (API_BASE_PATH + MESSAGES_PATH) if proxy.api == "anthropic" else FORWARDED_PATH
            if "/" + rest != wanted or not key:
                self._refuse(404, f"path {path!r} refused: an exec agent of api = {proxy.api!r} may POST only "
                                  f"{EXEC_PREFIX}<attempt>{wanted}")
                return
            proxy.exchange(raw, urllib.parse.unquote(key), {k.lower(): v for k, v in self.headers.items()}, _Reply(self, self._send))

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            path = self.path.split("?", 1)[0]
            if path in (TURNS_PATH, ATTEMPT_PATH) or path.startswith(EXEC_PREFIX):
                self._exec(path)
                return
            if self.path.split("?", 1)[0] != FORWARDED_PATH:
                self._refuse(404, f"path {self.path!r} refused: the proxy forwards only POST {FORWARDED_PATH}")
                return
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self._refuse(411, "a Content-Length is required")
                return
            if length < 0 or length > MAX_REQUEST_BYTES:
                self._refuse(413, f"request body over {MAX_REQUEST_BYTES} bytes")
                return
            raw = self.rfile.read(length)
            status, body, call = proxy.handle_chat(raw, self.headers.get(ATTEMPT_HEADER) or None)
            self._send(status, body, call)

        def _not_allowed(self) -> None:
            self._refuse(405, f"{self.command} refused: the proxy forwards only POST {FORWARDED_PATH}")

        do_GET = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed  # noqa: N815

    return Handler


class _Reply:
    """How ``ModelProxy.exchange`` answers: one JSON body, or a stream relayed as it arrives."""

    def __init__(self, handler: BaseHTTPRequestHandler,
                 send: Callable[[int, dict[str, Any], ModelCall | None], None]) -> None:
        self._handler = handler
        self._send = send

    def json(self, status: int, body: dict[str, Any], call: ModelCall | None) -> None:
        self._send(status, body, call)

    def start_stream(self, content_type: str, call: ModelCall) -> None:
        # no Content-Length: the stream ends when the connection closes (HTTP/1.0 framing)
        self._handler.send_response(200)
        self._handler.send_header("Content-Type", content_type)
        self._handler.send_header("Cache-Control", "no-cache")
        # the record as of the first byte (tokens come with the last event; the runner's trace has them)
        self._handler.send_header(CALL_HEADER, json.dumps(call.to_json(), sort_keys=True))
        self._handler.end_headers()

    def chunk(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            self._handler.wfile.write(data)
            self._handler.wfile.flush()


def call_record(call: ModelCall, finish_reason: str | None = None) -> dict[str, Any]:
    """What an exec attempt's trace keeps about one request, as the built-in agent's turns do (no
    prompt, no key): the request id, status, each try, the provider's model, why the answer ended."""
    record: dict[str, Any] = {
        "request": call.id, "status": call.status, "retries": call.retries,
        "attempts": [{"status": a.status, "latency_ms": a.latency_ms, "error": a.error, "wait_s": a.wait_s}
                     for a in call.attempts],
        "model": call.model, "system_fingerprint": call.system_fingerprint, "finish_reason": finish_reason,
    }
    if call.held:
        record["held"] = True
    if call.error is not None:
        record.update(error=call.error, message=call.message)
    return record


def _error_body(kind: str, message: str, *, code: str | None = None) -> dict[str, Any]:
    return {"error": {"type": kind, "code": code or kind, "message": message}}


def _provider_message(data: bytes) -> str:
    try:
        body = json.loads(data)
    except ValueError:
        return data[:200].decode("utf-8", "replace").strip()
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err.get("type") or "")
        if isinstance(err, str):
            return err
    return ""


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _ms(since: float) -> int:
    return int((time.monotonic() - since) * 1000)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@contextlib.contextmanager
def model_route(
    host: Host,
    agent: Mapping[str, Any] | None,
    record_dir: Path | None = None,
    hold: ModelHold | None = None,
    name: str = "",
) -> Iterator[dict[str, str]]:
    """Serve the model to one host's run: yields the runner's extra environment (``CROSSHOST_MODEL_URL``).

    A host that reaches the controller's loopback (``Host.reaches_controller_loopback``: the local
    host, a FakeHost) is given the proxy's own URL; any other gets a reverse forward on its own
    127.0.0.1 (``Host.forward_remote``: on an SSH host, over the same transport), closed when the run
    ends; a backend that can do neither refuses with a HostError naming it. ``record_dir/model_calls.jsonl``
    gets every request. ``agent`` None: no model, nothing started, nothing added.
    """
    if agent is None:
        yield {}
        return
    proxy = ModelProxy.from_agent(agent, hold=hold, host=name)
    with proxy:
        port: int | None = None
        try:
            if host.reaches_controller_loopback:
                url = proxy.url
            else:
                port = host.forward_remote(proxy.port)
                url = model_url(port)
            extra = {MODEL_PASS_ENV: proxy.token} if agent.get("kind") == "exec" else {}
            yield {MODEL_URL_ENV: url, **extra}
        finally:
            if port is not None:
                host.cancel_forward(port)
            if record_dir is not None:
                with contextlib.suppress(OSError):
                    record_dir.mkdir(parents=True, exist_ok=True)
                    proxy.write_jsonl(record_dir / "model_calls.jsonl")
