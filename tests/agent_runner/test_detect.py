"""The isolation level found with one probe that also has a network namespace (``detect(network=True)``)
is the level and the network answer the two probes it replaces found (``detect()``, then
``detect_network``), and where the network namespace is refused the answer is the same too."""

from __future__ import annotations

import pytest

from agent_runner import isolation_probe, launch, sandbox


def _found(monkeypatch: pytest.MonkeyPatch, one_probe: bool) -> tuple[str, bool, int]:
    """(level, network, probes run) on a fresh process's first try."""
    probes = []
    real = isolation_probe._works

    def counted(level: str, net: bool = False) -> bool:
        probes.append((level, net))
        return real(level, net)

    with monkeypatch.context() as m:
        m.setattr(isolation_probe, "_detected", None)
        m.setattr(isolation_probe, "_net_works", {})
        m.setattr(isolation_probe, "_works", counted)
        level = isolation_probe.detect(network=True) if one_probe else isolation_probe.detect()
        return level, isolation_probe.detect_network(level), len(probes)


@pytest.mark.root
@pytest.mark.parametrize("case", ["root", "not root", "network refused"])
def test_one_probe_finds_what_the_two_found(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    if case == "not root":  # the user-namespace level, as an unprivileged runner meets it
        monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    if case == "network refused":  # a kernel without network namespaces (flags it refuses)
        monkeypatch.setattr(launch, "_CLONE_NEWNET", 0x7FFFFFFF & ~launch._CLONE_NEWPID)  # what _Enter unshares
    two = _found(monkeypatch, one_probe=False)
    one = _found(monkeypatch, one_probe=True)
    assert one[:2] == two[:2]
    assert two[:2] == {"root": (sandbox.PIDNS_UID, True), "not root": (sandbox.PIDNS, True),
                       "network refused": (sandbox.PIDNS_UID, False)}[case]
    if two[1]:
        assert one[2] == 1 and two[2] == 2, (one, two)
