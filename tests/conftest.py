"""Shared fixtures: real sshd test hosts (tests/support/fleet.py).

``sshd_hosts`` (session): two hosts, box-a and box-b, plus an inventory (local first) that reaches
them. ``fresh_sshd_host`` (function): one host of its own, with its own known_hosts, for tests that
kill it, start it late or change its key. ``vm_sshd_hosts`` (module): hosts named ``vm`` (a generic
name, the word in "vm.swappiness") and ``box-y``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fleet import SshdHosts, start_fleet, stop_fleet
from tests.support.lanes import DIRECTORY_MARKERS

TESTS = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    """SIGINT and SIGQUIT as a terminal gives them, whatever started the tests: a shell's background
    job, nohup or a CI runner starts them ignored, and a pytest-xdist worker ignores them too (execnet).
    The Ctrl-C tests send SIGINT to their own process, and every process a test starts inherits what
    is ignored."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of integration/, containers/ and browser/ carries its lane's marker."""
    for item in items:
        parts = item.path.relative_to(TESTS).parts if item.path.is_relative_to(TESTS) else ()
        marker = DIRECTORY_MARKERS.get(parts[0]) if len(parts) > 1 else None
        if marker:
            item.add_marker(marker)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("root") and os.geteuid() != 0:
        pytest.fail("this test needs root (namespaces, cgroups): run it as root, as make test does", pytrace=False)


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
