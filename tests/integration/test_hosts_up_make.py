"""`make hosts-up HOSTS_PORT=N`: the README's test hosts on the ports a user picks, and an inventory
that reaches them (real sshd hosts through the real Makefile, then `crosshost hosts` on them)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.hosts.inventory import load_inventory
from tests.support.fleet import STATE_PARENT
from tools.testhosts import free_port, port_is_free

ROOT = Path(__file__).resolve().parents[2]


# The venv this test runs in is the one the Makefile's targets use; named relative to the checkout,
# since make cannot name a target whose path has a space in it (a clone at "/tmp/a b").
VENV = os.path.relpath(Path(sys.executable).parent.parent, ROOT)


def _make(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    venv = VENV
    # -o: the venv is set up already (this test runs in it); never rebuilt from inside a test
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "-o", f"{venv}/.installed", target,
                           f"VENV={venv}", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def state() -> Iterator[Path]:
    """The hosts' state directory, outside the /tmp they bind over (as HOSTS_STATE's default is)."""
    path = Path(tempfile.mkdtemp(prefix="crosshost-hosts-up-", dir=STATE_PARENT))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_hosts_up_starts_box_b_and_box_c_on_the_given_port_and_writes_an_inventory_that_reaches_them(
    tmp_path: Path, state: Path
) -> None:
    port = free_port()
    while not port_is_free(port + 1):
        port = free_port()
    out = tmp_path / "out"
    args = (f"HOSTS_PORT={port}", f"HOSTS_STATE={state}", f"HOSTS_OUT={out}")
    try:
        up = _make("hosts-up", *args)
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"box-b: root@127.0.0.1 -p {port} " in up.stdout
        assert f"box-c: root@127.0.0.1 -p {port + 1} " in up.stdout
        inventory = load_inventory(out / "hosts.toml")
        assert [h.name for h in inventory.hosts] == ["local", "box-b", "box-c"]
        assert (inventory.get("box-b").port, inventory.get("box-c").port) == (port, port + 1)
        assert f"try: {VENV}/bin/crosshost hosts -i {out}/hosts.toml" in up.stdout
        crosshost = Path(sys.executable).parent / "crosshost"
        hosts = subprocess.run([str(crosshost), "hosts", "-i", str(out / "hosts.toml")],
                               capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
        assert hosts.returncode == 0, hosts.stdout + hosts.stderr
        assert [ln.split()[1] for ln in hosts.stdout.splitlines() if " ssh " in ln] == ["box-b", "box-c"], hosts.stdout
        assert all(" yes " in ln for ln in hosts.stdout.splitlines() if " ssh " in ln), hosts.stdout
    finally:
        down = _make("hosts-down", f"HOSTS_STATE={state}")
    assert down.returncode == 0, down.stdout + down.stderr
    assert port_is_free(port) and port_is_free(port + 1)


def test_hosts_up_refuses_a_taken_port_and_says_so(tmp_path: Path, state: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = int(held.getsockname()[1])
        up = _make("hosts-up", f"HOSTS_PORT={port}", f"HOSTS_STATE={state}", f"HOSTS_OUT={tmp_path}")
    _make("hosts-down", f"HOSTS_STATE={state}")
    assert up.returncode != 0
    assert f"port {port} on 127.0.0.1 is in use" in up.stderr
