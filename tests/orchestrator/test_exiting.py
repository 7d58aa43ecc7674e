"""A crosshost process ends without the interpreter's finalisation, but with all of a normal exit a
user relies on: the exit status, the command's other threads finished, atexit's handlers run, and
stdout and stderr whole even through a pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.exiting import exit_status

PROGRAM = """
import atexit, sys, threading, time
from orchestrator.exiting import end_process

class Finalised:
    def __del__(self):
        print("finalised", flush=True)

kept = Finalised()  # freed by a normal exit's teardown of this module, never by end_process
atexit.register(lambda: print("atexit ran"))
def slow():
    time.sleep(0.3)
    print("thread done")
threading.Thread(target=slow).start()
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # a daemon is not waited for
sys.stdout.write("x" * 100_000 + "\\n")  # buffered: a pipe takes 64 KiB at once
print("to stderr", file=sys.stderr)
end_process(CODE)
"""


@pytest.mark.parametrize("code,status", [(None, 0), (0, 0), (3, 3), (130, 130), (256 + 2, 2), ("no such run", 1)])
def test_a_process_ends_with_its_status_its_threads_done_and_its_output_whole(code: object, status: int) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # its output is buffered, as by default
    done = subprocess.run([sys.executable, "-c", PROGRAM.replace("CODE", repr(code))], capture_output=True,
                          text=True, timeout=30, env=env)
    assert done.returncode == status, done.stderr
    lines = done.stdout.splitlines()
    assert lines == ["x" * 100_000, "thread done", "atexit ran"]  # and never "finalised"
    assert done.stderr.splitlines() == ["to stderr", *([code] if isinstance(code, str) else [])]


def test_exit_status_is_what_sys_exit_would_end_with() -> None:
    assert [exit_status(c) for c in (None, 0, 1, 2, 255)] == [0, 0, 1, 2, 255]


def test_a_reader_that_left_is_no_traceback() -> None:
    """Output still buffered when the reader has gone (``crosshost ... | head``): the flush's EPIPE is
    no traceback and the status stays the command's."""
    program = ("import sys, time\nfrom orchestrator.exiting import end_process\n"
               "sys.stdout.write('y' * 100)\ntime.sleep(0.5)\nend_process(4)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # its output is buffered, as by default
    proc = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # gone before the program flushes
    err = proc.stderr.read()
    assert proc.wait(timeout=30) == 4 and err == b"", err


def test_a_pool_never_shut_down_does_not_keep_the_process() -> None:
    """An executor's idle workers are not daemons: the interpreter's exit tells them to end before it
    waits for them, and so does this end."""
    program = ("from concurrent.futures import ThreadPoolExecutor\nfrom orchestrator.exiting import end_process\n"
               "pool = ThreadPoolExecutor(2)\nprint(pool.submit(lambda: 6 * 7).result())\nend_process(0)\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (0, "42\n"), done.stderr


def test_under_a_profiler_the_process_ends_as_sys_exit_so_the_profile_is_written(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text("from orchestrator.exiting import end_process\nend_process(5)\n")
    out = tmp_path / "prof.out"
    done = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(out), str(script)], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr  # cProfile ends every program it ran so, sys.exit's too
    assert out.stat().st_size > 0


def test_output_the_disk_could_not_take_is_said_and_the_status_is_not_a_success() -> None:
    """The interpreter's own exit says so and exits 120 when its last flush fails; so does this end."""
    program = "import sys\nfrom orchestrator.exiting import end_process\nsys.stdout.write('z' * 100)\nend_process(0)\n"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-c", program], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=30, env=env)
    assert done.returncode == 120
    assert done.stderr == "crosshost: the last of stdout could not be written: No space left on device\n"
