"""The isolation level found with one probe that also has a network namespace (``detect(network=True)``)
is the level and the network answer the two probes it replaces found (``detect()``, then
``detect_network``), and where the network namespace is refused the answer is the same too."""

from __future__ import annotations

from collections.abc import Iterator

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


@pytest.fixture
def fresh_probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, bool]]]:
    """No probe run yet in this process, none started, and this thread without zygotes; yields the
    per-process probes run (``_works``); every zygote ends afterwards."""
    from agent_runner import zygote

    probes: list[tuple[str, bool]] = []
    real = isolation_probe._works

    def counted(level: str, net: bool = False) -> bool:
        probes.append((level, net))
        return real(level, net)

    monkeypatch.setattr(isolation_probe, "_detected", None)
    monkeypatch.setattr(isolation_probe, "_net_works", {})
    monkeypatch.setattr(isolation_probe, "_detecting", None)
    monkeypatch.setattr(isolation_probe, "_works", counted)
    monkeypatch.setattr(zygote, "_local", type(zygote._local)())
    try:
        yield probes
    finally:
        zygote.close_all()


@pytest.mark.root
@pytest.mark.parametrize("net", [True, False], ids=["netns", "open"])
def test_the_zygote_answers_the_probe_as_the_per_process_probe_does(
        fresh_probe: list[tuple[str, bool]], monkeypatch: pytest.MonkeyPatch, net: bool) -> None:
    """A one-slot root run's zygote runs the probe's sh in the sandbox its attempts get: the level (and,
    with a network namespace, its answer) is the one the per-process probe finds, and no process of
    the runner's own is forked for it."""
    from agent_runner import zygote

    started: list[tuple[list[str], int]] = []
    real_start = zygote.Zygote.start

    def start(self: zygote.Zygote, argv: list[str], env: dict[str, str], cwd: str, uid: int,
              stdio: list[int]) -> tuple[int, int]:
        started.append((list(argv), uid))
        return real_start(self, argv, env, cwd, uid, stdio)

    monkeypatch.setattr(zygote.Zygote, "start", start)
    assert isolation_probe.answer_by_zygote(net) is True
    assert fresh_probe == []  # answered without a per-process probe
    # the whole probe of the level, as a uid that is not root: the one the per-process probe runs
    assert started == [(["sh", "-c", isolation_probe.probe_script(sandbox.PIDNS_UID, net)],
                        sandbox.UID_BASE + sandbox.UID_SPAN - 1)]
    answered = (isolation_probe.detect(network=net), isolation_probe._net_works.get(sandbox.PIDNS_UID))
    assert zygote.take(net) is not None and len(zygote._all) == 1  # the zygote the probe passed is the attempts'
    monkeypatch.setattr(isolation_probe, "_detected", None)
    monkeypatch.setattr(isolation_probe, "_net_works", {})
    probed = (isolation_probe.detect(network=net), isolation_probe._net_works.get(sandbox.PIDNS_UID))
    assert fresh_probe and answered == probed == (sandbox.PIDNS_UID, True if net else None)


@pytest.mark.root
def test_a_probe_the_zygote_fails_gives_it_up_and_the_per_process_probe_answers(
        fresh_probe: list[tuple[str, bool]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the probe's sh fails in the zygote, no process is ever started through that zygote (it
    ends, and none is started again on the thread), and ``detect`` probes the per-process way."""
    from agent_runner import zygote

    real_script = isolation_probe.probe_script
    monkeypatch.setattr(isolation_probe, "probe_script", lambda level, net, proc="/proc": "exit 1")
    assert isolation_probe.answer_by_zygote(True) is False
    # given up: ended, and neither kind started again on this thread
    assert zygote._all == [] and zygote.take(True) is None and zygote.take(False) is None
    assert isolation_probe._detected is None and fresh_probe == []
    monkeypatch.setattr(isolation_probe, "probe_script", real_script)
    assert isolation_probe.detect(network=True) == sandbox.PIDNS_UID and fresh_probe == [(sandbox.PIDNS_UID, True)]


def test_no_zygote_answers_a_runner_that_is_not_root_or_a_probe_already_run(
        fresh_probe: list[tuple[str, bool]], monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_runner import zygote

    taken: list[bool] = []
    monkeypatch.setattr(zygote, "take", lambda net: taken.append(net))
    monkeypatch.setattr(isolation_probe.os, "geteuid", lambda: 1000)
    assert isolation_probe.answer_by_zygote(True) is False
    monkeypatch.setattr(isolation_probe.os, "geteuid", lambda: 0)
    monkeypatch.setattr(isolation_probe, "_detected", sandbox.PIDNS)
    assert isolation_probe.answer_by_zygote(True) is False
    assert taken == [] and isolation_probe._detected == sandbox.PIDNS
