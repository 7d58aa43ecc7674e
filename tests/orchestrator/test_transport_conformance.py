"""Every Host backend against ``orchestrator.hosts.transport.conformance``: one test per backend and check.

LocalHost and a real SshHost on an sshd test host run every check. FakeHost keeps files in a dict
and answers commands with a test's own function, so only the checks of what FakeHost itself does
(moving files, its errors, close) apply to it: an exec check on it would test its handler, not it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.errors import HostError
from orchestrator.hosts.inventory import HostConfig
from orchestrator.hosts.testing import FakeHost
from orchestrator.hosts.transport import Host, LocalHost, conformance, open_host
from orchestrator.hosts.transport.base import ExecResult
from orchestrator.model.proxy import ProxyConfig, model_route

SSH = pytest.param("ssh", marks=pytest.mark.sshd)
#: a container from a test image (started and removed by the host), the session's box reached as an
#: existing container, with `docker exec -i` as a command host, and through nsenter into its namespaces
CONTAINERS = [
    pytest.param(kind, marks=pytest.mark.docker)
    for kind in ("docker-image", "docker-container", "command-docker-exec", "command-nsenter")
]


def _scratch_only(argv: list[str]) -> tuple[int, str, str]:
    """FakeHost's handler: a scratch directory for the checks, nothing else."""
    return (0, "/fake/scratch\n", "") if argv == ["mktemp", "-d"] else (0, "", "")


def _open(kind: str, request: pytest.FixtureRequest) -> Host:
    if kind == "local":
        return LocalHost()
    if kind == "fake":
        return FakeHost("fake", _scratch_only)
    if kind == "ssh":
        return open_host(request.getfixturevalue("sshd_hosts").config("box-a"))
    box = request.getfixturevalue("docker_box")
    fields: dict[str, object] = {"name": "box-d", "transport": "docker", "docker_host": box.daemon.docker_host}
    if kind == "docker-image":
        fields["image"] = box.daemon.images["py-utf8"]
    elif kind == "docker-container":
        fields["container"] = box.name
    elif kind == "command-docker-exec":
        fields = {"name": "box-d", "transport": "command", "argv": ["docker", "-H", box.daemon.docker_host, "exec", "-i", box.name]}
    else:
        fields = {"name": "box-d", "transport": "command", "argv": ["nsenter", "-t", str(box.pid), "-a"]}
    return open_host(HostConfig.model_validate(fields))


@contextlib.contextmanager
def _opened(kind: str, request: pytest.FixtureRequest) -> Iterator[Host]:
    host = _open(kind, request)
    try:
        yield host
    finally:
        host.close()


@pytest.mark.parametrize("kind", ["local", SSH, *CONTAINERS])
@pytest.mark.parametrize("check", conformance.CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_real_backend(kind: str, check: conformance.Check, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    with _opened(kind, request) as host:
        assert conformance.self_check(host, tmp_path, (check,)) == {}


FAKE_CHECKS = (
    conformance.check_put_get_round_trip_is_byte_exact,
    conformance.check_get_of_a_missing_file_is_a_transfer_error,
    conformance.check_close_is_idempotent,
)


@pytest.mark.parametrize("check", FAKE_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_fake_backend_moves_files_and_closes_like_the_real_ones(
    check: conformance.Check, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    with _opened("fake", request) as host:
        assert conformance.self_check(host, tmp_path, (check,)) == {}


def test_self_check_passes_on_the_local_host_and_names_what_a_broken_backend_gets_wrong(tmp_path: Path) -> None:
    assert conformance.self_check(LocalHost(), tmp_path / "local") == {}

    class Swallows(LocalHost):
        """A backend that loses stderr and reports every exit as 0."""

        def exec(self, argv: list[str], timeout: float) -> ExecResult:
            r = super().exec(argv, timeout)
            return ExecResult(r.argv, 0, r.stdout, "", r.duration_s, r.timed_out)

    failures = conformance.self_check(Swallows(), tmp_path / "broken")
    assert "check_exit_codes_are_data" in failures and "false did not exit 1" in failures["check_exit_codes_are_data"]
    assert "check_stdout_and_stderr_come_back_separately" in failures
    assert "check_put_get_round_trip_is_byte_exact" not in failures  # what it does right still passes


class _Bare(FakeHost):
    """A backend that neither is the controller nor forwards ports: the base's refusal applies."""

    kind = "bare"
    reaches_controller_loopback = False


def test_a_backend_without_port_forwarding_refuses_it_by_name() -> None:
    with pytest.raises(HostError, match=r"the bare transport cannot forward a port .*127\.0\.0\.1:8080") as info:
        _Bare("box-z").forward_remote(8080)
    assert info.value.host == "box-z" and info.value.exit_code == 3
    _Bare("box-z").cancel_forward(1234)  # nothing was forwarded: nothing to stop, no error


def test_model_route_refuses_a_host_that_cannot_reach_the_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_MODEL_KEY", "sk-test")
    agent = ProxyConfig("http://127.0.0.1:9/v1", "TEST_MODEL_KEY", model="m")
    with pytest.raises(HostError, match="cannot forward a port"), model_route(_Bare("box-z"), agent):
        pytest.fail("the run must not start")
