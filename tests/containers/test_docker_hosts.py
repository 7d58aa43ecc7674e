"""Container hosts against the real Docker daemon (tests/support/docker.py): ``image =`` hosts started
and removed by the run, an existing ``container =`` left running, and what a user relies on around
them: an image difference found and explained, nothing left after a normal end, a timeout or Ctrl-C,
a killed container as that host's failure, a pull that cannot hang the run, and the model key never
inside a container.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.commands.replay import ReplayRequest, replay
from orchestrator.hosts import host_job
from orchestrator.store.jsonl import read_jsonl
from orchestrator.store.rundir import RunDir
from tests.integration.test_openai_sshd import KEY_ENV, SCRIPT, openai_suite
from tests.support.docker import DockerBox, DockerDaemon, docker_inventory
from tests.support.fake_provider import FakeProvider
from tests.support.runner import predicate_suite

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
TRIAGE = REPO / "examples" / "suites" / "triage"
LABEL = "crosshost.host"
#: run inside a container with the key on stdin: names every process and file under /tmp, /root and
#: /var/tmp holding it, else prints "searched"
SEARCH = """
import os, sys
key = sys.stdin.read().encode()
hits = []
for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
    for part in ("environ", "cmdline"):
        try:
            if key in open("/proc/%s/%s" % (pid, part), "rb").read():
                hits.append("pid %s %s" % (pid, part))
        except OSError:
            pass
for top in ("/tmp", "/root", "/var/tmp"):
    for d, _, files in os.walk(top):
        for f in files:
            try:
                if key in open(os.path.join(d, f), "rb").read():
                    hits.append(os.path.join(d, f))
            except OSError:
                pass
print(" ".join(hits) or "searched")
"""


def _left(daemon: DockerDaemon, *names: str) -> list[str]:
    """The containers of these inventory names still there (other modules' tests may run beside)."""
    return [c for name in names for c in daemon.containers(f"{LABEL}={name}")]


def _image_hosts(daemon: DockerDaemon, **extra: Any) -> list[dict[str, Any]]:
    return [
        {"name": "utf8", "transport": "docker", "image": daemon.images["py-utf8"], **extra},
        {"name": "posix", "transport": "docker", "image": daemon.images["py-posix"], **extra},
    ]


def _inventory(tmp_path: Path, daemon: DockerDaemon, hosts: list[dict[str, Any]]) -> Path:
    return docker_inventory(tmp_path / "hosts.toml", hosts, docker_host=daemon.docker_host, connect_timeout_s=10)


def _crosshost(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def test_two_images_flip_and_explain_says_why_and_no_container_is_left(docker_daemon: DockerDaemon, tmp_path: Path) -> None:
    inventory = _inventory(tmp_path, docker_daemon, _image_hosts(docker_daemon))
    proc = _crosshost(
        "replay", str(TRIAGE), "-i", str(inventory), "--out", str(tmp_path / "runs"), "--repeat", "1",
        "--tasks", "locale-probe,feature-flag-probe,restart-unhealthy-only", "--explain", cwd=tmp_path,
    )  # fmt: skip
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, (out, err)  # flips over the gate: the finding, not a failure
    (run,) = [d for d in (tmp_path / "runs").iterdir() if (d / "explain.json").is_file()]  # explain's runs beside it
    report = json.loads((run / "report.json").read_text())
    assert sorted(t["task"] for t in report["tasks"] if t["flip"]) == ["feature-flag-probe", "locale-probe"]
    explained = {t["task"]: t for t in json.loads((run / "explain.json").read_text())["tasks"]}
    # the locale default of the image: utf8 given posix's LANG (unset) fails too
    lang = [c for c in explained["locale-probe"]["counterfactuals"] if c["fact"] == "LANG"]
    assert lang and lang[0]["reproduces"] is True and lang[0]["value"] is None
    # the file only one image ships, seen by strace inside both containers
    (flag,) = [p for p in explained["feature-flag-probe"]["paths"] if p["path"] == "/opt/crosshost-demo/feature.flag"]
    assert flag["state"]["utf8"] == "absent" and flag["state"]["posix"].startswith("file 0 bytes")
    assert "LANG" in out and "/opt/crosshost-demo/feature.flag" in out
    manifest = RunDir(run).read_manifest()
    facts = {name: manifest.hosts[name].container or {} for name in ("utf8", "posix")}
    for name, image in (("utf8", "py-utf8"), ("posix", "py-posix")):
        assert manifest.hosts[name].workspace_removed is True
        assert facts[name]["image"] == docker_daemon.images[image] and facts[name]["started"] is True
        assert str(facts[name]["image_id"]).startswith("sha256:") and facts[name]["network"] == "none"
        assert facts[name]["server_version"] and facts[name]["runtime"]
    assert facts["utf8"]["image_id"] != facts["posix"]["image_id"]
    assert manifest.hosts["utf8"].fingerprint != manifest.hosts["posix"].fingerprint
    # the run's containers and those of explain's replays: all gone
    assert _left(docker_daemon, "utf8", "posix", "absent") == []


def test_an_image_hosts_fingerprint_is_the_same_in_every_probe_and_in_a_replay(docker_daemon: DockerDaemon, tmp_path: Path) -> None:
    from orchestrator.commands.probe import probe

    inventory = _inventory(tmp_path, docker_daemon, _image_hosts(docker_daemon))
    first = {r.name: r.fingerprint for r in probe(inventory)}
    second = {r.name: r.fingerprint for r in probe(inventory)}
    assert all(first.values()) and first == second  # a new container each time, the same host
    probed = {r.name: r.fingerprint for r in probe(inventory, suite=TRIAGE)}
    out = replay(ReplayRequest(suite_dir=TRIAGE, inventory_path=inventory, out=tmp_path / "runs",
                               tasks=["locale-probe"], repeat=1), with_analysis=False)  # fmt: skip
    assert {n: r.fingerprint for n, r in out.manifest.hosts.items()} == probed
    assert probed["utf8"] != probed["posix"]
    assert _left(docker_daemon, "utf8", "posix", "absent") == []


def test_an_existing_container_is_used_and_left_running(docker_box: DockerBox, tmp_path: Path) -> None:
    daemon = docker_box.daemon
    box = {"name": "box", "transport": "docker", "container": docker_box.name}
    inventory = _inventory(tmp_path, daemon, [box, _image_hosts(daemon)[0]])  # the box runs that image too
    out = replay(ReplayRequest(suite_dir=TRIAGE, inventory_path=inventory, out=tmp_path / "runs",
                               tasks=["locale-probe", "restart-unhealthy-only"], repeat=1))  # fmt: skip
    rec = out.manifest.hosts["box"]
    assert out.exit_code == 0 and rec.error is None and rec.workspace_removed is True, rec
    assert [r["verdict"] for r in read_jsonl(out.run_dir.results_path)] == ["pass"] * 4
    assert rec.container is not None and rec.container["started"] is False
    running = daemon.docker("inspect", "-f", "{{.State.Running}}", docker_box.name).stdout.strip()
    assert running == "true"
    left = daemon.docker("exec", docker_box.name, "sh", "-c", f"ls -d /tmp/crosshost/runs/{out.manifest.run_id}* 2>/dev/null; true")
    assert left.stdout.strip() == ""


def test_a_run_past_its_time_is_the_hosts_failure_and_its_container_is_removed(
    docker_daemon: DockerDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_job, "RUN_MARGIN_S", 2)  # the runner is killed after 1 s x 2 attempts + 2 s
    suite = predicate_suite(tmp_path, "sleep 20\necho ok", tasks=2, prefix="sleep")
    inventory = _inventory(tmp_path, docker_daemon, [_image_hosts(docker_daemon, timeout_s=1)[0]])
    out = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs"), with_analysis=False)
    rec = out.manifest.hosts["utf8"]
    assert out.exit_code == 3 and rec.error and "RunnerCrashed" in rec.error and "killed" in rec.error, rec
    assert _left(docker_daemon, "utf8") == []


def test_ctrl_c_removes_the_runs_containers(docker_daemon: DockerDaemon, tmp_path: Path) -> None:
    suite = predicate_suite(tmp_path, "sleep 5\necho ok", tasks=4, prefix="sleep")
    inventory = _inventory(tmp_path, docker_daemon, _image_hosts(docker_daemon))
    proc = _crosshost("replay", str(suite), "-i", str(inventory), "--out", str(tmp_path / "runs"), cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        # both containers up and a runner in each (its workspace's pid file written)
        while time.monotonic() < deadline:
            ids = _left(docker_daemon, "utf8", "posix")
            running = [
                c for c in ids
                if docker_daemon.docker("exec", c, "sh", "-c", "ls /tmp/crosshost/runs/*/pid").returncode == 0
            ]  # fmt: skip
            if len(running) == 2:
                break
            time.sleep(0.3)
        else:
            pytest.fail(f"the runners did not start: {proc.stderr.read() if proc.poll() is not None else ''}")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert _left(docker_daemon, "utf8", "posix", "absent") == []


def test_a_killed_container_is_that_hosts_failure_the_other_finishes(docker_daemon: DockerDaemon, tmp_path: Path) -> None:
    suite = predicate_suite(tmp_path, "sleep 1\necho ok", tasks=3, prefix="sleep")
    inventory = _inventory(tmp_path, docker_daemon, _image_hosts(docker_daemon))
    killed = threading.Event()

    def kill_posix() -> None:
        (cid,) = docker_daemon.containers(f"{LABEL}=posix")
        docker_daemon.docker("kill", cid)
        killed.set()

    armed: list[bool] = []

    def hook(host: str, stage: str, detail: str) -> None:
        # once: a host whose bundle is not there yet enters "run" twice (refused, pushed, run again)
        if host == "posix" and stage == "run" and not armed:
            armed.append(True)
            threading.Timer(1.5, kill_posix).start()

    out = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs"), on_event=hook,
                 with_analysis=False)  # fmt: skip
    assert killed.is_set()
    assert out.exit_code == 3
    rec = out.manifest.hosts["posix"]
    assert rec.error and "posix: HostUnreachable" in rec.error and "container" in rec.error, rec
    assert out.manifest.hosts["utf8"].error is None and out.manifest.hosts["utf8"].workspace_removed is True
    rows = read_jsonl(out.run_dir.results_path)
    assert [r["verdict"] for r in rows if r["env"] == "utf8"] == ["pass"] * 3
    assert _left(docker_daemon, "utf8", "posix", "absent") == []


def test_a_pull_that_never_answers_is_bounded_and_names_the_host(docker_daemon: DockerDaemon, tmp_path: Path) -> None:
    # a "registry" on this machine's loopback that accepts and then says nothing
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        held: list[socket.socket] = []
        stop = threading.Event()

        def accept() -> None:
            silent.settimeout(0.2)
            while not stop.is_set():
                try:
                    held.append(silent.accept()[0])
                except OSError:
                    continue

        threading.Thread(target=accept, daemon=True).start()
        absent = {"name": "absent", "transport": "docker", "image": f"127.0.0.1:{port}/crosshost/absent:1", "pull_timeout_s": 3}
        inventory = _inventory(tmp_path, docker_daemon, [_image_hosts(docker_daemon)[0], absent])
        try:
            out = replay(ReplayRequest(suite_dir=TRIAGE, inventory_path=inventory, out=tmp_path / "runs",
                                       tasks=["locale-probe"], repeat=1), with_analysis=False)  # fmt: skip
        finally:
            stop.set()
            for conn in held:
                conn.close()
    rec = out.manifest.hosts["absent"]
    assert out.exit_code == 3 and rec.reachable is False
    assert rec.error and "absent: HostUnreachable" in rec.error and "pull_timeout_s = 3" in rec.error, rec
    assert held, "the daemon never asked the registry"
    assert out.manifest.hosts["utf8"].error is None


def test_the_model_key_never_enters_a_container(
    docker_daemon: DockerDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-it-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    inventory = _inventory(tmp_path, docker_daemon, _image_hosts(docker_daemon))
    seen: list[str] = []

    def look_inside() -> None:
        # while a runner waits on the model: every process's environment and command line, and every
        # file under the container's writable places, searched for the key (given on stdin: on a
        # command line it would be found in the search itself)
        for cid in _left(docker_daemon, "utf8", "posix"):
            res = subprocess.run(
                ["docker", "-H", docker_daemon.docker_host, "exec", "-i", cid, "python3", "-c", SEARCH],
                input=key, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            # a container whose host finished meanwhile is gone before the exec reaches it: no search
            seen.append(f"{cid} {res.returncode} {res.stdout.split() or ['gone']}")

    with FakeProvider(script=SCRIPT, key=key, on_request=look_inside) as provider:
        suite = openai_suite(tmp_path, provider.base_url, repeat=1)
        out = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs", hold_model=False))
    rows = read_jsonl(out.run_dir.results_path)
    assert sorted((r["env"], r["verdict"]) for r in rows) == [("posix", "pass"), ("utf8", "pass")], [r.get("why") for r in rows]
    assert len(provider.requests) == 2 * 3 and {r.headers["authorization"] for r in provider.requests} == {f"Bearer {key}"}
    # the containers have no network: the proxy was reached through the exec relay only
    assert all((out.manifest.hosts[n].container or {}).get("network") == "none" for n in ("utf8", "posix"))
    # every request came from a runner waiting in a live container, so at least one search per request
    # ran; none found the key, and a failed exec printed nothing (it searched nothing, found nothing)
    assert sum(s.endswith(" 0 ['searched']") for s in seen) >= 6, seen
    assert all(s.endswith(" 0 ['searched']") or s.endswith("['gone']") for s in seen), seen
    for path in out.run_dir.path.rglob("*"):
        assert not path.is_file() or key.encode() not in path.read_bytes(), path
    assert _left(docker_daemon, "utf8", "posix", "absent") == []


@pytest.mark.sshd
def test_local_two_sshd_hosts_and_two_containers_in_one_run(
    docker_daemon: DockerDaemon, sshd_hosts: Any, tmp_path: Path
) -> None:
    inventory = docker_inventory(
        tmp_path / "hosts.toml",
        [{**h, "docker_host": docker_daemon.docker_host} for h in _image_hosts(docker_daemon)],
        head=sshd_hosts.inventory_path.read_text(),
    )
    out = replay(ReplayRequest(suite_dir=TRIAGE, inventory_path=inventory, out=tmp_path / "runs",
                               tasks=["locale-probe", "feature-flag-probe", "restart-unhealthy-only"], repeat=1))  # fmt: skip
    names = ["local", "box-a", "box-b", "utf8", "posix"]
    assert list(out.manifest.hosts) == names and out.exit_code in (0, 1)
    for name in names:
        rec = out.manifest.hosts[name]
        assert rec.reachable and rec.error is None and rec.workspace_removed is True, (name, rec)
    assert len({out.manifest.hosts[n].fingerprint for n in names}) == 5
    report = json.loads((out.run_dir.path / "report.json").read_text())
    for task in report["tasks"]:
        assert set(task["verdicts"]) == set(names)
    by_task = {t["task"]: t for t in report["tasks"]}
    assert by_task["restart-unhealthy-only"]["flip"] is False
    assert by_task["locale-probe"]["flip"] is True  # posix has no UTF-8 locale
    assert _left(docker_daemon, "utf8", "posix", "absent") == []


@pytest.mark.parametrize("via", ["docker-exec", "nsenter"])
def test_a_command_host_replays_like_any_host(via: str, docker_box: DockerBox, tmp_path: Path) -> None:
    daemon = docker_box.daemon
    argv = (
        ["docker", "-H", daemon.docker_host, "exec", "-i", docker_box.name] if via == "docker-exec"
        else ["nsenter", "-t", str(docker_box.pid), "-a"]
    )  # fmt: skip
    inventory = _inventory(tmp_path, daemon, [_image_hosts(daemon)[0], {"name": "cmd", "transport": "command", "argv": argv}])
    out = replay(ReplayRequest(suite_dir=TRIAGE, inventory_path=inventory, out=tmp_path / "runs",
                               tasks=["feature-flag-probe", "restart-unhealthy-only"], repeat=1))  # fmt: skip
    rec = out.manifest.hosts["cmd"]
    assert out.exit_code == 0 and rec.error is None and rec.workspace_removed is True, rec
    fp = json.loads((out.run_dir.path / "hosts" / "cmd" / "fingerprint.json").read_text())
    assert fp["hostname"] == daemon.docker("inspect", "-f", "{{.Config.Hostname}}", docker_box.name).stdout.strip()
    assert [r["verdict"] for r in read_jsonl(out.run_dir.results_path)] == ["pass"] * 4
    left = daemon.docker("exec", docker_box.name, "sh", "-c", f"ls -d /tmp/crosshost/runs/{out.manifest.run_id}* 2>/dev/null; true")
    assert left.stdout.strip() == ""
