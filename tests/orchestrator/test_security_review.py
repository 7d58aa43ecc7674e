"""Review findings: a damaged known_hosts and a forged pid file cannot turn into harm or a foreign error."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest

from orchestrator import known_hosts, remote
from orchestrator.errors import HostKeyRejected

OFFERED = base64.b64encode(b"k" * 51).decode()


@pytest.mark.parametrize("stored", ["!!notbase64", "AAAAA"])
def test_an_unreadable_known_key_is_still_a_changed_key_refused(tmp_path: Path, stored: str) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(f"[127.0.0.1]:2222 ssh-ed25519 {stored}\n")
    with pytest.raises(HostKeyRejected, match="CHANGED"):
        known_hosts.verify(path, "box-b", "[127.0.0.1]:2222", "ssh-ed25519", OFFERED, accept_new=True)
    assert path.read_text() == f"[127.0.0.1]:2222 ssh-ed25519 {stored}\n"  # never rewritten


@pytest.mark.parametrize("forged", ["1", "-1", "0", "$(touch x)", "1 2", ""])
def test_kill_script_never_signals_a_forged_pid(tmp_path: Path, forged: str) -> None:
    """The runner's workspace holds `pid`; an agent could overwrite it. `kill -- -1` would kill every
    process of the user, so only a plain number above 1 is ever signalled."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "pid").write_text(forged + "\n")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    log = tmp_path / "kill.log"
    (fake_bin / "kill").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (fake_bin / "kill").chmod(0o755)
    # `kill` is a shell builtin; run the script with the builtin disabled via a function shim.
    script = f'kill() {{ {fake_bin}/kill "$@"; }}; ' + remote.kill_script(str(ws))
    done = subprocess.run(["sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    assert not log.exists(), log.read_text()
    assert not (tmp_path / "x").exists()


def test_kill_script_signals_a_real_process_group(tmp_path: Path) -> None:
    # The run's own launcher (timeout ... --out <ws>/out), as run_script starts it; a bare process
    # named in the pid file is spared (tests/orchestrator/test_remote.py).
    ws = tmp_path / "ws"
    ws.mkdir()
    proc = subprocess.Popen(
        ["timeout", "-s", "KILL", "60", "sh", "-c", "sleep 30", "run", "--out", f"{ws}/out"],
        start_new_session=True,
    )
    try:
        (ws / "pid").write_text(f"{proc.pid}\n")
        subprocess.run(["sh", "-c", remote.kill_script(str(ws))], timeout=30, check=True)
        assert proc.wait(timeout=10) == -9
    finally:
        proc.kill()


def test_an_unreadable_known_hosts_is_a_host_key_error_not_a_retried_connect_error(tmp_path: Path) -> None:
    from orchestrator.errors import HostUnreachable

    directory = tmp_path / "known_hosts"
    directory.mkdir()
    with pytest.raises(HostKeyRejected, match="cannot read known_hosts") as caught:
        known_hosts.verify(directory, "box-b", "[127.0.0.1]:2222", "ssh-ed25519", OFFERED)
    assert caught.value.host == "box-b"
    assert not isinstance(caught.value, HostUnreachable)
