"""The proxy's side towards the provider: one request, retried with jittered backoff while no byte of
an answer has been passed on, every try recorded; a provider's text redacted of anything key-shaped.

429, 5xx and connection failures are transient (``Transient``, retried, at least a provider's
``Retry-After`` apart); any other failure is final (``Final``), a 502 to the runner. A redirect is
a final answer too, never followed: the key goes to ``base_url``'s origin and nowhere else.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, NoReturn

from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt
from tenacity.wait import wait_random_exponential

from agent_runner.jsonfile import JSONObject, JSONValue
from agent_runner.wire import CHAT_PATH, ERR_BAD_JSON, ERR_PROVIDER
from orchestrator.model.records import Attempt, ModelCall

MAX_RESPONSE_BYTES = 16 * 1024 * 1024

class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        return None  # urllib then raises the 3xx as an HTTPError: a final answer


#: what the proxy asks the provider through: urllib's usual handlers, redirects not followed
_PROVIDER = urllib.request.build_opener(_NoRedirect)

# Provider error messages may quote a masked key ("sk-ab***yz"); never relay anything key-shaped.
_KEYISH = re.compile(r"\b(sk|pk|rk|key)[-_][A-Za-z0-9_\-*.]{4,}", re.IGNORECASE)


class Transient(Exception):
    """A provider answer worth retrying (429, 5xx, no connection)."""

    def __init__(self, status: int | None, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class Final(Exception):
    """A provider answer not worth retrying; becomes a 502 to the runner, or the provider's own error
    (``body``, redacted) to an exec agent whose SDK recovers by its wording."""

    def __init__(self, kind: str, status: int | None, message: str, body: bytes | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.body = body


class Upstream:
    """The provider at ``base_url`` with the real key: requests, retries and their records."""

    def __init__(self, base_url: str, key: str, *, retry_attempts: int, retry_wait_s: float,
                 retry_max_wait_s: float, timeout_s: float, sleep: Callable[[float], None]) -> None:
        self.base_url = base_url
        self.key = key
        self.retry_attempts = max(1, retry_attempts)
        self.retry_wait_s = retry_wait_s
        self.retry_max_wait_s = retry_max_wait_s
        self.timeout_s = timeout_s
        self._sleep = sleep

    def open(self, url: str, raw: bytes, headers: dict[str, str], call: ModelCall) -> Any:
        """The provider's open response (its body not read yet), retried while no byte of an answer
        has been passed on."""

        def one_attempt() -> Any:
            number = len(call.attempts) + 1
            t0 = time.monotonic()
            request = urllib.request.Request(url, data=raw, method="POST", headers=headers)
            try:
                resp = _PROVIDER.open(request, timeout=self.timeout_s)  # noqa: S310 - the suite's URL
            except (urllib.error.URLError, OSError) as exc:
                self._failed_attempt(exc, call, number, t0)
            call.attempts.append(Attempt(number, int(resp.status), ms_since(t0)))
            return resp

        return self._retrying(call)(one_attempt)

    def chat(self, raw: bytes, call: ModelCall) -> JSONObject:
        """The built-in agent's chat completion: POST, read, check it is one; every try in ``call``."""

        def one_attempt() -> JSONObject:
            number = len(call.attempts) + 1
            t0 = time.monotonic()
            request = urllib.request.Request(
                self.base_url + CHAT_PATH,
                data=raw,
                method="POST",
                headers={
                    "Content-Type": "application/json",
                    "Accept": "application/json",
                    "Authorization": f"Bearer {self.key}",
                },
            )
            try:
                with _PROVIDER.open(request, timeout=self.timeout_s) as resp:
                    status = int(resp.status)
                    data = resp.read(MAX_RESPONSE_BYTES + 1)
            except (urllib.error.URLError, OSError) as exc:
                self._failed_attempt(exc, call, number, t0)
            call.attempts.append(Attempt(number, status, ms_since(t0)))
            if len(data) > MAX_RESPONSE_BYTES:
                raise Final(ERR_BAD_JSON, status, f"answer larger than {MAX_RESPONSE_BYTES} bytes")
            try:
                answer: JSONValue = json.loads(data)
            except ValueError:
                raise Final(ERR_BAD_JSON, status, "answer is not JSON") from None
            if (
                not isinstance(answer, dict)
                or not isinstance(answer.get("choices"), list)
                or not answer["choices"]
            ):
                raise Final(ERR_BAD_JSON, status, "answer is JSON but not a chat completion (no choices)")
            return answer

        result: JSONObject = self._retrying(call)(one_attempt)
        return result

    def _failed_attempt(self, exc: OSError, call: ModelCall, number: int, t0: float) -> NoReturn:
        """Record a failed provider request in ``call.attempts`` and raise what the retry policy acts
        on: 429, 5xx and connection errors are transient; any other status is final."""
        if isinstance(exc, urllib.error.HTTPError):
            status = int(exc.code)
            data = exc.read(64 * 1024) if exc.fp is not None else b""
            message = self.redact(_provider_message(data) or exc.reason or "")
            call.attempts.append(Attempt(number, status, ms_since(t0), error=message or f"HTTP {status}"))
            if status == 429 or status >= 500:
                raise Transient(status, message or f"HTTP {status}", _retry_after(exc.headers)) from None
            if status in (401, 403):
                message = "the provider refused the API key (check the key in the controller's environment)"
                data = b""  # about our key, not the agent's request: never relayed
            elif 300 <= status < 400:
                message = ("the provider answered a redirect, which crosshost does not follow (the key stays "
                           "with base_url's origin): set base_url to where it points")
                data = b""
            raise Final(ERR_PROVIDER, status, f"HTTP {status}: {message}",
                        self.redact(data.decode("utf-8", "replace"), limit=64 * 1024).encode() or None) from None
        text = self.redact(str(getattr(exc, "reason", exc)))
        call.attempts.append(Attempt(number, None, ms_since(t0), error=text))
        raise Transient(None, text) from None

    def _retrying(self, call: ModelCall) -> Retrying:
        """Retries of transient failures: jittered backoff, at least a provider's Retry-After, each
        wait recorded on the attempt before it."""
        base_wait = wait_random_exponential(multiplier=self.retry_wait_s, max=self.retry_max_wait_s)

        def wait(state: RetryCallState) -> float:
            seconds = float(base_wait(state))
            exc = state.outcome.exception() if state.outcome else None
            if isinstance(exc, Transient) and exc.retry_after is not None:
                seconds = max(seconds, min(exc.retry_after, self.retry_max_wait_s))
            return seconds

        def before_sleep(state: RetryCallState) -> None:
            if call.attempts and state.next_action is not None:
                call.attempts[-1].wait_s = round(float(state.next_action.sleep), 3)

        return Retrying(
            retry=retry_if_exception_type(Transient),
            stop=stop_after_attempt(self.retry_attempts),
            wait=wait,
            before_sleep=before_sleep,
            sleep=self._sleep,
            reraise=True,
        )

    def redact(self, text: str, limit: int = 300) -> str:
        text = text.replace(self.key, "[redacted]")
        return _KEYISH.sub("[redacted]", text)[:limit]


def _provider_message(data: bytes) -> str:
    try:
        body: JSONValue = json.loads(data)
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


def ms_since(since: float) -> int:
    return int((time.monotonic() - since) * 1000)
