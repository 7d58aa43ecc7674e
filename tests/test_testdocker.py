"""tools/testdocker.py's leases: the last test session out leaves a daemon it started with nothing to wait for."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tools import testdocker


def test_the_last_lease_out_removes_the_sessions_containers_before_it_stops_the_daemon(
        tmp_path: Path, monkeypatch: Any) -> None:
    """A container still running when the daemon is told to stop makes the stop wait out the container's
    stop timeout (11 s for one, 30 s at the end of a whole test session): the hosts' and the tests' own
    containers are removed first, and only by the last lease of a daemon the leases started; the
    daemon is stopped whatever the removal did."""
    calls: list[tuple[str, ...]] = []

    def docker(*args: str, timeout: float = 120, **_: Any) -> subprocess.CompletedProcess[bytes]:
        calls.append(args)
        listed = {"label=crosshost.host": b"c1\n", "label=crosshost.test": b"box\n"}
        out = listed.get(args[-1], b"") if args[:2] == ("ps", "-aq") else b""
        return subprocess.CompletedProcess(["docker", *args], 0, out, b"")

    @contextlib.contextmanager
    def locked() -> Iterator[None]:
        yield

    monkeypatch.setattr(testdocker, "LEASES", tmp_path / "leases")
    monkeypatch.setattr(testdocker, "STARTED_BY_LEASE", tmp_path / "started-by-lease")
    monkeypatch.setattr(testdocker, "_locked", locked)
    monkeypatch.setattr(testdocker, "_start_locked", lambda: True)
    monkeypatch.setattr(testdocker, "_stop_locked", lambda: calls.append(("STOP",)))
    monkeypatch.setattr(testdocker, "docker", docker)
    monkeypatch.setattr(testdocker, "_pid_alive", lambda pid: pid == 424242)  # the other holder below

    outer = testdocker.Lease()
    outer.__enter__()
    calls.clear()
    other = tmp_path / "leases" / "424242"  # another live session's lease
    other.touch()
    outer.__exit__(None, None, None)
    assert calls == []  # not the last out: nothing removed, nothing stopped

    outer.__enter__()
    other.unlink()
    calls.clear()
    outer.__exit__(None, None, None)
    assert calls[-2:] == [("rm", "-f", "c1", "box"), ("STOP",)]
    assert not (tmp_path / "started-by-lease").exists()

    # a daemon a person started (``up``): the last lease out neither removes nor stops anything
    monkeypatch.setattr(testdocker, "_start_locked", lambda: False)
    outer.__enter__()
    calls.clear()
    outer.__exit__(None, None, None)
    assert calls == []

    # a removal that fails (a hung daemon) still stops it
    def hung(*args: str, timeout: float = 120, **_: Any) -> subprocess.CompletedProcess[bytes]:
        raise subprocess.TimeoutExpired(["docker", *args], timeout)

    monkeypatch.setattr(testdocker, "_start_locked", lambda: True)
    outer.__enter__()
    monkeypatch.setattr(testdocker, "docker", hung)
    calls.clear()
    with contextlib.suppress(subprocess.TimeoutExpired):
        outer.__exit__(None, None, None)
    assert calls == [("STOP",)] and not (tmp_path / "started-by-lease").exists()
