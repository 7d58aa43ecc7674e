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
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt
from tenacity.wait import wait_random_exponential

from agent_runner.wire import (
    API_BASE_PATH,
    ATTEMPT_HEADER,
    CALL_HEADER,
    CHAT_PATH,
    ERR_BAD_JSON,
    ERR_BUDGET,
    ERR_DIVERGED,
    ERR_PROVIDER,
    ERR_REFUSED,
    ERR_UNREACHABLE,
    FINISH_BUDGET_MODEL,
    FINISH_MODEL_DIVERGED,
    MODEL_URL_ENV,
    model_url,
)
from orchestrator.errors import ApiKeyMissing, InputError, SuiteError
from orchestrator.hold import ModelHold
from orchestrator.transport.base import Host

if TYPE_CHECKING:
    from agent_runner.suite import Suite

FORWARDED_PATH = API_BASE_PATH + CHAT_PATH  # the one path the proxy serves
MAX_REQUEST_BYTES = 8 * 1024 * 1024
MAX_RESPONSE_BYTES = 16 * 1024 * 1024

# Provider error messages may quote a masked key ("sk-ab***yz"); never relay anything key-shaped.
_KEYISH = re.compile(r"\b(sk|pk|rk|key)[-_][A-Za-z0-9_\-*.]{4,}", re.IGNORECASE)


def openai_agent_config(suite: Suite, tasks: list[str] | None = None) -> dict[str, Any] | None:
    """The proxy's settings for a suite whose (selected) tasks use ``kind = "openai"``.

    None when no selected task talks to a model. Each task's agent is the validated one (the suite's
    inherited by the suite's one rule). One proxy serves a host's whole run, so every such task must
    agree on ``base_url``, ``api_key_env`` and the caps; ``model`` is pinned only when they agree on it.
    """
    agents = [
        task.agent.to_dict()
        for task in suite.tasks
        if task.agent.kind == "openai" and (tasks is None or task.id in tasks)
    ]
    if not agents:
        return None
    config = dict(agents[0])
    for key in ("base_url", "api_key_env", "max_requests", "max_total_tokens"):
        if len({json.dumps(a.get(key)) for a in agents}) > 1:
            raise SuiteError(f"[agent] {key}: every openai task of a suite must use the same {key}")
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
            if self.hold.mode == "strict":
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
            except urllib.error.HTTPError as exc:
                status = int(exc.code)
                data = exc.read(64 * 1024) if exc.fp is not None else b""
                message = self._redact(_provider_message(data) or exc.reason or "")
                call.attempts.append(Attempt(number, status, _ms(t0), error=message or f"HTTP {status}"))
                if status == 429 or status >= 500:
                    raise _Transient(status, message or f"HTTP {status}", _retry_after(exc.headers)) from None
                if status in (401, 403):
                    message = (
                        "the provider refused the API key (check the key in the controller's environment)"
                    )
                raise _Final(ERR_PROVIDER, status, f"HTTP {status}: {message}") from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                text = self._redact(str(reason))
                call.attempts.append(Attempt(number, None, _ms(t0), error=text))
                raise _Transient(None, text) from None
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

        retrying = Retrying(
            retry=retry_if_exception_type(_Transient),
            stop=stop_after_attempt(self.retry_attempts),
            wait=wait,
            before_sleep=before_sleep,
            sleep=self._sleep,
            reraise=True,
        )
        result: dict[str, Any] = retrying(one_attempt)
        return result

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

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
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
            yield {MODEL_URL_ENV: url}
        finally:
            if port is not None:
                host.cancel_forward(port)
            if record_dir is not None:
                with contextlib.suppress(OSError):
                    record_dir.mkdir(parents=True, exist_ok=True)
                    proxy.write_jsonl(record_dir / "model_calls.jsonl")
