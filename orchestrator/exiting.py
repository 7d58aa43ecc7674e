"""The end of a crosshost process: what a normal exit does that anyone relies on, then nothing more.

A replay's interpreter holds paramiko's, pydantic's, rich's and crosshost's objects by the hundred
thousand; its finalisation tears every module down and frees each of them: 60-80 ms of a replay's wall
time, for a process that is about to be gone. ``end_process`` keeps what that exit gives a user: the
command's other threads finish, every ``atexit`` handler runs (logging's flush, ``weakref.finalize``,
temporary directories), stdout and stderr are flushed; then the process ends with ``os._exit``. Files
crosshost writes are closed by the code that writes them, never by finalisation.
"""

from __future__ import annotations

import atexit
import contextlib
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
    if _observed():
        raise SystemExit(code)
    status = exit_status(code)
    if threading.current_thread() is threading.main_thread():
        # as the interpreter's exit: first the hooks that end idle pools' workers (an executor never
        # shut down), then every other thread that is not a daemon
        threading._shutdown()  # type: ignore[attr-defined]
    else:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()
    for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
        try:
            if stream is not None:
                stream.flush()
        except (BrokenPipeError, ValueError):  # a reader that left (`... | head`), or a stream closed already
            pass
        except OSError as exc:  # the end of the output is lost (a full disk): said, and not a success
            with contextlib.suppress(OSError):
                os.write(2, f"crosshost: the last of {name} could not be written: {exc.strerror or exc}\n".encode())
            status = status or 120  # what the interpreter's own exit gives then
    os._exit(status)


def _observed() -> bool:
    """A profiler or a debugger watches this process (``sys.setprofile``/``settrace``, or from 3.12
    ``sys.monitoring``, which cProfile uses there)."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return True
    monitoring = getattr(sys, "monitoring", None)
    return monitoring is not None and any(
        monitoring.get_tool(tool) is not None for tool in (monitoring.PROFILER_ID, monitoring.DEBUGGER_ID))
