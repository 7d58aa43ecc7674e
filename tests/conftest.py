"""Shared fixtures: real sshd test hosts (tests/support/fleet.py).

``sshd_hosts`` (session): two hosts, box-a and box-b, plus an inventory (local first) that reaches
them. ``fresh_sshd_host`` (function): one host of its own, with its own known_hosts, for tests that
kill it, start it late or change its key. ``vm_sshd_hosts`` (module): hosts named ``vm`` (a generic
name, the word in "vm.swappiness") and ``box-y``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fleet import SshdHosts, start_fleet, stop_fleet


@pytest.fixture(scope="session")
def sshd_hosts() -> Iterator[SshdHosts]:
    hosts = start_fleet(["box-a", "box-b"], connect_timeout_s=5)
    try:
        yield hosts
    finally:
        stop_fleet(hosts)


@pytest.fixture
def fresh_sshd_host() -> Iterator[SshdHosts]:
    """One running host (box-c) that the test may kill, restart late or re-key."""
    hosts = start_fleet(["box-c"], connect_timeout_s=3)
    try:
        yield hosts
    finally:
        stop_fleet(hosts)


@pytest.fixture(scope="module")
def vm_sshd_hosts() -> Iterator[SshdHosts]:
    """Two running hosts whose hostnames are ``vm`` (too generic to prove a leak alone) and ``box-y``."""
    hosts = start_fleet(["vm", "box-y"], connect_timeout_s=5)
    try:
        yield hosts
    finally:
        stop_fleet(hosts)


# The Docker daemon and test images (tests/support/docker.py), shared by the whole session.
from tests.support.docker import docker_box, docker_daemon  # noqa: E402,F401
