"""The end of a crosshost process: what a normal exit does that anyone relies on, then nothing more.

A replay's interpreter holds paramiko's, pydantic's, rich's and crosshost's objects by the hundred
thousand; its finalisation tears every module down and frees each of them: 60-80 ms of a replay's wall
time, for a process that is about to be gone. ``end_process`` keeps what that exit gives a user: the command's other threads finish, every
``atexit`` handler runs (logging's flush, ``weakref.finalize``, temporary directories), stdout and
stderr are flushed; then the process ends with ``os._exit``. Files crosshost writes are closed by the
code that writes them, never by finalisation.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_status(code: object) -> int:
    """The status ``SystemExit(code)`` ends an interpreter with: None 0, an int itself, anything else
    printed to stderr and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def end_process(code: object) -> NoReturn:
    """End the process as ``sys.exit(code)`` would, without the interpreter's finalisation; as
``sys.exit`` itself under a profiler or a tracer (``python -m cProfile``, a debugger), which write
what they saw once the program returns."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        raise SystemExit(code)
    status = exit_status(code)
    if threading.current_thread() is threading.main_thread():
        # as the interpreter's exit: first the hooks that end idle pools' workers (an executor never
        # shut down), then every other thread that is not a daemon
        threading._shutdown()  # type: ignore[attr-defined]
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a reader that left (a closed pipe), or a stream closed already
            pass
    os._exit(status)
