"""Reading a child's output without holding more than a cap of it.

A predicate or a shell tool may print without end (``cat /dev/zero``): its output is read as it
comes, the first (``keep="head"``) or last (``keep="tail"``) ``cap`` bytes kept, the rest drained and
counted, so the runner's memory is bounded whatever the child prints. Standard library only.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from typing import Callable, Optional

from .recordclass import dataclass
from .sandbox import Started

CHUNK = 1 << 16
#: after the child ended or was killed, how long a pipe held open by its strays is still drained
DRAIN_S = 2.0


@dataclass
class Captured:
    """A child's output, of which only the last bytes are kept, and how it ended."""

    kept: bytes
    total: int  # every byte the child printed, kept or not
    returncode: Optional[int]
    timed_out: bool
    oom: Optional[bool] = None  # the kernel's OOM killer ran while it did (None: unknown)

    @property
    def dropped(self) -> int:
        return self.total - len(self.kept)

    @property
    def signal_name(self) -> Optional[str]:
        """The signal that ended the child (``SIGKILL``, ``SIGSEGV``...), None when it exited."""
        return signal_name(self.returncode)

    @property
    def death(self) -> Optional[str]:
        """How it ended when not by a plain exit of its own (``death``), never a timeout."""
        return death(self.returncode, self.oom)


def signal_name(returncode: Optional[int]) -> Optional[str]:
    """The signal a ``subprocess`` return code says ended the process, None when it exited."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def death(returncode: Optional[int], oom: Optional[bool] = None) -> Optional[str]:
    """How a child ended when not by its own plain exit, in the words a person reads; None when it
    just exited. ``oom``: whether the kernel's OOM killer ran meanwhile (None: the kernel does not say,
    and a SIGKILL unasked is then usually the OOM killer). A child that exited after the OOM killer
    ended one of its own children (a test run under ``sh``) is said to have met it too."""
    name = signal_name(returncode)
    if name is None:
        failed = returncode is not None and returncode != 0
        return "the kernel's OOM killer killed a process while it ran (out of memory)" if failed and oom else None
    if name == "SIGKILL" and oom is not None:
        return "killed by SIGKILL: out of memory (the kernel's OOM killer)" if oom else \
            "killed by SIGKILL (not by the OOM killer)"
    if name == "SIGKILL":
        return "killed by SIGKILL (out of memory, or killed from outside)"
    return f"killed by {name}"


def capture(
    proc: "subprocess.Popen[bytes]",
    timeout_s: float,
    cap: int,
    keep: str = "head",
    on_timeout: Optional[Callable[[], None]] = None,
) -> Captured:
    """Read ``proc.stdout`` until EOF or ``timeout_s``; then ``on_timeout`` (kill it) and a short drain."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    kept = bytearray()
    total = 0
    timed_out = False
    deadline = time.monotonic() + max(timeout_s, 0.01)
    drain_until: Optional[float] = None
    try:
        while True:
            now = time.monotonic()
            if drain_until is None and now >= deadline:
                timed_out = True
                if on_timeout is not None:
                    on_timeout()
                drain_until = now + DRAIN_S
            if drain_until is None and proc.poll() is not None:
                drain_until = now + DRAIN_S  # it ended: what its strays still print is drained briefly
            limit = deadline if drain_until is None else drain_until
            if drain_until is not None and now >= drain_until:
                break
            ready, _, _ = select.select([fd], [], [], max(0.0, min(limit - now, 0.5)))
            if not ready:
                continue
            chunk = os.read(fd, CHUNK)
            if not chunk:
                break
            total += len(chunk)
            if keep == "head":
                if len(kept) < cap:
                    kept += chunk[: cap - len(kept)]
            else:
                kept += chunk
                if len(kept) > cap:
                    del kept[: len(kept) - cap]
    finally:
        proc.stdout.close()
    try:
        returncode: Optional[int] = proc.wait(timeout=DRAIN_S if not timed_out else 10)
    except subprocess.TimeoutExpired:
        returncode = None
    oom = proc.oom_killed() if isinstance(proc, Started) else None
    return Captured(bytes(kept), total, returncode, timed_out, oom)
