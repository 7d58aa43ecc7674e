"""The Docker daemon and images the container tests share (tools/testdocker.py): one daemon and one
build of the images for the whole session, started here when not running and stopped at the end when
this session started it. When the daemon cannot start, the test FAILS with the reason: never skipped.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tools import testdocker


@dataclass(frozen=True)
class DockerDaemon:
    """A running daemon (``docker_host`` for an inventory) and the test images, by variant name."""

    docker_host: str
    images: dict[str, str]

    def docker(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["docker", "-H", self.docker_host, *args], capture_output=True, text=True, timeout=timeout, check=False
        )

    def containers(self, label: str) -> list[str]:
        """The ids of the containers (running or not) that carry ``label``."""
        res = self.docker("ps", "-aq", "--filter", f"label={label}")
        return res.stdout.split()


@pytest.fixture(scope="session")
def docker_daemon() -> Iterator[DockerDaemon]:
    try:
        with testdocker.Lease():
            images = testdocker.build_images()
            yield DockerDaemon(testdocker.DOCKER_HOST, images)
    except testdocker.DockerError as exc:
        pytest.fail(f"cannot run the Docker daemon for the container tests: {exc}", pytrace=False)
