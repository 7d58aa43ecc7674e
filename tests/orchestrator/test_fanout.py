"""Fan-out: one host's failure is a result; the pool is bounded; Ctrl-C stops new work only."""

from __future__ import annotations

import os
import signal
import threading
import time

from orchestrator.errors import HostUnreachable
from orchestrator.hosts.fanout import Interrupted, default_jobs, fan_out


def test_one_host_raising_does_not_cancel_the_others() -> None:
    def work(host: str) -> str:
        if host == "b":
            raise HostUnreachable("b", "connection refused")
        if host == "c":
            raise RuntimeError("a bug in one host's path")
        time.sleep(0.05)
        return host.upper()

    res = fan_out(["a", "b", "c", "d"], work, jobs=2)
    assert list(res.outcomes) == ["a", "b", "c", "d"]
    assert res.outcomes["a"].value == "A" and res.outcomes["d"].value == "D"
    assert isinstance(res.outcomes["b"].error, HostUnreachable)
    assert isinstance(res.outcomes["c"].error, RuntimeError)
    assert not res.interrupted
    assert set(res.errors()) == {"b", "c"}


def test_pool_is_bounded_by_jobs() -> None:
    lock = threading.Lock()
    running = 0
    peak = 0

    def work(host: str) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1

    fan_out([f"h{i}" for i in range(6)], work, jobs=2)
    assert peak == 2


def test_keyboard_interrupt_in_a_worker_interrupts_the_run() -> None:
    started: list[str] = []
    cancel = threading.Event()
    stopped: list[bool] = []

    b_running = threading.Event()

    def work(host: str) -> str:
        started.append(host)
        if host == "a":
            assert b_running.wait(2)
            raise KeyboardInterrupt
        b_running.set()
        # A running host sees the cancel flag and finishes its own cleanup.
        assert cancel.wait(2)
        return "cleaned"

    res = fan_out(["a", "b", "c", "d"], work, jobs=2, cancel=cancel, on_interrupt=lambda: stopped.append(True))
    assert res.interrupted and stopped == [True]
    assert isinstance(res.outcomes["a"].error, Interrupted)
    assert res.outcomes["b"].value == "cleaned"
    # c and d never started: the interrupt came before a worker was free.
    assert "c" not in started and "d" not in started
    assert isinstance(res.outcomes["c"].error, Interrupted)


def test_default_jobs() -> None:
    assert default_jobs(1) == 1 and default_jobs(32) == 32 and default_jobs(100) == 64


def test_ctrl_c_pressed_twice_at_once_still_waits_for_every_running_host() -> None:
    """Two SIGINTs within a millisecond, the second while the first is handled: no KeyboardInterrupt
    leaves the fan-out, the running host finishes its cleanup, the host not started never starts,
    and the second press is told (``on_waiting``)."""
    cancel = threading.Event()
    stopped: list[bool] = []
    waiting: list[bool] = []
    running = threading.Event()
    started: list[str] = []

    def on_interrupt() -> None:
        stopped.append(True)
        os.kill(os.getpid(), signal.SIGINT)  # the second press, while the first is being handled
        time.sleep(0.05)

    def work(host: str) -> str:
        started.append(host)
        running.set()
        assert cancel.wait(5)
        time.sleep(0.2)  # its cleanup, during which the main thread shuts the pool down
        return "cleaned"

    def press() -> None:
        assert running.wait(5)
        os.kill(os.getpid(), signal.SIGINT)

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, as in a terminal
    try:
        threading.Thread(target=press).start()
        res = fan_out(["a", "b"], work, jobs=1, cancel=cancel, on_interrupt=on_interrupt,
                      on_waiting=lambda: waiting.append(True))
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        signal.signal(signal.SIGINT, before)
    assert res.interrupted and stopped == [True] and waiting == [True]
    assert res.outcomes["a"].value == "cleaned"
    assert started == ["a"] and isinstance(res.outcomes["b"].error, Interrupted)
