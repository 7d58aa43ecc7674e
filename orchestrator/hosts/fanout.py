"""Fan-out over hosts: a bounded thread pool where one host's failure is a result, not an exception.

Like fabric's ``GroupResult``, the outcome maps each host to its value or its error; nothing one host
raises cancels the others. Ctrl-C (SIGINT while the fan-out runs in the main thread, a
``KeyboardInterrupt`` elsewhere, or one raised by a hook inside a worker) sets ``cancel``, calls
``on_interrupt`` once (to stop remote runners), drops the hosts not yet started and waits for the
running ones: their own ``finally`` blocks clean their hosts. In the main thread SIGINT is handled, not
raised, for the fan-out's whole length: a second Ctrl-C (``on_waiting``) can come at any point, also
while the first is being handled or the pool shuts down, and must not cut that cleanup short.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

_POLL_S = 0.2


class Interrupted(Exception):
    """The host's work never started because the run was interrupted."""


@dataclass
class Outcome(Generic[T]):
    host: str
    value: T | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class FanoutResult(Generic[T]):
    outcomes: dict[str, Outcome[T]] = field(default_factory=dict)
    interrupted: bool = False

    def errors(self) -> dict[str, BaseException]:
        return {h: o.error for h, o in self.outcomes.items() if o.error is not None}


#: hosts at once by default: every selected host, up to this many (each is a few threads and one SSH
#: connection). 128 at once was measured no faster at 128 hosts on two cores (the hosts' own CPU
#: bounds it) and cost the controller more CPU.
MAX_DEFAULT_JOBS = 64


def default_jobs(n_hosts: int) -> int:
    return max(1, min(MAX_DEFAULT_JOBS, n_hosts))


def fan_out(
    hosts: list[str],
    work: Callable[[str], T],
    *,
    jobs: int | None = None,
    cancel: threading.Event | None = None,
    on_interrupt: Callable[[], None] | None = None,
    on_waiting: Callable[[], None] | None = None,
) -> FanoutResult[T]:
    """Run ``work(host)`` for every host, at most ``jobs`` at once; never raises for a host.

    ``on_waiting`` is called when Ctrl-C is pressed again while the running hosts clean up.
    """
    cancel = cancel or threading.Event()
    result: FanoutResult[T] = FanoutResult()
    jobs = jobs or default_jobs(len(hosts))
    if jobs < 1:
        raise ValueError("jobs must be at least 1")

    def interrupt() -> None:
        if result.interrupted:
            return
        result.interrupted = True
        cancel.set()
        if on_interrupt is not None:
            on_interrupt()

    def guarded_work(host: str) -> T:
        if cancel.is_set():
            raise Interrupted("interrupted before it started")
        try:
            return work(host)
        except KeyboardInterrupt:
            cancel.set()  # here, in the worker, before this thread can pick up the next host
            raise

    def pressed() -> None:
        if result.interrupted and on_waiting is not None:
            on_waiting()
        interrupt()

    pool = cf.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="crosshost-host")
    futures: dict[cf.Future[T], str] = {}
    with sigint_calls(pressed):
        try:
            for host in hosts:
                futures[pool.submit(guarded_work, host)] = host
            pending = set(futures)
            while pending:
                try:
                    done, pending = cf.wait(pending, timeout=_POLL_S, return_when=cf.FIRST_COMPLETED)
                except KeyboardInterrupt:  # SIGINT left to Python: not the main thread
                    pressed()
                    continue
                for fut in done:
                    host = futures[fut]
                    if fut.cancelled():
                        result.outcomes[host] = Outcome(host, error=Interrupted("interrupted before it started"))
                        continue
                    exc = fut.exception()
                    if isinstance(exc, KeyboardInterrupt):
                        interrupt()
                        result.outcomes[host] = Outcome(host, error=Interrupted("interrupted"))
                    elif isinstance(exc, Interrupted):
                        interrupt()
                        result.outcomes[host] = Outcome(host, error=exc)
                    elif exc is not None:
                        result.outcomes[host] = Outcome(host, error=exc)
                    else:
                        result.outcomes[host] = Outcome(host, value=fut.result())
                if result.interrupted:
                    for fut in pending:
                        fut.cancel()  # not yet started: never start; running ones finish their cleanup
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    # Input order, whatever the completion order was.
    result.outcomes = {h: result.outcomes[h] for h in hosts if h in result.outcomes}
    return result


@contextlib.contextmanager
def sigint_calls(pressed: Callable[[], None]) -> Iterator[None]:
    """While in it, SIGINT calls ``pressed`` instead of raising ``KeyboardInterrupt``, and the handler
    that was there is put back after. Nothing changes outside the main thread (no handler can be set
    there) or where SIGINT is ignored (a run started in the background, under ``nohup``)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield
        return
    before = signal.signal(signal.SIGINT, lambda _sig, _frame: pressed())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
