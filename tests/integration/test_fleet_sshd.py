"""Real fleets over SSH, on real sshd test hosts: an ssh_config alias, a host reached only through a
bastion (its name resolves only on the bastion), a non-root login, passphrase keys through a real
ssh-agent and through passphrase_env."""

from __future__ import annotations

import concurrent.futures as cf
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import HostKeyRejected, HostUnreachable
from orchestrator.hosts.inventory import load_inventory
from orchestrator.hosts.transport import jump, open_host
from tools.testhosts import Fleet, TestHost, TestHostError, free_port

pytestmark = pytest.mark.sshd

REPO = Path(__file__).resolve().parents[2]
TARGET_NAME = "box-t.internal"  # in box-j's /etc/hosts only: the controller cannot resolve it
PASSPHRASE = "correct horse battery"


@dataclass
class Bastioned:
    fleet: Fleet
    bastion: TestHost
    target: TestHost
    locked_key: Path

    def inventory(self, path: Path, target: str, *, defaults: str = "") -> Path:
        f = self.fleet
        path.write_text(
            f'[defaults]\nknown_hosts = "{f.known_hosts}"\nconnect_timeout_s = 5\nssh_config = false\n{defaults}\n'
            f'[[hosts]]\nname = "bastion"\naddress = "127.0.0.1"\nport = {self.bastion.port}\nuser = "root"\n'
            f'identity_file = "{f.identity}"\n\n'
            f'[[hosts]]\nname = "inner"\naddress = "{TARGET_NAME}"\nport = {self.target.port}\n'
            f'user = "{self.target.user}"\nproxy_jump = "bastion"\n{target}\n'
        )
        return path

    def accepted(self, host: TestHost) -> int:
        return host.log.read_text().count("Accepted publickey")


@pytest.fixture(scope="module")
def bastioned() -> Iterator[Bastioned]:
    state = Path(tempfile.mkdtemp(prefix="crosshost-fleet-", dir="/var/tmp"))
    fleet = Fleet(state)
    try:
        bastion = fleet.create("box-j", free_port(), etc_hosts={TARGET_NAME: "127.0.0.1"}, log_level="DEBUG1")
        target = fleet.create("box-t", free_port(), user="crossuser")
        fleet.start("box-j")
        fleet.start("box-t")
        fleet.trust("box-t", label=f"[{TARGET_NAME}]:{target.port}")
        locked = state / "locked_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", PASSPHRASE, "-f", str(locked)], check=True)
        fleet.authorize("box-t", locked.with_name(locked.name + ".pub"))
    except (TestHostError, subprocess.CalledProcessError) as exc:
        fleet.down()
        shutil.rmtree(state, ignore_errors=True)
        pytest.fail(f"cannot start the sshd test hosts: {exc}", pytrace=False)
    try:
        yield Bastioned(fleet, bastion, target, locked)
    finally:
        fleet.down()
        shutil.rmtree(state, ignore_errors=True)


def _crosshost(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = "from orchestrator.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, timeout=180,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(cwd), "XDG_CACHE_HOME": str(cwd),
             **(env or {})},
    )  # fmt: skip


def test_an_alias_only_entry_resolves_through_an_ssh_config_file(bastioned: Bastioned, tmp_path: Path) -> None:
    f, j = bastioned.fleet, bastioned.bastion
    (tmp_path / "ssh_config").write_text(
        f"Host fleet-*\n    HostName 127.0.0.1\n    User nobody\n    IdentityFile {f.identity}\n"
        f"    ForwardAgent yes\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n\n"
        f"Host fleet-j\n    Port {j.port}\n"
    )
    inv = tmp_path / "hosts.toml"
    # user: the inventory's wins over ssh_config's (nobody has no shell)
    inv.write_text(f'[defaults]\nknown_hosts = "{f.known_hosts}"\nssh_config = "ssh_config"\n\n'
                   '[[hosts]]\nname = "j"\nssh = "fleet-j"\nuser = "root"\n')  # fmt: skip
    done = _crosshost("hosts", "-i", str(inv), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "box-j" in done.stdout  # the host's own hostname: the alias reached it
    notes = [line for line in done.stderr.splitlines() if line.startswith("j: ")]
    assert len(notes) == 3, done.stderr
    assert "ForwardAgent yes" in notes[0] and "StrictHostKeyChecking no" in notes[1] and "/dev/null" in notes[2]

    # StrictHostKeyChecking no is not followed: an unknown host key is still refused
    (tmp_path / "empty_known_hosts").write_text("")
    inv.write_text(inv.read_text().replace(str(f.known_hosts), str(tmp_path / "empty_known_hosts")))
    refused = _crosshost("hosts", "-i", str(inv), cwd=tmp_path)
    assert refused.returncode == 3
    assert f"j: HostKeyUnknown: unknown host key for [127.0.0.1]:{j.port}" in refused.stderr


def test_a_host_reached_only_through_the_bastion_as_a_non_root_user(bastioned: Bastioned, tmp_path: Path) -> None:
    f = bastioned.fleet
    inv = load_inventory(bastioned.inventory(tmp_path / "hosts.toml", f'identity_file = "{f.identity}"'))
    direct = inv.get("inner").model_copy(update={"jump": []})
    with pytest.raises(HostUnreachable):
        open_host(direct)  # the controller cannot even resolve the name
    with open_host(inv.get("inner")) as host:
        r = host.exec(["sh", "-c", "hostname; id -un; echo $HOME"], 10)
    assert r.ok and r.stdout.split() == ["box-t", "crossuser", "/home/crossuser"]
    # the bastion opened the forwarded connection to the target's name, resolved on its side
    log = bastioned.bastion.log.read_text()
    assert f"server_request_direct_tcpip: originator 127.0.0.1 port 0, target {TARGET_NAME} port {bastioned.target.port}" in log


def test_hosts_behind_one_bastion_share_one_connection_to_it(bastioned: Bastioned, tmp_path: Path) -> None:
    f = bastioned.fleet
    inv = load_inventory(bastioned.inventory(tmp_path / "hosts.toml", f'identity_file = "{f.identity}"'))
    cfgs = [inv.get("inner").model_copy(update={"name": f"inner-{i}"}) for i in range(4)]
    before = bastioned.accepted(bastioned.bastion)
    with cf.ThreadPoolExecutor(4) as pool:
        hosts = list(pool.map(open_host, cfgs))
    try:
        assert [h.exec(["hostname"], 10).stdout.strip() for h in hosts] == ["box-t"] * 4
        assert jump.live()["bastion"].opened >= 4
    finally:
        for h in hosts:
            h.close()
    assert bastioned.accepted(bastioned.bastion) - before == 1
    assert "bastion" not in jump.live()  # the last host behind it closed it


def test_a_bastion_with_an_unknown_host_key_is_refused_like_any_host(bastioned: Bastioned, tmp_path: Path) -> None:
    f = bastioned.fleet
    kh = tmp_path / "known_hosts"
    kh.write_text(bastioned.target.known_hosts_line(f"[{TARGET_NAME}]:{bastioned.target.port}"))  # the target only
    inv = load_inventory(bastioned.inventory(tmp_path / "hosts.toml", f'identity_file = "{f.identity}"',
                                             defaults=""))  # fmt: skip
    inner = inv.get("inner")
    cfg = inner.model_copy(update={"jump": [hop.model_copy(update={"known_hosts": kh}) for hop in inner.jump]})
    with pytest.raises(HostKeyRejected) as info:
        open_host(cfg)
    assert info.value.host == "inner" and f"[127.0.0.1]:{bastioned.bastion.port}" in str(info.value)
    # the key is the bastion's, not inner's: the message says whose
    assert f"unknown host key for jump host bastion ([127.0.0.1]:{bastioned.bastion.port})" in str(info.value)


def test_two_hops_from_ssh_config_proxy_jump(bastioned: Bastioned, tmp_path: Path) -> None:
    f, j, t = bastioned.fleet, bastioned.bastion, bastioned.target
    (tmp_path / "ssh_config").write_text(
        f"Host hop\n    HostName 127.0.0.1\n    Port {j.port}\n    User root\n    IdentityFile {f.identity}\n\n"
        f"Host far\n    HostName {TARGET_NAME}\n    Port {t.port}\n    User {t.user}\n"
        f"    IdentityFile {f.identity}\n    ProxyJump hop,root@127.0.0.1:{j.port}\n"
    )
    inv = tmp_path / "hosts.toml"
    inv.write_text(f'[defaults]\nknown_hosts = "{f.known_hosts}"\nssh_config = "ssh_config"\n\n'
                   '[[hosts]]\nname = "far"\nssh = "far"\n')  # fmt: skip
    cfg = load_inventory(inv).get("far")
    assert [h.name for h in cfg.jump] == ["hop", f"root@127.0.0.1:{j.port}"]
    with open_host(cfg) as host:
        assert host.exec(["hostname"], 10).stdout.strip() == "box-t"
    log = j.log.read_text()
    assert f"target 127.0.0.1 port {j.port}" in log  # hop 1 -> hop 2 (the bastion reached through itself)


def _askpass(tmp_path: Path) -> Path:
    script = tmp_path / "askpass.sh"
    script.write_text(f"#!/bin/sh\necho '{PASSPHRASE}'\n")
    script.chmod(0o700)
    return script


@pytest.fixture
def ssh_agent(tmp_path: Path) -> Iterator[str]:
    """A real ssh-agent on a socket of its own, stopped after the test."""
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail("ssh-agent did not start", pytrace=False)
            time.sleep(0.05)
        yield str(sock)
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


def test_a_passphrase_key_through_a_real_ssh_agent(
    bastioned: Bastioned, tmp_path: Path, ssh_agent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = bastioned.locked_key
    env = {"SSH_AUTH_SOCK": ssh_agent, "SSH_ASKPASS": str(_askpass(tmp_path)), "SSH_ASKPASS_REQUIRE": "force",
           "DISPLAY": ":0", "PATH": "/usr/bin:/bin"}  # fmt: skip
    subprocess.run(["ssh-add", str(key)], env=env, check=True, capture_output=True, timeout=30)
    monkeypatch.setenv("SSH_AUTH_SOCK", ssh_agent)
    inv = bastioned.inventory(tmp_path / "hosts.toml", f'identity_file = "{key}"\nuse_agent = true\n'
                              "identities_only = true")  # fmt: skip
    with open_host(load_inventory(inv).get("inner")) as host:
        r = host.exec(["sh", "-c", "hostname; echo agent=${SSH_AUTH_SOCK:-none}"], 10)
    # the agent signed on the controller; nothing was forwarded (the host's sshd would allow it)
    assert r.ok and r.stdout.split() == ["box-t", "agent=none"]

    # the same key without the agent holding it: refused, saying how to add it
    subprocess.run(["ssh-add", "-D"], env=env, check=True, capture_output=True, timeout=30)
    done = _crosshost("hosts", "-i", str(inv), cwd=tmp_path, env={"SSH_AUTH_SOCK": ssh_agent})
    assert done.returncode == 3
    assert f"inner: AuthenticationFailed: crossuser@[{TARGET_NAME}]:{bastioned.target.port} (via bastion): " \
           f"the ssh-agent at {ssh_agent} offers no key matching {key}.pub (identities_only); `ssh-add {key}`" in done.stderr


def test_a_passphrase_key_through_passphrase_env(bastioned: Bastioned, tmp_path: Path) -> None:
    key = bastioned.locked_key
    inv = bastioned.inventory(tmp_path / "hosts.toml", f'identity_file = "{key}"\npassphrase_env = "FLEET_KEY_PASS"')
    done = _crosshost("hosts", "-i", str(inv), cwd=tmp_path, env={"FLEET_KEY_PASS": PASSPHRASE})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "box-t" in done.stdout and "box-j" in done.stdout
    locked = _crosshost("hosts", "-i", str(inv), cwd=tmp_path)
    assert locked.returncode == 2
    assert locked.stderr.strip().endswith(f"key 'passphrase_env': FLEET_KEY_PASS is not set on the controller "
                                          f"(it must hold the passphrase of {key})")  # fmt: skip


def test_slots_on_an_sshd_host_give_the_verdicts_of_one_slot_with_attempts_overlapping(
    sshd_hosts: Any, tmp_path: Path
) -> None:
    from orchestrator.commands.replay import ReplayRequest, replay
    from orchestrator.store.jsonl import read_jsonl

    suite = tmp_path / "slow"
    for i in range(8):
        task = suite / "tasks" / f"sleep-{i}"
        (task / "repo").mkdir(parents=True)
        (task / "task.toml").write_text('[agent]\nkind = "none"\n')
        (task / "prompt.md").write_text("nothing to do\n")
        # on the host: when this attempt's predicate ran; odd tasks fail
        (task / "repo" / "run_tests.sh").write_text(
            f'echo "start $(date +%s%N)" >> /tmp/slots-{tmp_path.name}.log; sleep 1\n'
            f'echo "end $(date +%s%N)" >> /tmp/slots-{tmp_path.name}.log; exit {i % 2}\n'
        )
    shutil.copy(REPO / "examples" / "suites" / "triage" / "contract.json", suite / "contract.json")
    shutil.copy(REPO / "examples" / "suites" / "triage" / "tools.json", suite / "tools.json")
    (suite / "suite.toml").write_text('name = "slow"\nrepeat = 1\ncontract = "contract.json"\ntools = "tools.json"\n'
                                      '[agent]\nkind = "none"\n[budget]\ntimeout_s = 30\n')
    events: list[tuple[str, str, str]] = []
    runs = {}
    for slots in (1, 4):
        with open_host(sshd_hosts.config("box-a")) as host:  # each attempt is a uid of its own: one log all may append to
            host.exec(["sh", "-c", f"touch /tmp/slots-{tmp_path.name}.log && chmod 666 /tmp/slots-{tmp_path.name}.log"], 10)
        out = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, hosts=["box-a"],
                                   out=tmp_path / "runs", slots=slots),
                     on_event=lambda h, s, d: events.append((h, s, d)), with_analysis=False)  # fmt: skip
        assert out.manifest.hosts["box-a"].error is None
        runs[slots] = read_jsonl(out.run_dir.results_path)
        with open_host(sshd_hosts.config("box-a")) as host:
            log = host.exec(["sh", "-c", f"cat /tmp/slots-{tmp_path.name}.log; rm -f /tmp/slots-{tmp_path.name}.log"], 10)
        live = peak = 0
        for _, delta in sorted((int(ns), 1 if kind == "start" else -1) for kind, ns in (ln.split() for ln in log.stdout.splitlines())):
            live += delta
            peak = max(peak, live)
        assert peak == slots
    assert [(r["task"], r["verdict"]) for r in runs[4]] == [(r["task"], r["verdict"]) for r in runs[1]]
    assert [r["verdict"] for r in runs[4]] == ["pass", "fail"] * 4
    assert ("box-a", "run", "4 slots") in events and ("box-a", "run", "") in events  # the progress shows them


def test_bastion_connections_bounds_the_connections_being_opened_through_it(
    bastioned: Bastioned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.hosts.transport import session

    f = bastioned.fleet
    inv = load_inventory(bastioned.inventory(tmp_path / "hosts.toml", f'identity_file = "{f.identity}"',
                                             defaults="bastion_connections = 1"))  # fmt: skip
    real = session.start_transport
    opening = peak = 0
    lock = threading.Lock()

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal opening, peak
        if kwargs.get("via") is None:
            return real(*args, **kwargs)  # the bastion itself
        with lock:
            opening += 1
            peak = max(peak, opening)
        try:
            time.sleep(0.2)  # a slow handshake: without the bound, the others would overlap it
            return real(*args, **kwargs)
        finally:
            with lock:
                opening -= 1

    monkeypatch.setattr(session, "start_transport", counted)
    cfgs = [inv.get("inner").model_copy(update={"name": f"inner-{i}"}) for i in range(4)]
    with cf.ThreadPoolExecutor(4) as pool:
        hosts = list(pool.map(open_host, cfgs))
    try:
        assert [h.exec(["hostname"], 10).stdout.strip() for h in hosts] == ["box-t"] * 4
    finally:
        for h in hosts:
            h.close()
    assert peak == 1


def test_a_live_model_suite_runs_with_slots_through_the_proxy(
    sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempts at once on one host share its one reverse forward to the controller's model proxy."""
    import secrets

    from orchestrator.commands.replay import ReplayRequest, replay
    from orchestrator.store.jsonl import read_jsonl
    from tests.integration.test_openai_sshd import KEY_ENV, SCRIPT, openai_suite
    from tests.support.fake_provider import FakeProvider

    key = "sk-it-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    with FakeProvider(script=SCRIPT, key=key) as provider:
        suite = openai_suite(tmp_path, provider.base_url, repeat=4)
        out = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, hosts=["box-a"],
                                   out=tmp_path / "runs", slots=4), with_analysis=False)  # fmt: skip
    rows = read_jsonl(out.run_dir.results_path)
    assert [(r["attempt"], r["verdict"]) for r in rows] == [(a, "pass") for a in range(4)], [r.get("why") for r in rows]
    assert len(provider.requests) == 4 * 3
    assert out.manifest.hosts["box-a"].error is None


def test_a_held_model_works_with_slots(sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three attempts at once on each host: the reference's record is still matched per task and attempt."""
    import json
    import secrets

    from orchestrator.commands.replay import ReplayRequest, replay
    from tests.integration.test_hold_sshd import KEY_ENV, LOOKUPS, _suite
    from tests.support.fake_provider import FakeProvider

    key = "sk-it-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    with FakeProvider(script=LOOKUPS, key=key, mode="random") as provider:
        suite = _suite(tmp_path, provider.base_url, "lookups")
        done = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs",
                                    hosts=["local", "box-a"], slots=3))  # fmt: skip
    report = json.loads((done.run_dir.path / "report.json").read_text())
    [task] = report["tasks"]
    assert task["classification"] == "agree" and task["shape_diff"] == [], task
    assert task["model_hold"] == ["model held for 9 of 9 request(s) on box-a"]
    assert len(provider.requests) == 9  # the reference's only
