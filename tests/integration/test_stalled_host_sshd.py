"""A host that stops answering mid-run (its sshd and everything under it SIGSTOPped): the TCP
connection stays open and silent. The controller's liveness requests go unanswered, so the host is
declared unreachable within connect_timeout_s + the reply grace, far below the run's own timeout, and
the other host's results stand.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.commands.replay import ReplayRequest, replay
from orchestrator.hosts.transport import ssh
from orchestrator.store.rundir import RunDir
from tests.integration.test_replay_sshd import _slow_suite

pytestmark = pytest.mark.sshd


def _tree(root: int) -> list[int]:
    """``root`` and every process under it, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def test_a_stopped_host_is_unreachable_within_60_s(
    fresh_sshd_host: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the grace is injected short: what is tested is that it ends the wait, not its default length
    monkeypatch.setattr(ssh, "REPLY_GRACE_S", 3.0)
    suite = _slow_suite(tmp_path, tasks=2, sleep_s=100)
    host = fresh_sshd_host.fleet.hosts["box-c"]
    stopped: list[int] = []

    def stop() -> None:
        root = host.ns_pid()
        assert root is not None
        for pid in _tree(root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)

    armed: list[bool] = []

    def hook(name: str, stage: str, detail: str) -> None:
        # once: a host whose bundle is not there yet enters "run" twice (refused, pushed, run again)
        if name == "box-c" and stage == "run" and not armed:
            armed.append(True)
            threading.Timer(2.0, stop).start()

    started = time.monotonic()
    try:
        out = replay(
            ReplayRequest(suite_dir=suite, inventory_path=fresh_sshd_host.inventory_path, out=tmp_path / "runs",
                          hosts=["box-c"]),
            on_event=hook, with_analysis=False,
        )  # fmt: skip
        elapsed = time.monotonic() - started
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    m = RunDir(out.run_dir.path).read_manifest()
    assert stopped, "the host was never stopped"
    error = m.hosts["box-c"].error or ""
    assert "box-c: HostUnreachable" in error and "answered nothing" in error, error
    assert elapsed < 60, f"took {elapsed:.0f}s"
    assert out.exit_code == 3
    assert m.hosts["box-c"].workspace_removed is not True  # it could not be asked; never claimed removed


def test_ctrl_c_with_a_stopped_host_ends_within_5_s_and_says_what_was_left(
    fresh_sshd_host: Any, tmp_path: Path
) -> None:
    from orchestrator.ui import interrupted_line

    suite = _slow_suite(tmp_path, tasks=2, sleep_s=100)
    host = fresh_sshd_host.fleet.hosts["box-c"]
    stopped: list[int] = []
    pressed: list[float] = []

    def stop() -> None:
        root = host.ns_pid()
        assert root is not None
        for pid in _tree(root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)

    def ctrl_c() -> None:
        pressed.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    armed: list[bool] = []

    def hook(name: str, stage: str, detail: str) -> None:
        # once: a host whose bundle is not there yet enters "run" twice (refused, pushed, run again)
        if name == "box-c" and stage == "run" and not armed:
            armed.append(True)
            threading.Timer(2.0, stop).start()
            threading.Timer(4.0, ctrl_c).start()

    try:
        out = replay(
            ReplayRequest(suite_dir=suite, inventory_path=fresh_sshd_host.inventory_path, out=tmp_path / "runs",
                          hosts=["box-c"]),
            on_event=hook, with_analysis=False,
        )  # fmt: skip
        ended = time.monotonic()
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert stopped and pressed
    assert ended - pressed[0] < 5, f"Ctrl-C took {ended - pressed[0]:.1f}s"
    assert out.exit_code == 130
    m = RunDir(out.run_dir.path).read_manifest()
    assert m.hosts["box-c"].workspace_removed is False
    line = interrupted_line(m)
    assert "workspace NOT removed on box-c" in line and "workspace removed on" not in line, line


# A deadline of seconds on the controller's own work after Ctrl-C: alone, never beside the main lane's
# workers (there, a loaded machine took 5.8 s over a push and 6.6 s over a connect)
@pytest.mark.serial
@pytest.mark.parametrize("stage", ["connect", "push", "pull", "clean"])
def test_ctrl_c_abandons_a_host_stopped_in_any_stage_within_5_s(
    fresh_sshd_host: Any, tmp_path: Path, stage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """box-c's sshd is stopped the moment it enters ``stage``, Ctrl-C a second later: the replay ends
    within 5 s of it, and its last line says where the workspace was removed (local), where it was
    NOT (box-c, whose answer never came) or that none was made (box-c stopped while connecting).
    At the default connect timeout (10 s), which a stopped host would otherwise hold each wait for."""
    from orchestrator.hosts import remote
    from orchestrator.ui import interrupted_line

    # an archive small enough comes home in the run's own output, whose exec then removes the
    # workspace: a fetched one keeps the host needed in the pull and the clean, the stages tried here
    monkeypatch.setattr(remote, "INLINE_MAX_BYTES", 0)
    suite = _slow_suite(tmp_path, tasks=1, sleep_s=0.2)
    inventory = fresh_sshd_host.fleet.write_inventory(tmp_path / "hosts.toml", ["box-c"])
    host = fresh_sshd_host.fleet.hosts["box-c"]
    stopped: list[int] = []
    pressed: list[float] = []

    def ctrl_c() -> None:
        pressed.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    def hook(name: str, at: str, detail: str) -> None:
        if name == "box-c" and at == stage and not stopped:
            root = host.ns_pid()
            assert root is not None
            for pid in _tree(root):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
            threading.Timer(1.0, ctrl_c).start()

    try:
        out = replay(
            ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs", hosts=["local", "box-c"]),
            on_event=hook, with_analysis=False,
        )  # fmt: skip
        ended = time.monotonic()
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert stopped and pressed, f"box-c never reached {stage}"
    assert ended - pressed[0] < 5, f"Ctrl-C in {stage} took {ended - pressed[0]:.1f}s"
    assert out.exit_code == 130
    m = RunDir(out.run_dir.path).read_manifest()
    assert m.hosts["local"].workspace_removed is True
    line = interrupted_line(m)
    assert "workspace removed on local;" in line, line
    if stage == "connect":
        assert m.hosts["box-c"].workspace_removed is None
        assert line.endswith("none created on box-c"), line
    else:
        assert m.hosts["box-c"].workspace_removed is False
        assert "workspace NOT removed on box-c (" in line, line
