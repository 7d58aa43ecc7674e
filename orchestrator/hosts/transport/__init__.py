"""One transport abstraction: ``Host`` with exec/put/get/close; one module per backend.

``open_host(cfg)`` is the one way the controller gets a Host for an inventory entry: LocalHost for
``transport = "local"``, SshHost for ``"ssh"`` with retries on transient connect errors only,
DockerHost for ``"docker"`` (a container: started from an image, or an existing one) and CommandHost
for ``"command"`` (an exec-style argv prefix: ``kubectl exec -i pod --``, ``nsenter -t PID -a``).
"""

from __future__ import annotations

import datetime as _dt
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.errors import HostUnreachable
from orchestrator.hosts.inventory import HostConfig
from orchestrator.hosts.transport.base import ConnectRetry, ExecResult, Host
from orchestrator.hosts.transport.command import CommandHost
from orchestrator.hosts.transport.local import LocalHost

if "paramiko" not in sys.modules and "invoke" not in sys.modules:
    # paramiko.config imports invoke (and with it unittest.mock: ~60 ms of every start) only to run
    # ssh_config "Match exec" lines, which crosshost refuses before any lookup (sshconfig.read), and
    # paramiko treats a missing invoke as "Match exec unavailable". Hidden for paramiko's own import
    # only: a later `import invoke` works as usual.
    sys.modules["invoke"] = None  # type: ignore[assignment]
    try:
        import paramiko  # noqa: F401
    finally:
        del sys.modules["invoke"]

from orchestrator.hosts.transport.ssh import SshHost  # noqa: E402

if TYPE_CHECKING:
    import tenacity

__all__ = ["CommandHost", "ExecResult", "Host", "LocalHost", "Opener", "SshHost", "default_opener", "open_host", "CONNECT_ATTEMPTS"]

#: connect attempts per host before it is reported unreachable
CONNECT_ATTEMPTS = 5
#: the whole retry sequence (attempts + waits) stays within this many connect timeouts
_BUDGET_CONNECT_TIMEOUTS = 2.0

RetryCallback = Callable[[ConnectRetry], None]
#: how a command gets a Host for an inventory entry: ``opener(cfg, accept_new=..., on_retry=...)``;
#: ``default_opener`` in use, another one in tests (a LocalHost per name, a counting host, ...)
Opener = Callable[..., Host]


def open_host(
    cfg: HostConfig,
    *,
    accept_new: bool = False,
    on_retry: RetryCallback | None = None,
) -> Host:
    """Connect to ``cfg``'s host.

    Only ``HostUnreachable`` (refused, timed out, reset, no banner) is retried, with jittered
    exponential backoff, at most ``CONNECT_ATTEMPTS`` times and within ~2 x connect_timeout_s in
    total. Host-key and authentication errors are raised at once: retrying them hides a problem.
    Every retry is reported to ``on_retry`` as ``{"host", "attempt", "error", "wait_s", "at"}``,
    because a hidden retry is a hidden measurement (the replay writes them to the manifest).
    """
    if cfg.transport == "local":
        return LocalHost(cfg.name)
    if cfg.transport == "docker":
        from orchestrator.hosts.transport.docker import DockerHost

        return DockerHost(cfg)  # a daemon's answer is final: nothing transient to retry
    if cfg.transport == "command":
        assert cfg.argv is not None
        return CommandHost(cfg.name, cfg.argv, python=cfg.python, connect_timeout_s=cfg.connect_timeout_s)

    budget_s = cfg.connect_timeout_s * _BUDGET_CONNECT_TIMEOUTS
    started = time.monotonic()
    # The first attempt without the retry library: most connects succeed at once, and its import
    # (tenacity's, with asyncio's parts) is then never paid. A failed first attempt is handed to it
    # as its attempt 1, so the retries, the waits, the budget and the reports are as they were.
    try:
        return SshHost(cfg, accept_new=accept_new)
    except HostUnreachable as exc:
        return _retried(cfg, accept_new, on_retry, exc, started, budget_s)


def _retried(
    cfg: HostConfig,
    accept_new: bool,
    on_retry: RetryCallback | None,
    failed_first: HostUnreachable,
    started: float,
    budget_s: float,
) -> Host:
    """``open_host`` after its first attempt failed with ``failed_first``: that failure is attempt 1."""
    import tenacity

    first: HostUnreachable | None = failed_first

    def report(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait_s = state.next_action.sleep if state.next_action is not None else 0.0
        if on_retry is not None:
            on_retry(
                ConnectRetry(
                    host=cfg.name,
                    attempt=state.attempt_number,
                    error=exc.one_line() if isinstance(exc, HostUnreachable) else repr(exc),
                    wait_s=round(float(wait_s), 3),
                    at=_dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds"),
                )
            )

    def attempt() -> Host:
        nonlocal first
        if first is not None:
            failed, first = first, None
            raise failed
        return SshHost(cfg, accept_new=accept_new)

    retrying = tenacity.Retrying(
        # a name that does not resolve is HostUnreachable too, but not transient: not retried
        retry=tenacity.retry_if_exception(lambda e: isinstance(e, HostUnreachable) and e.transient),
        # the budget counts from before the first attempt, which ran before this sequence started
        stop=tenacity.stop_after_attempt(CONNECT_ATTEMPTS)
        | tenacity.stop_before_delay(budget_s - (time.monotonic() - started)),
        # Jitter on top of a growing floor: purely random waits can spend every attempt within a second.
        # `multiplier`, not the deprecated `initial` (a DeprecationWarning): hence tenacity >= 9.2.1.
        wait=tenacity.wait_exponential_jitter(multiplier=0.5, max=max(1.0, cfg.connect_timeout_s / 2), jitter=0.25),
        before_sleep=report,
        reraise=True,
    )
    try:
        host: Host = retrying(attempt)
    except HostUnreachable as exc:
        attempts = retrying.statistics.get("attempt_number", 1)
        raise HostUnreachable(
            cfg.name, f"{exc} (gave up after {attempts} attempt(s) in {time.monotonic() - started:.1f}s)"
        ) from exc
    return host


default_opener: Opener = open_host
