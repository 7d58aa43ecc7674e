"""`make demo`'s port: 2222 when free, else one the kernel picks (or DEMO_PORT), and the demo inventory
retargeted to it (tools/testhosts.py free-port / retarget, which the Makefile calls)."""

from __future__ import annotations

import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.hosts.inventory import load_inventory
from tools.testhosts import free_port

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "testhosts.py"


def _tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another process's listener holds, as something else on the machine may hold 2222."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_free_port_prefers_the_asked_port_when_nothing_listens_on_it() -> None:
    port = free_port()
    out = _tool("free-port", "--prefer", str(port))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(port)


def test_free_port_picks_another_port_when_the_preferred_one_is_held(held_port: int) -> None:
    out = _tool("free-port", "--prefer", str(held_port))
    assert out.returncode == 0, out.stderr
    picked = int(out.stdout)
    assert picked != held_port
    with socket.socket() as s:  # and nothing listens on the one it picked
        s.bind(("127.0.0.1", picked))


def test_retarget_moves_the_ssh_host_to_the_port_and_keeps_the_same_key_files(tmp_path: Path) -> None:
    src_dir = tmp_path / "repo"
    (src_dir / ".state" / "keys").mkdir(parents=True)
    (src_dir / ".state" / "keys" / "id_ed25519").write_text("key")
    (src_dir / "hosts.toml").write_text((ROOT / "hosts.toml").read_text())
    out = tmp_path / "elsewhere" / "demo-hosts.toml"
    done = _tool("retarget", str(src_dir / "hosts.toml"), "45678", str(out))
    assert done.returncode == 0, done.stderr
    before, after = load_inventory(src_dir / "hosts.toml"), load_inventory(out)
    assert after.get("box-b").port == 45678
    assert after.get("box-b").model_copy(update={"port": 2222}) == before.get("box-b")
    assert after.get("local") == before.get("local")


def test_the_demo_inventory_has_the_one_port_line_retarget_replaces() -> None:
    data = tomllib.loads((ROOT / "hosts.toml").read_text())
    assert [h.get("port") for h in data["hosts"] if h.get("transport") == "ssh"] == [2222]
    assert "retarget hosts.toml" in (ROOT / "Makefile").read_text()
