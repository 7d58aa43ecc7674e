"""At ``pidns`` an attempt runs as the runner's uid: the runner's home is read-only to it (its own
mount namespace), so it cannot plant what the runner's user runs at a later login (``~/.ssh/rc``,
``authorized_keys``, a shell's start-up file); the runner's workspace below that home stays writable."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from agent_runner import privs
from agent_runner.sandbox import PIDNS, Sandbox, user_home


def _attempt(box: Sandbox, script: str, cwd: str) -> str:
    proc = box.popen(["sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, env={"PATH": os.defpath}, cwd=cwd)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    return out.decode().splitlines()[-1]  # the exits; a refused write's message is above it


@pytest.mark.root
def test_an_attempt_at_pidns_cannot_write_the_runners_home_but_its_workspace_below_it() -> None:
    home = user_home()
    assert home and os.path.isdir(home)
    workspace = Path(tempfile.mkdtemp(dir=home, prefix=".crosshost-test-ws-"))
    planted = Path(home) / f".crosshost-test-planted-{os.getpid()}"
    script = f"echo x > {planted}; a=$?; echo y > {workspace}/w; echo $a $?"
    try:
        said = _attempt(Sandbox(PIDNS, writable=(str(workspace),)), script, str(workspace))
        assert said.split()[0] != "0" and said.split()[1] == "0", said
        assert not planted.exists()  # refused: the home is read-only to the attempt
        assert (workspace / "w").read_text() == "y\n"  # its workspace, below the home, is not
        assert os.access(home, os.W_OK)  # the runner's own mount namespace is untouched
        # the attack, without the shield (a workspace that is the home itself): the write lands
        said = _attempt(Sandbox(PIDNS, writable=(home,)), script, str(workspace))
        assert said.split() == ["0", "0"] and planted.exists()
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
        planted.unlink(missing_ok=True)


def test_the_shield_keeps_the_workspace_writable_and_leaves_a_home_it_cannot_shield(tmp_path: Path) -> None:
    home, ws = tmp_path / "home", tmp_path / "home" / "ws"
    ws.mkdir(parents=True)
    steps = privs.home_shield(str(home), [str(ws), str(tmp_path / "elsewhere")])
    assert [(p, ro) for p, _, ro in steps] == [(os.fsencode(home), True), (os.fsencode(ws), False)]
    assert privs.home_shield(str(home), [str(home)]) == []  # the workspace is the home
    assert privs.home_shield(str(home), [str(tmp_path)]) == []  # the workspace holds the home
    assert privs.home_shield("/", []) == [] and privs.home_shield(None, []) == []
    assert privs.home_shield(str(tmp_path / "missing"), []) == []
