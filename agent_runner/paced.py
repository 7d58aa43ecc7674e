"""The runner's lines to the controller (digests on stdout, progress on stderr), a second's worth at a time.

Each write on the run exec's stdout or stderr reaches the controller as an SSH packet of its own,
which paramiko reads in Python: about 0.15 ms of the controller's CPU a packet, and a 100-task run
wrote three lines an attempt (a trace's digest, its observations' digest, the progress line), each
flushed alone. Here a line is held until ``EVERY_S`` has passed since the stream was last written,
then everything held goes out in one write; ``flush_all`` (the end of a run, and interpreter exit)
writes what is left. A runner killed by SIGKILL loses at most the last ``EVERY_S`` of lines: the
controller reads neither stream of a run that did not end (its host is a crashed runner, never
verified). Held lines live in this process only: a forked child ends with ``os._exit`` or ``exec``
and never writes them. Standard library only.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from typing import Callable, List, TextIO

#: at most one write a stream this often while lines come (0: every line at once)
EVERY_S = 1.0


class PacedLines:
    """Lines for one stream (looked up at each write, so a redirected ``sys.stdout`` is honoured)."""

    def __init__(self, stream: Callable[[], TextIO]) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._held: List[str] = []
        self._last = 0.0  # monotonic time of the last write (0: none yet, the first line goes at once)

    def line(self, text: str) -> None:
        """Send ``text`` and a newline: now, or with the next write within ``EVERY_S``."""
        with self._lock:
            self._held.append(text + "\n")
            if time.monotonic() - self._last >= EVERY_S:
                self._write()

    def flush(self) -> None:
        with self._lock:
            self._write()

    def _write(self) -> None:
        self._last = time.monotonic()
        if not self._held:
            return
        text, self._held = "".join(self._held), []
        stream = self._stream()
        stream.write(text)
        stream.flush()


STDOUT = PacedLines(lambda: sys.stdout)
STDERR = PacedLines(lambda: sys.stderr)


def flush_all() -> None:
    """Write every held line (stdout first: its digests say what the progress lines report)."""
    STDOUT.flush()
    STDERR.flush()


atexit.register(flush_all)
