"""One conformance suite, written against ``Host`` only, run on every backend.

LocalHost (subprocesses), FakeHost (a handler that emulates the few commands used here) and a real
SshHost on an sshd test host must agree: exit codes are data, output comes back separately and
exactly, a timeout kills the whole command (nothing survives it), files round-trip byte for byte,
file errors are TransferError, and close is idempotent.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.errors import TransferError
from orchestrator.testing import FakeHost
from orchestrator.transport import Host, LocalHost, open_host
from orchestrator.transport.base import ExecResult

#: starts a sleeper that does not hold the command's output open, and prints its pid
DETACHED_SLEEPER = "sleep 30 >/dev/null 2>&1 & echo $!"
#: exit 0 iff the process whose pid is in {pidfile} still runs (a zombie awaiting its reaper is dead)
ALIVE_CHECK = 'p=$(cat {pidfile}); s=$(cut -d" " -f3 /proc/$p/stat 2>/dev/null); test -n "$s" -a "$s" != Z'


class FakeMachine:
    """Just enough of a POSIX host for this suite, so FakeHost answers like the real backends."""

    def __init__(self) -> None:
        self.alive: set[str] = set()  # pid files whose process is running
        self.dirs = 0

    def __call__(self, argv: list[str]) -> ExecResult | tuple[int, str, str]:
        match argv:
            case ["true"] | ["cat"]:
                return 0, "", ""
            case ["false"]:
                return 1, "", ""
            case ["sh", "-c", "exit 3"]:
                return 3, "", ""
            case ["sh", "-c", "echo out; echo err >&2"]:
                return 0, "out\n", "err\n"
            case ["printf", "%s|", *args]:
                return 0, "".join(f"{a}|" for a in args), ""
            case ["mktemp", "-d"]:
                self.dirs += 1
                return 0, f"/fake/tmp.{self.dirs}\n", ""
            case ["rm", "-rf", _]:
                return 0, "", ""
            case ["sh", "-c", script] if script.startswith(DETACHED_SLEEPER + " > "):
                self.alive.add(script.rsplit(" ", 1)[1])
                return 0, "", ""
            case ["sh", "-c", script] if script.startswith("kill $(cat "):
                self.alive = {p for p in self.alive if p not in script}
                return 0, "", ""
            case ["sh", "-c", script] if script.startswith("sleep 30 & echo $! > "):
                # the background sleeper is started, then the whole command is killed at the timeout
                return ExecResult(tuple(argv), 137, "", "", 1.0, timed_out=True)
            case ["sh", "-c", script] if script.startswith(ALIVE_CHECK.split("{", 1)[0]):
                return (0, "", "") if any(p in script for p in self.alive) else (1, "", "")
            case [cmd, *_]:
                return 127, "", f"{cmd}: command not found\n"
        raise AssertionError(f"FakeMachine: unexpected argv {argv!r}")


SSH = pytest.param("ssh", marks=pytest.mark.sshd)


def _open(kind: str, request: pytest.FixtureRequest) -> Host:
    if kind == "local":
        return LocalHost()
    if kind == "fake":
        return FakeHost("fake", FakeMachine())
    return open_host(request.getfixturevalue("sshd_hosts").config("box-a"))


@pytest.fixture(params=["local", "fake", SSH])
def host(request: pytest.FixtureRequest) -> Iterator[Host]:
    h = _open(request.param, request)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture(params=["local", SSH])
def real_host(request: pytest.FixtureRequest) -> Iterator[Host]:
    """Backends with a real file system (FakeHost keeps files in a dict, without directories)."""
    h = _open(request.param, request)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def remote_dir(host: Host) -> Iterator[str]:
    r = host.exec(["mktemp", "-d"], timeout=10)
    assert r.ok, r
    path = r.stdout.strip()
    yield path
    host.exec(["rm", "-rf", path], timeout=10)


def test_exit_codes_are_data(host: Host) -> None:
    assert host.exec(["true"], timeout=10).exit_code == 0
    assert host.exec(["false"], timeout=10).exit_code == 1
    r = host.exec(["sh", "-c", "exit 3"], timeout=10)
    assert (r.exit_code, r.ok, r.timed_out) == (3, False, False)
    assert r.argv == ("sh", "-c", "exit 3")


def test_missing_command_is_exit_127_not_an_exception(host: Host) -> None:
    r = host.exec(["crosshost-no-such-command", "x"], timeout=10)
    assert r.exit_code == 127
    assert "crosshost-no-such-command" in r.stderr


def test_stdout_and_stderr_come_back_separately(host: Host) -> None:
    r = host.exec(["sh", "-c", "echo out; echo err >&2"], timeout=10)
    assert (r.exit_code, r.stdout, r.stderr) == (0, "out\n", "err\n")


def test_arguments_arrive_exactly_without_a_shell_in_between(host: Host) -> None:
    args = ["a b", "it's", "$HOME", "*", '"q"', "semi;colon", "new\nline"]
    r = host.exec(["printf", "%s|", *args], timeout=10)
    assert r.exit_code == 0
    assert r.stdout == "".join(f"{a}|" for a in args)


def test_stdin_is_closed_so_a_reader_does_not_hang(host: Host) -> None:
    r = host.exec(["cat"], timeout=10)
    assert (r.exit_code, r.stdout, r.timed_out) == (0, "", False)


def test_timeout_kills_the_command_and_its_children(host: Host, remote_dir: str) -> None:
    pidfile = f"{remote_dir}/sleeper.pid"
    # the check itself works: a live sleeper is seen as alive
    live = host.exec(["sh", "-c", f"{DETACHED_SLEEPER} > {shlex.quote(pidfile)}"], timeout=10)
    assert live.exit_code == 0
    assert host.exec(["sh", "-c", ALIVE_CHECK.format(pidfile=shlex.quote(pidfile))], timeout=10).exit_code == 0
    host.exec(["sh", "-c", f"kill $(cat {shlex.quote(pidfile)})"], timeout=10)
    r = host.exec(["sh", "-c", f"sleep 30 & echo $! > {shlex.quote(pidfile)}; wait"], timeout=1)
    assert r.timed_out and not r.ok
    assert r.exit_code == 137
    assert 0.5 <= r.duration_s < 10
    check = host.exec(["sh", "-c", ALIVE_CHECK.format(pidfile=shlex.quote(pidfile))], timeout=10)
    assert check.exit_code != 0, "the timed-out command's child is still running"


def test_put_get_round_trip_is_byte_exact(host: Host, remote_dir: str, tmp_path: Path) -> None:
    payload = os.urandom(300_000) + b"\x00\r\n\xff end"
    src = tmp_path / "src.bin"
    src.write_bytes(payload)
    back = tmp_path / "back.bin"
    host.put(src, f"{remote_dir}/bundle.bin")
    host.get(f"{remote_dir}/bundle.bin", back)
    assert back.read_bytes() == payload


def test_get_of_a_missing_file_is_a_transfer_error(host: Host, remote_dir: str, tmp_path: Path) -> None:
    with pytest.raises(TransferError) as info:
        host.get(f"{remote_dir}/no-such-file", tmp_path / "x")
    assert info.value.host == host.name
    assert info.value.exit_code == 3


def test_put_into_a_missing_directory_is_a_transfer_error(real_host: Host, tmp_path: Path) -> None:
    src = tmp_path / "f"
    src.write_text("x")
    with pytest.raises(TransferError):
        real_host.put(src, "/nonexistent-crosshost-dir/f")


def test_close_is_idempotent(host: Host) -> None:
    host.close()
    host.close()
