"""tools/testhosts.py as people use it (`make hosts-up` / `make hosts-down`): a real CLI round trip."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from testhosts import free_port

from orchestrator.inventory import load_inventory
from orchestrator.transport import open_host

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


def test_up_fails_loudly_with_the_sshd_log_when_the_port_is_taken() -> None:
    state = Path(tempfile.mkdtemp(prefix="crosshost-cli-", dir="/var/tmp"))
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    try:
        up = subprocess.run(
            [sys.executable, str(TOOL), "up", "--names", "box-q", "--base-port", str(port), "--state", str(state)],
            capture_output=True, text=True, timeout=60,
        )
    finally:
        blocker.close()
        subprocess.run([sys.executable, str(TOOL), "down", "--state", str(state)], capture_output=True, timeout=60)
        shutil.rmtree(state, ignore_errors=True)
    assert up.returncode == 1
    assert up.stderr.startswith("testhosts: error: box-q: sshd exited")
    assert "Address already in use" in up.stderr or "Bind to port" in up.stderr
