"""Shared fixtures: real sshd test hosts (tools/testhosts.py), each in its own UTS + mount namespace.

``sshd_hosts`` (session): two hosts, box-a and box-b, plus an inventory (local first) that reaches
them. ``fresh_sshd_host`` (function): one host of its own, with its own known_hosts, for tests that
kill it, start it late or change its key. When sshd cannot start, the test FAILS with the reason:
integration tests are never skipped.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.inventory import HostConfig, Inventory, load_inventory

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from testhosts import Fleet, TestHostError, free_port  # noqa: E402

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


def _start_fleet(names: list[str], *, connect_timeout_s: float) -> SshdHosts:
    state = Path(tempfile.mkdtemp(prefix="crosshost-test-", dir=STATE_PARENT))
    fleet = Fleet(state)
    try:
        fleet.up(names, [free_port() for _ in names])
        inventory = fleet.write_inventory(state / "hosts.toml", names, connect_timeout_s=connect_timeout_s)
    except TestHostError as exc:
        shutil.rmtree(state, ignore_errors=True)
        pytest.fail(f"cannot start the sshd test hosts: {exc}", pytrace=False)
    return SshdHosts(fleet, names, inventory)


def _stop_fleet(hosts: SshdHosts) -> None:
    try:
        hosts.fleet.down()
    finally:
        shutil.rmtree(hosts.fleet.state, ignore_errors=True)


@pytest.fixture(scope="session")
def sshd_hosts() -> Iterator[SshdHosts]:
    hosts = _start_fleet(["box-a", "box-b"], connect_timeout_s=5)
    try:
        yield hosts
    finally:
        _stop_fleet(hosts)


@pytest.fixture
def fresh_sshd_host() -> Iterator[SshdHosts]:
    """One running host (box-c) that the test may kill, restart late or re-key."""
    hosts = _start_fleet(["box-c"], connect_timeout_s=3)
    try:
        yield hosts
    finally:
        _stop_fleet(hosts)
