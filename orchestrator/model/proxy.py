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
(``api = "anthropic"``), streamed or not, with its attempt's placeholder as its API key; the proxy
forwards with the real key, passes server-sent events through as they arrive, and builds the
attempt's trace turns from the exchanges (``orchestrator/model/exchanges.py``), which the runner
fetches from ``/crosshost/turns`` when the agent has exited.

Every request names its attempt (the path, ``X-Crosshost-Attempt`` or the body's ``attempt``) and
carries that attempt's placeholder (``wire.attempt_token`` of this proxy's secret, which only the
host's runner is given): anything else is a 401 in the API's own error format, recorded in
``model_calls.jsonl``. So an attempt reaches its own record only, and a host's proxy serves only
that host's attempts. Bodies are bounded in size and JSON depth (a 400, recorded), a provider's
redirect is never followed (``upstream.py``), and the server is ``httpserver.BoundedServer``.

An exec agent's request is served by ``exec_forward.py`` through this proxy's gate and records.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypedDict

from agent_runner import jsonfile
from agent_runner.jsonfile import JSONObject, JSONValue, str_or_none
from agent_runner.wire import (
    ERR_BUDGET,
    ERR_DIVERGED,
    ERR_PROVIDER,
    ERR_REFUSED,
    ERR_UNREACHABLE,
    EXEC_PREFIX,
    FINISH_BUDGET_MODEL,
    FINISH_MODEL_DIVERGED,
    MODEL_PASS_ENV,
    MODEL_URL_ENV,
    REFUSED_API,
    attempt_token,
    model_url,
)
from orchestrator.errors import InputError
from orchestrator.hosts.transport.base import Host
from orchestrator.httpserver import PROXY_MAX_THREADS, BoundedServer
from orchestrator.model.apis import APIS, family_api
from orchestrator.model.apis.base import WireApi
from orchestrator.model.exchanges import ExchangeBook, count, mapping
from orchestrator.model.hold import ModelHold
from orchestrator.model.records import ModelCall, call_record, error_body
from orchestrator.model.server import handler_for
from orchestrator.model.settings import ProxyConfig, require_api_key
from orchestrator.model.upstream import Final, Transient, Upstream, ms_since

#: refused requests kept in the record (past it they are counted)
MAX_REFUSALS_RECORDED = 1000


class Caps(TypedDict):
    max_requests: int | None
    max_total_tokens: int | None


class ProxySummary(TypedDict):
    """A proxy's totals (``ModelProxy.summary``): no key, no prompts."""

    base_url: str
    model: str | None
    requests: int
    retries: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    errors: list[str]
    refused_paths: list[str]
    refusals: int
    caps: Caps


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
        max_connections: int = PROXY_MAX_THREADS,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise InputError(f"{where}: [agent] base_url = {base_url!r} must start with http:// or https://")
        self.base_url = base_url.rstrip("/")
        self.upstream = Upstream(
            self.base_url, require_api_key(api_key_env, environ, where=where), retry_attempts=retry_attempts,
            retry_wait_s=retry_wait_s, retry_max_wait_s=retry_max_wait_s, timeout_s=timeout_s, sleep=sleep,
        )
        self.model = model
        self.max_requests = max_requests
        self.max_total_tokens = max_total_tokens
        self.hold = hold
        self.host = host
        self.api = api
        self.max_connections = max_connections  # requests served at once, streams included
        #: the runner's secret (``MODEL_PASS_ENV``): each attempt's placeholder is derived from it
        #: (``wire.attempt_token``) and opens that attempt's requests, turns and directory only
        self.secret = secrets.token_hex(32)
        self.book = ExchangeBook()
        #: exec attempt -> its directory on the host (``ATTEMPT_PATH``), set aside by a held model
        self.roots: dict[str, str] = {}
        self.calls: list[ModelCall] = []
        self.refused_paths: list[str] = []
        self.refusals = 0  # every refused request, recorded or not
        self._lock = threading.Lock()
        self._seq = 0  # every chat request, refused or not
        self._admitted = 0  # requests that passed the caps (forwarded)
        self._tokens = 0
        self._server: BoundedServer | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_config(
        cls,
        config: ProxyConfig,
        *,
        where: str = "suite.toml",
        environ: Mapping[str, str] | None = None,
        **kw: Any,
    ) -> ModelProxy:
        """A proxy with a run's settings (``openai_agent_config``; not started)."""
        return cls(
            config.base_url,
            config.api_key_env,
            model=config.model,
            max_requests=config.max_requests,
            max_total_tokens=config.max_total_tokens,
            api=config.api,
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
        server = BoundedServer(("127.0.0.1", 0), handler_for(self), max_threads=self.max_connections)
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

    def summary(self) -> ProxySummary:
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
            "refusals": self.refusals,
            "caps": {"max_requests": self.max_requests, "max_total_tokens": self.max_total_tokens},
        }

    def write_jsonl(self, path: Path) -> None:
        """One line per call, in request order."""
        with self._lock:
            calls = sorted(self.calls, key=lambda c: c.id)
        path.write_text("".join(json.dumps(c.to_json(), sort_keys=True) + "\n" for c in calls))

    def refused(self, what: str) -> None:
        """A request refused before it was a model call, named in ``refused_paths`` (the call is
        recorded by whoever refused it)."""
        with self._lock:
            if len(self.refused_paths) < MAX_REFUSALS_RECORDED:
                self.refused_paths.append(what)

    def refusal(self, status: int, line: str, message: str) -> ModelCall:
        """A request refused before it was a model call (method, path, no valid placeholder, a body
        that cannot be read), recorded as a call of its own so ``model_calls.jsonl`` keeps it; past
        ``MAX_REFUSALS_RECORDED`` only counted (a flood costs the controller no memory)."""
        with self._lock:
            self._seq += 1
            self.refusals += 1
            call = ModelCall(id=self._seq, status=status, latency_ms=0, error=ERR_REFUSED, message=f"{line}: {message}")
            if self.refusals <= MAX_REFUSALS_RECORDED:
                self.calls.append(call)
                self.refused_paths.append(line)
        return call

    def attempt_directory(self, attempt: str, root: str) -> None:
        with self._lock:
            self.roots[attempt] = root

    # -- the gate ------------------------------------------------------------------------------

    def admit(self) -> str | None:
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

    def new_call(self) -> ModelCall:
        with self._lock:
            self._seq += 1
            return ModelCall(id=self._seq, status=0, latency_ms=0)

    def _refused(
        self, call: ModelCall, status: int, kind: str, message: str
    ) -> tuple[int, JSONObject, ModelCall]:
        call.status, call.error, call.message = status, kind, message
        self.record(call)
        code = FINISH_BUDGET_MODEL if kind == ERR_BUDGET else None
        return status, error_body(kind, message, code=code), call

    def provider_failure(self, exc: Transient | Final, call: ModelCall) -> str:
        """The message of a provider failure; ``call.error`` set to its kind."""
        if isinstance(exc, Final):
            call.error = exc.kind
            return f"model provider {self.base_url}: {exc}"
        call.error = ERR_UNREACHABLE if exc.status is None else ERR_PROVIDER
        what = "unreachable" if exc.status is None else f"answered HTTP {exc.status}"
        return f"model provider {self.base_url} {what} after {len(call.attempts)} attempt(s): {exc}"

    def handle_chat(self, raw: bytes, attempt_key: str | None = None) -> tuple[int, JSONObject, ModelCall]:
        """Answer one chat-completions request body: (status, JSON body, record). ``attempt_key``
        ("<task>.<attempt>") lets a held model record (the reference) or answer (every other host)."""
        started = time.monotonic()
        call = self.new_call()
        try:
            body: JSONValue = jsonfile.loads(raw)
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
                call.status, call.held, call.latency_ms = 200, True, ms_since(started)
                call.model = str_or_none(held.get("model"))
                call.system_fingerprint = str_or_none(held.get("system_fingerprint"))
                self.record(call)
                return 200, held, call
            if self.hold.mode == "strict" and self.hold.diverged(self.host, attempt_key):
                msg = f"held model: this request of {attempt_key} differs from the reference's (hold_model = \"strict\")"
                call.status, call.error, call.message = 409, ERR_DIVERGED, msg
                self.record(call)
                return 409, error_body(ERR_DIVERGED, msg, code=FINISH_MODEL_DIVERGED), call
        refusal = self.admit()
        if refusal is not None:
            return self._refused(call, 403, ERR_BUDGET, refusal)

        try:
            answer = self.upstream.chat(raw, call)
        except (Transient, Final) as exc:
            call.message = self.provider_failure(exc, call)
        call.latency_ms = ms_since(started)
        if call.error is not None:
            call.status = 502
            self.record(call)
            return 502, error_body(call.error, call.message or ""), call

        usage = mapping(answer.get("usage"))
        call.status = 200
        call.model = str_or_none(answer.get("model"))
        call.system_fingerprint = str_or_none(answer.get("system_fingerprint"))
        call.prompt_tokens = count(usage.get("prompt_tokens"))
        call.completion_tokens = count(usage.get("completion_tokens"))
        call.total_tokens = count(usage.get("total_tokens")) or call.prompt_tokens + call.completion_tokens
        self.spend(call.total_tokens)
        self.record(call)
        if self.hold is not None and attempt_key is not None and self.host == self.hold.reference:
            self.hold.record(attempt_key, body, answer)
        return 200, answer, call

    def record(self, call: ModelCall) -> None:
        with self._lock:
            self.calls.append(call)

    def spend(self, tokens: int) -> None:
        """Count an answer's tokens against ``max_total_tokens``."""
        with self._lock:
            self._tokens += tokens

    # -- exec agents: their own SDK, any wire API of the suite's family, streamed or not ------------

    def attempt_token(self, attempt: str) -> str:
        """The placeholder API key of ``attempt`` on this proxy (what its runner derives)."""
        return attempt_token(self.secret, attempt)

    def authorised(self, headers: Mapping[str, str], attempt: str | None, query: str = "") -> bool:
        """Whether a request carries ``attempt``'s placeholder (``Authorization: Bearer``,
        ``x-api-key``, ``x-goog-api-key`` or Gemini's ``?key=``)."""
        if not attempt:
            return False
        headers = {k.lower(): v for k, v in headers.items()}
        auth = headers.get("authorization") or ""
        given = (headers.get("x-api-key") or headers.get("x-goog-api-key")
                 or (auth[7:] if auth[:7].lower() == "bearer " else "")
                 or dict(urllib.parse.parse_qsl(query)).get("key", ""))
        return secrets.compare_digest(given.strip().encode(), self.attempt_token(attempt).encode())

    def api_error(self, kind: str, message: str, *, code: str | None = None) -> JSONObject:
        """An error body in the format of the suite's ``api`` (so the agent's SDK raises it as such)."""
        return family_api(self.api).error_body(kind, message, code)

    def wanted_paths(self) -> str:
        """The paths an exec agent of the suite's ``api`` may POST below its prefix, for a refusal."""
        return " or ".join(api.example_path for api in APIS if api.family == self.api)

    def refuse_api(self, attempt: str, path: str, api: WireApi | None) -> tuple[JSONObject, ModelCall]:
        """An exec agent's request of an API the suite did not declare (or of none): a model call of
        its own, refused, and the attempt's error, the harness's (its verdict ``error``): the message
        names the API the agent spoke and the fix."""
        spoke = f"{path} ({api.title})" if api is not None else f"{path}, a path of no API the proxy speaks"
        fix = (f"set api = {api.family!r} in the suite's [agent] (with that provider's base_url), or point the agent "
               f"at {family_api(self.api).title}" if api is not None else
               f"point the agent at {EXEC_PREFIX}<attempt>{self.wanted_paths()}")
        message = f"{REFUSED_API}{spoke}; this suite's api is {self.api!r}: {fix}"
        call = self.new_call()
        call.status, call.error, call.message, call.path = 404, ERR_REFUSED, message, path
        self.record(call)
        self.refused(f"POST {EXEC_PREFIX}{attempt}{path}")
        if attempt:
            self.book.call(attempt, call_record(call))
            self.book.stop(attempt, error=message)
        return self.api_error(ERR_REFUSED, message), call


@contextlib.contextmanager
def model_route(
    host: Host,
    agent: ProxyConfig | None,
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
    proxy = ModelProxy.from_config(agent, hold=hold, host=name)
    with proxy:
        port: int | None = None
        try:
            if host.reaches_controller_loopback:
                url = proxy.url
            else:
                port = host.forward_remote(proxy.port)
                url = model_url(port)
            # the runner's, never an attempt's: it derives each attempt's own placeholder from it
            yield {MODEL_URL_ENV: url, MODEL_PASS_ENV: proxy.secret}
        finally:
            if port is not None:
                host.cancel_forward(port)
            if record_dir is not None:
                with contextlib.suppress(OSError):
                    record_dir.mkdir(parents=True, exist_ok=True)
                    proxy.write_jsonl(record_dir / "model_calls.jsonl")
