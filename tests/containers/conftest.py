"""Fixtures of the container tests: the shared Docker daemon and images (tests/support/docker.py)."""

from tests.support.docker import docker_daemon

__all__ = ["docker_daemon"]
