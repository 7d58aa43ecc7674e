"""The Docker daemon and images the container tests share (tools/testdocker.py): one daemon and one
build of the images for the whole session, started here when not running and stopped at the end when
this session started it. When the daemon cannot start, the test FAILS with the reason: never skipped.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.lanes import refuse_in_fast_lane
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
    refuse_in_fast_lane("a Docker daemon", "docker")
    try:
        with testdocker.Lease():
            images = testdocker.build_images()
            yield DockerDaemon(testdocker.DOCKER_HOST, images)
    except testdocker.DockerError as exc:
        pytest.fail(f"cannot run the Docker daemon for the container tests: {exc}", pytrace=False)


@dataclass(frozen=True)
class DockerBox:
    """A running container the session shares (``container =`` and ``command`` hosts reach it)."""

    daemon: DockerDaemon
    name: str

    @property
    def pid(self) -> int:
        """Its first process's pid on this machine (``nsenter -t``)."""
        return int(self.daemon.docker("inspect", "-f", "{{.State.Pid}}", self.name).stdout.strip())


@pytest.fixture(scope="session")
def docker_box(docker_daemon: DockerDaemon) -> Iterator[DockerBox]:
    name = f"crosshost-test-box-{uuid.uuid4().hex[:8]}"
    made = docker_daemon.docker(
        "run", "-d", "--rm", "--name", name, "--label", "crosshost.test=box", "--network", "none",
        "--entrypoint", "sleep", docker_daemon.images["py-utf8"], "infinity",
    )  # fmt: skip
    if made.returncode != 0:
        pytest.fail(f"cannot start the test container: {made.stderr.strip()}", pytrace=False)
    try:
        yield DockerBox(docker_daemon, name)
    finally:
        docker_daemon.docker("rm", "-f", name)


def docker_inventory(path: Path, hosts: list[dict[str, Any]], *, head: str = "", **defaults: Any) -> Path:
    """A hosts.toml: ``head`` (another inventory's text, e.g. the sshd fleet's) or a ``[defaults]`` of
    ``defaults``, then one ``[[hosts]]`` table per dict (values as TOML: JSON strings, numbers, lists)."""
    lines = [head.rstrip("\n")] if head else ["[defaults]", *(f"{k} = {json.dumps(v)}" for k, v in defaults.items())]
    for host in hosts:
        lines += ["", "[[hosts]]", *(f"{k} = {json.dumps(v)}" for k, v in host.items())]
    path.write_text("\n".join(lines) + "\n")
    return path
