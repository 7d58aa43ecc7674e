"""The sshd test fleet the integration tests share: real sshd hosts (tools/testhosts.py), each in its
own UTS + mount namespace, plus an inventory (``local`` first) that reaches them.

When sshd cannot start, the test FAILS with the reason: integration tests are never skipped.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.hosts.inventory import HostConfig, Inventory, load_inventory
from tests.support.lanes import refuse_in_fast_lane
from tools.testhosts import Fleet, TestHostError, free_port

#: the test hosts' state must live outside /tmp, /root and /opt: those are bound over inside them
STATE_PARENT = "/var/tmp"


@dataclass
class SshdHosts:
    """Running test hosts and an inventory (``local`` first) that reaches them."""

    fleet: Fleet
    names: list[str]
    inventory_path: Path

    @property
    def inventory(self) -> Inventory:
        return load_inventory(self.inventory_path)

    def config(self, name: str) -> HostConfig:
        return self.inventory.get(name)

    def port(self, name: str) -> int:
        return self.fleet.hosts[name].port


def start_fleet(names: list[str], *, connect_timeout_s: float) -> SshdHosts:
    refuse_in_fast_lane("sshd hosts", "sshd")
    state = Path(tempfile.mkdtemp(prefix="crosshost-test-", dir=STATE_PARENT))
    # passable (not listable) by others: the local host's attempts run as a uid of their own under it
    state.chmod(0o711)
    fleet = Fleet(state)
    try:
        fleet.up(names, [free_port() for _ in names])
        inventory = fleet.write_inventory(state / "hosts.toml", names, connect_timeout_s=connect_timeout_s)
    except TestHostError as exc:
        shutil.rmtree(state, ignore_errors=True)
        pytest.fail(f"cannot start the sshd test hosts: {exc}", pytrace=False)
    return SshdHosts(fleet, names, inventory)


def stop_fleet(hosts: SshdHosts) -> None:
    try:
        hosts.fleet.down()
    finally:
        shutil.rmtree(hosts.fleet.state, ignore_errors=True)
