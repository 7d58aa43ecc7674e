"""The runner never signals a process group by a pid that may already be another process's: once a
tool's, a predicate's or an agent's end is known its pid is free, and a process that takes it and
leads a group of its own (another attempt's, one of the host's) is left alone; a process started by
a zygote is signalled through its pidfd, never by its pid."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_runner import sandbox, tools
from agent_runner.sandbox import NONE, PIDNS_UID, Sandbox
from agent_runner.tools import ToolBox
from tests.agent_runner.test_sandbox_forks import _alive, _attempt_dir

UID = sandbox.UID_BASE + 781
CONTRACT = {"contract_id": "c", "tools": [{"name": "shell"}]}


def _at_pid(pid: int) -> subprocess.Popen[bytes] | None:
    """A process leading a group of its own at ``pid`` (the next pid the kernel gives, set through
    ``ns_last_pid``); None when another process of the machine took that pid first."""
    Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    if victim.pid == pid:
        return victim
    victim.kill()
    victim.wait()
    return None


@contextlib.contextmanager
def _victims() -> Iterator[Callable[[int], subprocess.Popen[bytes]]]:
    """Plants a victim at a freed pid (tried again while the machine takes that pid first); kills
    every victim at the end."""
    planted: list[subprocess.Popen[bytes]] = []

    def plant(pid: int) -> subprocess.Popen[bytes]:
        # by time, not by tries: on a loaded machine the reap that frees the pid can take a while
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if Path(f"/proc/{pid}").exists():  # not free yet (a zygote or the namespace's init still reaping it)
                time.sleep(0.01)
                continue
            victim = _at_pid(pid)
            if victim is not None:
                planted.append(victim)
                return victim
        raise AssertionError(f"pid {pid} never came free for the victim")

    try:
        yield plant
    finally:
        for victim in planted:
            victim.kill()
            victim.wait()


@pytest.mark.root
@pytest.mark.parametrize("how", ["zygote", "own", "none"])
def test_a_process_that_takes_a_finished_tools_pid_is_never_signalled(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shell tool ends; before the runner is done with it, its pid is taken by another process that
    leads a group of its own: that process lives on."""
    work = _attempt_dir(tmp_path)
    box = Sandbox(NONE) if how == "none" else Sandbox(PIDNS_UID, UID, net=False)
    box.reuse = how == "zygote"
    toolbox = ToolBox(CONTRACT, {"allow": [["sh"]]}, {}, Path(work), {"PATH": "/usr/bin:/bin"}, box)
    real_capture, seen = tools.capture, []
    with _victims() as plant:

        def capture_then_plant(proc: sandbox.Started, *args: Any, **kwargs: Any) -> Any:
            got = real_capture(proc, *args, **kwargs)  # its end is known now
            assert (proc._zygote is not None) == (how == "zygote")
            assert proc.pid > 0
            seen.append(plant(proc.pid))
            return got

        monkeypatch.setattr(tools, "capture", capture_then_plant)
        # alive a moment: its pid is read from the pidfd while it has one
        result = toolbox.call("shell", {"argv": ["sh", "-c", "sleep 0.3; echo done"]}, 30)
        assert result.observation.startswith("exit 0"), result.observation
        assert len(seen) == 1 and seen[0].poll() is None, "the runner killed the process that took the tool's pid"


@pytest.mark.root
def test_a_zygotes_process_reaped_but_not_yet_reported_is_signalled_by_its_pidfd_only(tmp_path: Path) -> None:
    """The zygote has reaped the process and not yet said how it ended (it clears the namespace
    first): a kill of that process meanwhile reaches no other process that took its pid."""
    work = _attempt_dir(tmp_path)
    box = Sandbox(PIDNS_UID, UID, net=False)
    box.reuse = True
    proc = box.popen(["sh", "-c", "sleep 0.3; exit 3"], cwd=work, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL)
    assert proc._zygote is not None and proc.pid > 0
    with _victims() as plant:
        victim = plant(proc.pid)  # waits until the zygote reaped it
        assert proc.returncode is None  # the runner has not read its end
        proc.kill_group()
        assert proc.wait(10) == 3
        time.sleep(0.1)
        assert victim.poll() is None, "the kill reached the process that took its pid"


@pytest.mark.root
@pytest.mark.parametrize("how", ["zygote", "own", "none"])
def test_what_a_tool_left_in_its_group_dies_when_it_ends(tmp_path: Path, how: str) -> None:
    """Its group is killed as its end is known (before its pid is free), never after."""
    work = _attempt_dir(tmp_path)
    box = Sandbox(NONE) if how == "none" else Sandbox(PIDNS_UID, UID, net=False)
    box.reuse = how == "zygote"
    toolbox = ToolBox(CONTRACT, {"allow": [["bash"]]}, {}, Path(work), {"PATH": "/usr/bin:/bin"}, box)
    token = f"left-{os.urandom(4).hex()}"
    result = toolbox.call("shell", {"argv": ["bash", "-c", f"(exec -a {token} sleep 60 >/dev/null 2>&1 &); echo started"]},
                          30)
    assert result.observation.startswith("exit 0"), result.observation
    deadline = time.monotonic() + 5  # killed already: its end takes the kernel a moment
    while _alive(token) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(token), "a process the tool left in its group outlived it"
