"""SshHost and open_host against real sshd test hosts: crosshost's SSH rules, one test each."""

from __future__ import annotations

import hashlib
import socket
import socketserver
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from orchestrator.errors import AuthenticationFailed, HostKeyRejected, HostUnreachable
from orchestrator.hosts.inventory import HostConfig
from orchestrator.hosts.transport import CONNECT_ATTEMPTS, open_host, session
from orchestrator.hosts.transport.ssh import GET_WINDOW, SshHost
from tests.support.fleet import SshdHosts
from tools.testhosts import free_port

pytestmark = pytest.mark.sshd

TOKEN = "crosshost-test-token-5f1c9a"


def _ssh(host: object) -> SshHost:
    assert isinstance(host, SshHost)
    return host


def test_each_host_has_its_own_hostname_root_and_tmp(sshd_hosts: SshdHosts) -> None:
    a = open_host(sshd_hosts.config("box-a"))
    b = open_host(sshd_hosts.config("box-b"))
    try:
        assert a.exec(["hostname"], 10).stdout.strip() == "box-a"
        assert b.exec(["hostname"], 10).stdout.strip() == "box-b"
        assert socket.gethostname() not in ("box-a", "box-b")
        marker = f"/root/only-on-a-{time.monotonic_ns()}"
        assert a.exec(["touch", marker, "/tmp/only-on-a"], 10).ok
        assert a.exec(["test", "-e", marker], 10).exit_code == 0
        assert b.exec(["test", "-e", marker], 10).exit_code == 1
        assert b.exec(["test", "-e", "/tmp/only-on-a"], 10).exit_code == 1
        assert not Path(marker).exists()
        a.exec(["rm", "-f", marker, "/tmp/only-on-a"], 10)
    finally:
        a.close()
        b.close()


def test_controller_environment_does_not_reach_the_host(
    sshd_hosts: SshdHosts, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CROSSHOST_TEST_TOKEN", TOKEN)
    monkeypatch.setenv("LC_CROSSHOST_TEST_TOKEN", TOKEN)  # LC_* is what sshd's AcceptEnv usually passes
    with open_host(sshd_hosts.config("box-a")) as host:
        r = host.exec(["sh", "-c", "env; cat /proc/self/environ"], 10)
    assert r.ok and "HOME=" in r.stdout
    assert TOKEN not in r.stdout and "CROSSHOST_TEST_TOKEN" not in r.stdout


def test_agent_forwarding_is_never_requested(sshd_hosts: SshdHosts, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = subprocess.run(["ssh-agent", "-s"], capture_output=True, text=True, check=True).stdout
    sock = agent.split("SSH_AUTH_SOCK=", 1)[1].split(";", 1)[0]
    pid = int(agent.split("SSH_AGENT_PID=", 1)[1].split(";", 1)[0])
    requested: list[object] = []
    monkeypatch.setattr(paramiko.Channel, "request_forward_agent", lambda *a, **k: requested.append(a))
    monkeypatch.setenv("SSH_AUTH_SOCK", sock)  # a live agent on the controller must not be used
    try:
        with open_host(sshd_hosts.config("box-a")) as host:
            r = host.exec(["env"], 10)
    finally:
        subprocess.run(["kill", str(pid)], check=False)
    assert r.ok
    assert "SSH_AUTH_SOCK" not in r.stdout
    assert requested == []


def test_unknown_host_key_is_refused_with_the_accept_new_hint(
    fresh_sshd_host: SshdHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # proves ~/.ssh is neither read nor written
    fleet = fresh_sshd_host.fleet
    fleet.forget("box-c")
    before = fleet.known_hosts.read_bytes()
    retries: list[dict] = []
    with pytest.raises(HostKeyRejected) as info:
        open_host(fresh_sshd_host.config("box-c"), on_retry=retries.append)
    line = info.value.one_line()
    port = fresh_sshd_host.port("box-c")
    assert line.startswith(f"box-c: HostKeyUnknown: unknown host key for [127.0.0.1]:{port}")
    assert "\n" not in line
    assert retries == []  # a host-key error is never retried
    assert fleet.known_hosts.read_bytes() == before
    assert not (tmp_path / ".ssh").exists()


def test_accept_new_records_the_key_then_plain_connects_work(
    fresh_sshd_host: SshdHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    fleet = fresh_sshd_host.fleet
    fleet.forget("box-c")
    cfg = fresh_sshd_host.config("box-c")
    with open_host(cfg, accept_new=True) as host:
        assert host.exec(["hostname"], 10).stdout.strip() == "box-c"
    recorded = fleet.known_hosts.read_text()
    assert fleet.hosts["box-c"].known_hosts_line() in recorded
    with open_host(cfg) as host:  # now known: no flag needed
        assert host.exec(["true"], 10).ok
    assert fleet.known_hosts.read_text() == recorded  # nothing appended twice
    assert not (tmp_path / ".ssh").exists()


def test_changed_host_key_is_refused_even_with_accept_new(fresh_sshd_host: SshdHosts) -> None:
    fleet = fresh_sshd_host.fleet
    fleet.regenerate_host_key("box-c")  # restarts sshd with a new key; known_hosts keeps the old one
    before = fleet.known_hosts.read_bytes()
    cfg = fresh_sshd_host.config("box-c")
    for accept_new in (False, True):
        with pytest.raises(HostKeyRejected) as info:
            open_host(cfg, accept_new=accept_new)
        line = info.value.one_line()
        assert line.startswith("box-c: HostKeyRejected: host key for [127.0.0.1]:")
        assert "CHANGED" in line and "--accept-new never accepts a changed key" in line
        assert "remove line 1 of" in line
    assert fleet.known_hosts.read_bytes() == before


def test_sshd_starting_two_seconds_late_succeeds_with_recorded_retries(fresh_sshd_host: SshdHosts) -> None:
    fleet = fresh_sshd_host.fleet
    fleet.kill("box-c")
    fleet.start("box-c", delay_s=2, wait=False)
    retries: list[dict] = []
    started = time.monotonic()
    with open_host(fresh_sshd_host.config("box-c"), on_retry=retries.append) as host:
        assert host.exec(["hostname"], 10).stdout.strip() == "box-c"
    assert time.monotonic() - started >= 1.5
    assert retries, "the late start must have cost at least one recorded retry"
    assert [r["attempt"] for r in retries] == list(range(1, len(retries) + 1))
    for r in retries:
        assert set(r) == {"host", "attempt", "error", "wait_s", "at"}
        assert r["host"] == "box-c" and r["wait_s"] >= 0
        assert r["error"].startswith("box-c: HostUnreachable:")


def test_nothing_listening_is_unreachable_after_bounded_retries(tmp_path: Path) -> None:
    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    cfg = HostConfig(
        name="box-gone",
        address="127.0.0.1",
        port=free_port(),
        identity_file=key,
        known_hosts=tmp_path / "known_hosts",
        connect_timeout_s=2,
    )
    retries: list[dict] = []
    started = time.monotonic()
    with pytest.raises(HostUnreachable) as info:
        open_host(cfg, on_retry=retries.append)
    elapsed = time.monotonic() - started
    assert elapsed < 2 * cfg.connect_timeout_s + 1
    assert 1 <= len(retries) <= CONNECT_ATTEMPTS - 1
    assert "gave up after" in str(info.value)
    assert info.value.transient


def test_wrong_key_is_an_authentication_error_and_not_retried(
    sshd_hosts: SshdHosts, tmp_path: Path
) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    cfg = sshd_hosts.config("box-a").model_copy(update={"identity_file": other})
    retries: list[dict] = []
    with pytest.raises(AuthenticationFailed) as info:
        open_host(cfg, on_retry=retries.append)
    assert retries == []
    assert info.value.one_line().startswith("box-a: AuthenticationFailed: root@[127.0.0.1]:")


def test_killed_host_is_unreachable_within_the_timeouts(fresh_sshd_host: SshdHosts) -> None:
    fleet = fresh_sshd_host.fleet
    cfg = fresh_sshd_host.config("box-c")
    host = open_host(cfg)
    outcome: dict[str, object] = {}

    def long_command() -> None:
        try:
            outcome["result"] = host.exec(["sleep", "60"], timeout=90)
        except HostUnreachable as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=long_command)
    worker.start()
    time.sleep(1.0)
    killed_at = time.monotonic()
    fleet.kill("box-c")  # sshd and every session of the host
    worker.join(timeout=cfg.connect_timeout_s + 10)
    assert not worker.is_alive(), "exec hung after the host died"
    assert isinstance(outcome.get("error"), HostUnreachable), outcome
    assert time.monotonic() - killed_at < cfg.connect_timeout_s + 5
    with pytest.raises(HostUnreachable):
        host.exec(["true"], 10)
    host.close()
    started = time.monotonic()
    with pytest.raises(HostUnreachable):
        open_host(cfg)
    assert time.monotonic() - started < 2 * cfg.connect_timeout_s + 2


def test_a_quiet_connection_answers_at_once_and_close_ends_it_at_once(
    sshd_hosts: SshdHosts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection's reading thread looks at its own state only every IDLE_CHECK_S while nothing
    arrives: a reply must still wake it at once, and close() must end it (and the TCP connection) at
    once, not when it next looks. Here it would next look in a minute."""
    monkeypatch.setattr(session, "IDLE_CHECK_S", 60.0)
    host = _ssh(open_host(sshd_hosts.config("box-a")))
    transport = host._transport
    assert transport is not None and transport.sock.gettimeout() == 60.0
    time.sleep(1.5)  # quiet: paramiko's own check would have run 15 times
    started = time.monotonic()
    assert host.exec(["echo", "awake"], 10).stdout.strip() == "awake"
    assert time.monotonic() - started < 30  # a reply wakes the thread; the 60 s look never came into it
    sock = transport.sock
    host.close()
    transport.join(timeout=20)
    assert not transport.is_alive(), "the reading thread waited for its next look instead of ending"
    assert sock.fileno() == -1


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        data = self.request.recv(1024)
        self.request.sendall(b"controller:" + data)


@pytest.fixture
def echo_server() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


CLIENT = (
    "import socket,sys\n"
    "s=socket.create_connection(('127.0.0.1',int(sys.argv[1])),timeout=5)\n"
    "s.sendall(sys.argv[2].encode()); s.shutdown(socket.SHUT_WR)\n"
    "print(s.recv(1024).decode())\n"
)


def test_reverse_forward_reaches_the_controller_and_can_be_cancelled(
    sshd_hosts: SshdHosts, echo_server: int
) -> None:
    host = _ssh(open_host(sshd_hosts.config("box-b")))
    try:
        first = host.forward_remote(echo_server)
        second = host.forward_remote(echo_server)
        assert first != second and first > 0
        r = host.exec(["python3", "-c", CLIENT, str(first), "hello"], 10)
        assert (r.exit_code, r.stdout.strip()) == (0, "controller:hello"), r
        host.cancel_forward(first)
        host.cancel_forward(first)  # idempotent
        gone = host.exec(["python3", "-c", CLIENT, str(first), "x"], 10)
        assert gone.exit_code != 0 and "refused" in gone.stderr.lower()
        still = host.exec(["python3", "-c", CLIENT, str(second), "again"], 10)
        assert still.stdout.strip() == "controller:again", still
    finally:
        host.close()


def _hint(output: str) -> str:
    """The one command suggested (progress and error lines may each say it)."""
    (hint,) = {x.split("to trust it on first use: ", 1)[1] for x in output.splitlines() if "to trust it on first use: " in x}
    return hint


def test_the_accept_new_hint_is_complete_and_pasting_it_acts_on_the_same_files(
    fresh_sshd_host: SshdHosts, tmp_path: Path
) -> None:
    """replay and hosts name -i INVENTORY (and the suite, the runs directory) in the command they
    suggest: pasted where the user typed the first one, it trusts the key into the inventory's own
    known_hosts, not into that of a hosts.toml that happens to be in the directory."""
    import shlex
    import sys

    fleet = fresh_sshd_host.fleet
    fleet.forget("box-c")
    suite = Path(__file__).resolve().parents[2] / "examples" / "suites" / "triage"
    (tmp_path / "hosts.toml").write_text('[[hosts]]\nname = "decoy"\ntransport = "local"\n')
    inv = fresh_sshd_host.inventory_path
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path)}

    def crosshost(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["crosshost", *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)

    probe = crosshost("hosts", "-i", str(inv))
    assert probe.returncode == 3
    assert shlex.split(_hint(probe.stderr)) == ["crosshost", "hosts", "-i", str(inv), "--accept-new"]

    replay = crosshost("replay", str(suite), "-i", str(inv), "--tasks", "unknown-unit", "--out", "runs")
    assert replay.returncode == 3, replay.stderr
    hint = _hint(replay.stderr)
    assert shlex.split(hint) == [
        "crosshost", "replay", str(suite), "-i", str(inv), "--tasks", "unknown-unit", "--out", "runs", "--accept-new"
    ]  # fmt: skip
    pasted = subprocess.run(hint, shell=True, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert pasted.returncode in (0, 1), pasted.stdout + pasted.stderr  # the run happened: a verdict, no host error
    assert fleet.hosts["box-c"].known_hosts_line() in fleet.known_hosts.read_text()
    assert crosshost("hosts", "-i", str(inv)).returncode == 0  # trusted now, without the flag


@pytest.mark.parametrize("lie", [0, 3 << 20, -40_000], ids=["honest", "claims-more", "claims-less"])
def test_a_host_closed_the_moment_a_get_returns_leaves_no_thread_failing(
    sshd_hosts: SshdHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lie: int
) -> None:
    """A get returns the whole file at every size around the read window's and a request's edges,
    whatever size the host states; and a host closed the moment the get returns leaves no read-ahead
    thread still sending (it died of "Socket is closed", its traceback on the terminal)."""
    failed: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failed.append(f"{args.thread}: {args.exc_value!r}"))
    stat = paramiko.SFTPFile.stat

    def stated(self: paramiko.SFTPFile) -> paramiko.SFTPAttributes:
        attrs = stat(self)
        attrs.st_size = max(0, (attrs.st_size or 0) + lie)
        return attrs

    monkeypatch.setattr(paramiko.SFTPFile, "stat", stated)
    one, window = paramiko.SFTPFile.MAX_REQUEST_SIZE, GET_WINDOW
    sizes = [0, 1, one - 1, one, one + 1, window - 1, window, window + 1, 3 * window + 5]
    made = f"/tmp/get-edges-{time.monotonic_ns()}"
    with open_host(sshd_hosts.config("box-a")) as host:
        script = f"mkdir -p {made} && " + " && ".join(f"head -c {n} /dev/urandom > {made}/{n}" for n in sizes)
        assert host.exec(["sh", "-c", f"{script} && cd {made} && sha256sum *"], 30).ok
        sums = dict(line.split()[::-1] for line in host.exec(["sh", "-c", f"cd {made} && sha256sum *"], 30).stdout.splitlines())
    try:
        for n in sizes * 3:
            host = _ssh(open_host(sshd_hosts.config("box-a")))
            try:
                host.get(f"{made}/{n}", tmp_path / "got")
            finally:
                host.close()  # at once: a read-ahead still sending would now fail
            assert hashlib.sha256((tmp_path / "got").read_bytes()).hexdigest() == sums[str(n)], n
        for thread in threading.enumerate():
            if thread.name.endswith("(_prefetch_thread)"):
                thread.join(10)
        assert failed == []
    finally:
        with open_host(sshd_hosts.config("box-a")) as host:
            host.exec(["rm", "-rf", made], 10)
