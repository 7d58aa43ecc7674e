"""What every ``Host`` backend must do, as checks a new backend runs against itself.

``self_check(host, local_dir)`` runs them all and returns the failures (check name -> what went
wrong); an empty dict means the backend conforms. Each check is also importable on its own
(``CHECKS``), so a test suite can run one test per backend and check. The checks need a POSIX shell,
``mktemp``, ``sleep``, ``printf``, ``cat`` and ``python3`` on the host (what the runner needs anyway).

What a backend promises: exit codes are data (only transport failures raise), output comes back
separately and exactly, arguments arrive without a shell in between, stdin is closed, a timeout kills
the whole command (nothing outlives it), files round-trip byte for byte, file errors are
``TransferError`` naming the host, the host can reach a service on the controller's loopback
(directly, or through ``forward_remote``), and ``close`` is idempotent.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from orchestrator.errors import TransferError
from orchestrator.hosts.transport.base import Host

#: one check: the host, a scratch directory on it (removed afterwards), a local scratch directory
Check = Callable[[Host, str, Path], None]

#: starts a sleeper that does not hold the command's output open, and prints its pid
DETACHED_SLEEPER = "sleep 30 >/dev/null 2>&1 & echo $!"
#: exit 0 iff the process whose pid is in {pidfile} still runs (a zombie awaiting its reaper is dead)
ALIVE_CHECK = 'p=$(cat {pidfile}); s=$(cut -d" " -f3 /proc/$p/stat 2>/dev/null); test -n "$s" -a "$s" != Z'
#: run on the host: connect to 127.0.0.1:<argv[1]>, send argv[2], print the answer
CLIENT = (
    "import socket,sys\n"
    "s=socket.create_connection(('127.0.0.1',int(sys.argv[1])),timeout=5)\n"
    "s.sendall(sys.argv[2].encode()); s.shutdown(socket.SHUT_WR)\n"
    "print(s.recv(1024).decode())\n"
)


class ConformanceError(AssertionError):
    """A backend does not do what ``Host`` promises; the message says what it did instead."""


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise ConformanceError(what)


@contextlib.contextmanager
def scratch_dir(host: Host) -> Iterator[str]:
    """A fresh directory on the host (``mktemp -d``), removed afterwards."""
    made = host.exec(["mktemp", "-d"], timeout=10)
    _expect(made.ok and made.stdout.strip() != "", f"mktemp -d failed: {made}")
    path = made.stdout.strip()
    try:
        yield path
    finally:
        with contextlib.suppress(Exception):
            host.exec(["rm", "-rf", path], timeout=10)


# ---------------------------------------------------------------------------------------- exec


def check_exit_codes_are_data(host: Host, remote_dir: str, local_dir: Path) -> None:
    _expect(host.exec(["true"], timeout=10).exit_code == 0, "true did not exit 0")
    _expect(host.exec(["false"], timeout=10).exit_code == 1, "false did not exit 1")
    r = host.exec(["sh", "-c", "exit 3"], timeout=10)
    _expect((r.exit_code, r.ok, r.timed_out) == (3, False, False), f"exit 3 came back as {r}")
    _expect(r.argv == ("sh", "-c", "exit 3"), f"the result names argv {r.argv!r}")


def check_missing_command_is_exit_127(host: Host, remote_dir: str, local_dir: Path) -> None:
    r = host.exec(["crosshost-no-such-command", "x"], timeout=10)
    _expect(r.exit_code == 127, f"a missing command exited {r.exit_code}, not 127")
    _expect("crosshost-no-such-command" in r.stderr, f"stderr does not name the command: {r.stderr!r}")


def check_stdout_and_stderr_come_back_separately(host: Host, remote_dir: str, local_dir: Path) -> None:
    r = host.exec(["sh", "-c", "echo out; echo err >&2"], timeout=10)
    _expect((r.exit_code, r.stdout, r.stderr) == (0, "out\n", "err\n"), f"got {r}")


def check_arguments_arrive_exactly(host: Host, remote_dir: str, local_dir: Path) -> None:
    args = ["a b", "it's", "$HOME", "*", '"q"', "semi;colon", "new\nline"]
    r = host.exec(["printf", "%s|", *args], timeout=10)
    _expect(r.exit_code == 0 and r.stdout == "".join(f"{a}|" for a in args), f"printf printed {r.stdout!r}")


def check_stdin_is_closed(host: Host, remote_dir: str, local_dir: Path) -> None:
    r = host.exec(["cat"], timeout=10)
    _expect((r.exit_code, r.stdout, r.timed_out) == (0, "", False), f"cat with no input: {r}")


def check_timeout_kills_the_command_and_its_children(host: Host, remote_dir: str, local_dir: Path) -> None:
    pidfile = shlex.quote(f"{remote_dir}/sleeper.pid")
    alive = ["sh", "-c", ALIVE_CHECK.format(pidfile=pidfile)]
    # the check itself works: a live sleeper is seen as alive
    _expect(host.exec(["sh", "-c", f"{DETACHED_SLEEPER} > {pidfile}"], timeout=10).ok, "cannot start a sleeper")
    _expect(host.exec(alive, timeout=10).exit_code == 0, "a running sleeper is not seen as alive")
    host.exec(["sh", "-c", f"kill $(cat {pidfile})"], timeout=10)
    r = host.exec(["sh", "-c", f"sleep 30 & echo $! > {pidfile}; wait"], timeout=1)
    _expect(r.timed_out and not r.ok and r.exit_code == 137, f"a command past its timeout came back as {r}")
    _expect(0.5 <= r.duration_s < 10, f"the timeout of 1 s took {r.duration_s} s")
    _expect(host.exec(alive, timeout=10).exit_code != 0, "the timed-out command's child is still running")


# --------------------------------------------------------------------------------------- files


def check_put_get_round_trip_is_byte_exact(host: Host, remote_dir: str, local_dir: Path) -> None:
    payload = os.urandom(300_000) + b"\x00\r\n\xff end"
    src, back = local_dir / "src.bin", local_dir / "back.bin"
    src.write_bytes(payload)
    host.put(src, f"{remote_dir}/bundle.bin")
    host.get(f"{remote_dir}/bundle.bin", back)
    _expect(back.read_bytes() == payload, "the file came back different")


def check_get_of_a_missing_file_is_a_transfer_error(host: Host, remote_dir: str, local_dir: Path) -> None:
    try:
        host.get(f"{remote_dir}/no-such-file", local_dir / "x")
    except TransferError as exc:
        _expect(exc.host == host.name and exc.exit_code == 3, f"the error names {exc.host!r}, exit {exc.exit_code}")
        return
    raise ConformanceError("get of a missing file did not raise TransferError")


def check_get_is_bounded_whatever_the_host_says(host: Host, remote_dir: str, local_dir: Path) -> None:
    """A host swaps a file for a link to /dev/zero or for one larger than it said: get refuses
    anything but a regular file and stops at ``max_bytes``, keeping nothing of the copy."""
    d = shlex.quote(remote_dir)
    made = host.exec(["sh", "-c", f"ln -s /dev/zero {d}/zero && truncate -s 64M {d}/big"], timeout=10)
    _expect(made.ok, f"cannot make the files: {made.stderr}")
    for name, cap in (("zero", None), ("big", 1_000_000)):
        back = local_dir / f"{name}.back"
        try:
            host.get(f"{remote_dir}/{name}", back, max_bytes=cap)
        except TransferError as exc:
            _expect(exc.host == host.name, f"the error names {exc.host!r}")
            _expect(not back.exists(), f"get of {name} left {back} behind")
            continue
        raise ConformanceError(f"get of {name} was not refused ({back.stat().st_size} bytes copied)")


def check_put_into_a_missing_directory_is_a_transfer_error(host: Host, remote_dir: str, local_dir: Path) -> None:
    src = local_dir / "f"
    src.write_text("x")
    try:
        host.put(src, f"{remote_dir}/no-such-dir/f")
    except TransferError:
        return
    raise ConformanceError("put into a missing directory did not raise TransferError")


# ----------------------------------------------------------------------------------- the proxy


def check_reaches_the_controllers_loopback(host: Host, remote_dir: str, local_dir: Path) -> None:
    """What the model proxy needs: a process on the host reaches a port on the controller's
    127.0.0.1, directly (``reaches_controller_loopback``) or through ``forward_remote``."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(15)

        def answer() -> None:
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                with conn:
                    conn.sendall(b"controller:" + conn.recv(1024))

        threading.Thread(target=answer, daemon=True).start()
        port = server.getsockname()[1]
        forwarded = None if host.reaches_controller_loopback else host.forward_remote(port)
        try:
            r = host.exec(["python3", "-c", CLIENT, str(forwarded or port), "hello"], timeout=15)
        finally:
            if forwarded is not None:
                host.cancel_forward(forwarded)
        _expect((r.exit_code, r.stdout.strip()) == (0, "controller:hello"), f"the host could not reach it: {r}")


# ----------------------------------------------------------------------------------- lifecycle


def check_close_is_idempotent(host: Host, remote_dir: str, local_dir: Path) -> None:
    host.close()
    host.close()


#: a real command runner (LocalHost, SshHost, any new backend)
EXEC_CHECKS: tuple[Check, ...] = (
    check_exit_codes_are_data,
    check_missing_command_is_exit_127,
    check_stdout_and_stderr_come_back_separately,
    check_arguments_arrive_exactly,
    check_stdin_is_closed,
    check_timeout_kills_the_command_and_its_children,
    check_reaches_the_controllers_loopback,
)
#: moving files; the first two hold for any backend, the third needs directories on the host
FILE_CHECKS: tuple[Check, ...] = (
    check_put_get_round_trip_is_byte_exact,
    check_get_of_a_missing_file_is_a_transfer_error,
    check_get_is_bounded_whatever_the_host_says,
    check_put_into_a_missing_directory_is_a_transfer_error,
)
#: everything a backend of real hosts passes; ``check_close_is_idempotent`` last (it closes the host)
CHECKS: tuple[Check, ...] = (*EXEC_CHECKS, *FILE_CHECKS, check_close_is_idempotent)


def self_check(host: Host, local_dir: Path, checks: tuple[Check, ...] = CHECKS) -> dict[str, str]:
    """Run ``checks`` on ``host``, each in a fresh scratch directory; the failures, by check name."""
    failures: dict[str, str] = {}
    for check in checks:
        work = local_dir / check.__name__
        work.mkdir(parents=True, exist_ok=True)
        try:
            with scratch_dir(host) as remote_dir:
                check(host, remote_dir, work)
        except Exception as exc:  # a backend's failure is a finding of this check, not of the run
            failures[check.__name__] = f"{type(exc).__name__}: {exc}"
    return failures
