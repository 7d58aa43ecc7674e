"""tools/testhosts.py as people use it (`make hosts-up` / `make hosts-down`): a real CLI round trip."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.hosts.inventory import load_inventory
from orchestrator.hosts.transport import open_host
from tools.testhosts import free_port

pytestmark = pytest.mark.sshd

TOOL = Path(__file__).resolve().parents[2] / "tools" / "testhosts.py"


def test_up_writes_the_requested_paths_and_down_stops_the_hosts(tmp_path: Path) -> None:
    state = Path(tempfile.mkdtemp(prefix="crosshost-cli-", dir="/var/tmp"))
    port = free_port()
    identity = tmp_path / ".state" / "keys" / "id_ed25519"
    known = tmp_path / ".state" / "known_hosts"
    inventory = tmp_path / ".state" / "hosts.toml"
    try:
        up = subprocess.run(
            [sys.executable, str(TOOL), "up", "--names", "box-q", "--base-port", str(port),
             "--state", str(state), "--identity-out", str(identity), "--known-hosts-out", str(known),
             "--inventory-out", str(inventory)],
            capture_output=True, text=True, timeout=60,
        )
        assert up.returncode == 0, up.stderr
        assert f"inventory: {inventory}" in up.stdout
        assert identity.exists() and known.read_text().startswith(f"[127.0.0.1]:{port} ssh-ed25519 ")
        inv = load_inventory(inventory)
        assert [h.name for h in inv.hosts] == ["local", "box-q"]
        with open_host(inv.get("box-q")) as host:
            assert host.exec(["hostname"], 10).stdout.strip() == "box-q"
            assert host.exec(["ls", "/opt"], 10).stdout == ""  # its own, empty /opt
    finally:
        down = subprocess.run(
            [sys.executable, str(TOOL), "down", "--state", str(state)], capture_output=True, text=True, timeout=60
        )
        shutil.rmtree(state, ignore_errors=True)
    assert down.returncode == 0, down.stderr
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_up_fails_loudly_when_another_ssh_server_holds_the_port() -> None:
    """Another sshd on the port (say `make hosts-up` left running) answers the banner check: `up` must
    not take it for its own host, or the caller talks to a stranger with another host key."""
    state = Path(tempfile.mkdtemp(prefix="crosshost-cli-", dir="/var/tmp"))
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    stop = threading.Event()

    def answer_banners() -> None:
        blocker.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = blocker.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_stranger\r\n")

    server = threading.Thread(target=answer_banners, daemon=True)
    server.start()
    try:
        up = subprocess.run(
            [sys.executable, str(TOOL), "up", "--names", "box-q", "--base-port", str(port), "--state", str(state)],
            capture_output=True, text=True, timeout=60,
        )
    finally:
        stop.set()
        server.join(timeout=5)
        blocker.close()
        subprocess.run([sys.executable, str(TOOL), "down", "--state", str(state)], capture_output=True, timeout=60)
        shutil.rmtree(state, ignore_errors=True)
    assert up.returncode == 1
    assert up.stderr.startswith(f"testhosts: error: box-q: port {port} on 127.0.0.1 is in use"), up.stderr
    assert "make hosts-down" in up.stderr


def _uts(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/uts")
    except OSError:
        return None


def test_kill_spares_a_host_started_while_it_runs(fresh_sshd_host: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A namespace's inode number is reused by the next namespace created once it dies: a host that
    starts while another is being killed must not be taken for it (seen as "sshd exited (-9)")."""
    from tools import testhosts

    fleet = fresh_sshd_host.fleet
    old_ns = _uts(fleet.hosts["box-c"].ns_pid() or 0)
    assert old_ns is not None
    started: list[subprocess.Popen[bytes]] = []
    real_reap = testhosts._reap

    def reap_then_start_another(pid: int) -> None:  # runs between kill's passes
        real_reap(pid)
        if started:
            return
        deadline = time.monotonic() + 5
        while any(_uts(p) == old_ns for p in testhosts._all_pids()) and time.monotonic() < deadline:
            time.sleep(0.02)  # box-c's processes are gone: its namespace may now die
        # as a test host starts: a mount namespace, then a UTS one (the numbers box-c's had, if freed)
        started.append(subprocess.Popen(["unshare", "--mount", "--uts", "sleep", "30"]))
        while _uts(started[0].pid) in (None, _uts(os.getpid())) and time.monotonic() < deadline:
            time.sleep(0.02)

    monkeypatch.setattr(testhosts, "_reap", reap_then_start_another)
    try:
        fleet.kill("box-c")
        assert started, "kill never got to a second pass"
        assert started[0].poll() is None, f"kill killed a process it did not own ({started[0].returncode})"
        assert not fleet.hosts["box-c"].is_running()
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


def test_a_stale_pid_file_never_names_the_process_that_reused_its_pid(tmp_path: Path) -> None:
    from tools import testhosts

    other = subprocess.Popen(["unshare", "--uts", "sleep", "30"])  # as if another fleet's host
    try:
        deadline = time.monotonic() + 5
        while _uts(other.pid) in (None, _uts(os.getpid())) and time.monotonic() < deadline:
            time.sleep(0.02)
        host = testhosts.TestHost("box-x", 1, tmp_path / "hosts" / "box-x")
        host.dir.mkdir(parents=True)
        (host.dir / "unshare.pid").write_text(f"{other.pid} 1\n")  # its pid, not its start time
        fleet = testhosts.Fleet(tmp_path)
        fleet.hosts["box-x"] = host
        assert host.ns_pid() is None and not host.is_running()
        fleet.kill("box-x")
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
