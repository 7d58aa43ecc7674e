"""A host that lies to the controller, on real sshd hosts: what it sends back is bounded.

The run's own exec reports out.tar's size; a host can swap the file afterwards (a link to
/dev/zero, a file far larger than reported). The pull stops at its cap during the transfer,
refuses anything but a regular file, and Ctrl-C ends it within seconds.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import TransferError
from orchestrator.hosts import workspace as workspace_mod
from orchestrator.hosts.archive import ArchiveLimits, max_archive_bytes
from orchestrator.hosts.fanout import Interrupted
from orchestrator.hosts.transport import open_host
from orchestrator.hosts.transport.base import Host
from orchestrator.hosts.workspace import Workspace

pytestmark = pytest.mark.sshd


@pytest.fixture()
def ws(sshd_hosts: Any) -> Iterator[Workspace]:
    cfg = sshd_hosts.config("box-a")
    host: Host = open_host(cfg)
    space = Workspace(host, cfg.name, cfg.workspace_root, f"hostile-{uuid.uuid4().hex[:8]}")
    space.create()
    try:
        yield space
    finally:
        space.remove()
        host.close()


def _swap(ws: Workspace, script: str) -> None:
    res = ws.host.exec(["sh", "-c", f"cd {ws.path} && rm -f out.tar && {script}"], 30)
    assert res.ok, res.stderr


def _pull(ws: Workspace, tmp_path: Path, cancel: threading.Event | None = None) -> None:
    into = tmp_path / "into"
    into.mkdir(exist_ok=True)
    ws.pull(into, scratch=tmp_path, size="10240", cancel=cancel)  # what the host's exec claimed


def _left(tmp_path: Path) -> list[Path]:
    return [p for p in tmp_path.rglob("*") if p.is_file()]


@pytest.mark.parametrize(
    ("script", "said"),
    [
        ("ln -s /dev/zero out.tar", "is a symbolic link"),
        ("mkfifo out.tar", "not a regular file"),
    ],
)
def test_pull_refuses_a_link_or_special_file(ws: Workspace, tmp_path: Path, script: str, said: str) -> None:
    _swap(ws, script)
    started = time.monotonic()
    with pytest.raises(TransferError, match=said):
        _pull(ws, tmp_path)
    assert time.monotonic() - started < 10
    assert _left(tmp_path) == []


def test_pull_of_a_file_larger_than_it_said_stops_at_the_cap(
    ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workspace_mod, "PULL_LIMITS", ArchiveLimits(max_members=10, max_total_bytes=1 << 20))
    cap = max_archive_bytes(workspace_mod.PULL_LIMITS)
    _swap(ws, "truncate -s 2G out.tar")  # sparse: costs the host nothing
    seen: list[int] = []
    real_open = open

    def watching_open(file: Any, mode: str = "r", *a: Any, **kw: Any) -> Any:
        handle = real_open(file, mode, *a, **kw)
        if "w" in mode and str(file).endswith(".out.tar"):
            real_write = handle.write

            def write(data: bytes) -> int:
                seen.append(len(data))
                return real_write(data)

            handle.write = write
        return handle

    monkeypatch.setattr("builtins.open", watching_open)
    started = time.monotonic()
    with pytest.raises(TransferError, match=f"larger than the {cap} bytes allowed"):
        _pull(ws, tmp_path)
    assert time.monotonic() - started < 20
    assert 0 < sum(seen) <= cap and _left(tmp_path) == []


def test_ctrl_c_ends_a_pull_within_seconds(ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _swap(ws, "truncate -s 100G out.tar")  # the default cap: hundreds of MB to copy
    cancel = threading.Event()
    failure: list[BaseException] = []

    def pull() -> None:
        try:
            _pull(ws, tmp_path, cancel)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failure.append(exc)

    worker = threading.Thread(target=pull, daemon=True)
    worker.start()
    time.sleep(1.0)
    assert worker.is_alive()  # still copying
    pressed = time.monotonic()
    cancel.set()
    worker.join(timeout=10)
    assert not worker.is_alive() and time.monotonic() - pressed < 5
    assert len(failure) == 1 and isinstance(failure[0], Interrupted)
    assert _left(tmp_path) == []
