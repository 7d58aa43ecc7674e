"""agent.kind = "openai" replayed on the local host and two real sshd hosts: the key never leaves home.

The provider is a real chat-completions server on the controller's loopback (tests/support/fake_provider.py).
While each request is being answered, the runner that sent it is alive and waiting, so the provider
takes a snapshot of /proc then: which runner processes exist, in which host's UTS namespace, what
CROSSHOST_MODEL_URL they were given, who listens on that port, and whether the key is in the
environment of any runner or of any process of the SSH hosts.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator.commands.replay import ReplayRequest, replay
from orchestrator.errors import ApiKeyMissing
from orchestrator.store.jsonl import read_jsonl
from orchestrator.store.rundir import RunDir
from tests.support.fake_provider import FakeProvider, unused_port

pytestmark = pytest.mark.sshd

KEY_ENV = "CROSSHOST_IT_MODEL_KEY"
CONTRACT = {
    "contract_id": "live.v1",
    "tools": [
        {"name": "lookup", "required_args": ["q"]},
        {"name": "write_file", "required_args": ["path", "content"]},
    ],
    "invariants": ["no_absolute_local_paths", "no_home_directory_strings", "no_hostname_in_tool_args"],
}
SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "lookup", "args": {"q": "answer"}}]},
    {"tool_calls": [{"name": "write_file", "args": {"path": "answer.txt", "content": "42"}}]},
    {"content": "wrote it", "finish": "stop"},
]


def openai_suite(root: Path, base_url: str, *, repeat: int | None = None) -> Path:
    suite = root / "live"
    (suite / "tasks" / "answer" / "repo").mkdir(parents=True)
    (suite / "suite.toml").write_text(
        'name = "live"\n'
        + (f"repeat = {repeat}\n" if repeat else "")
        + f'[agent]\nkind = "openai"\nmodel = "m1"\nbase_url = "{base_url}"\napi_key_env = "{KEY_ENV}"\n'
        "temperature = 0\nseed = 7\nmax_tokens = 256\nmax_requests = 50\n"
        "[budget]\nmax_steps = 6\ntimeout_s = 60\n"
    )
    (suite / "contract.json").write_text(json.dumps(CONTRACT))
    (suite / "tools.json").write_text(json.dumps({"allow": [], "deny": []}))
    task = suite / "tasks" / "answer"
    (task / "task.toml").write_text('[fixtures]\nlookup = "the answer is 42"\n')
    (task / "prompt.md").write_text("Find the answer and write it to answer.txt.\n")
    (task / "repo" / "run_tests.sh").write_text('test "$(cat answer.txt)" = 42\n')
    return suite


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def process_view(pid: str) -> tuple[list[bytes], bytes] | None:
    """A process's command line (split) and environment, read as one program's: None when it exec'd or
    ended between the reads (an attempt forked from a runner, then its predicate), whose environment
    read may be the next program's, or none."""
    cmdline = _read(f"/proc/{pid}/cmdline")
    environ = _read(f"/proc/{pid}/environ")
    if not cmdline or _read(f"/proc/{pid}/cmdline") != cmdline:
        return None
    return cmdline.split(b"\0"), environ


def _uts(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/uts")
    except OSError:
        return None


def _listener_comms(port: int) -> set[str]:
    """The command names of the processes that LISTEN on 127.0.0.1:``port``."""
    inodes = set()
    for line in _read("/proc/net/tcp").decode().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:
            inodes.add(f"socket:[{fields[9]}]")
    comms: set[str] = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    comms.add(_read(f"/proc/{pid}/comm").decode().strip())
            except OSError:
                continue
    return comms


class ProcessWatch:
    """Snapshots taken while runners wait on the model (FakeProvider.on_request)."""

    def __init__(self, key: str, host_uts: dict[str, str], marker: str) -> None:
        self.key = key.encode()
        self.marker = marker.encode()  # in our runners' command lines (others may run on this machine)
        self.host_of_uts = {uts: name for name, uts in host_uts.items()}
        self.own_uts = _uts("self")
        self.lock = threading.Lock()
        self.offenders: list[str] = []
        self.runner_urls: dict[str, set[str]] = {}  # host -> CROSSHOST_MODEL_URL values seen
        self.url_listeners: dict[str, set[str]] = {}
        self.foreign_processes = 0

    def __call__(self) -> None:
        seen: dict[str, set[str]] = {}
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            uts = _uts(pid)
            seen_now = process_view(pid)
            if seen_now is None:
                continue
            cmdline, environ = seen_now
            host = self.host_of_uts.get(uts or "", "local" if uts == self.own_uts else None)
            # the runner itself (python3 runner.pyz run ...), not the timeout/env wrappers around it
            is_runner = (
                os.path.basename(cmdline[0]).startswith(b"python")
                and any(a.endswith(b"runner.pyz") for a in cmdline)
                and b"run" in cmdline
                and any(self.marker in a for a in cmdline)
            )
            if uts != self.own_uts and host is not None:
                self.foreign_processes += 1
            if (is_runner or (host is not None and host != "local")) and self.key in environ:
                self.offenders.append(f"{host}: pid {pid}: {b' '.join(cmdline)[:200]!r}")
            if is_runner and host is not None:
                env = dict(v.split(b"=", 1) for v in environ.split(b"\0") if b"=" in v)
                url = env.get(b"CROSSHOST_MODEL_URL", b"").decode()
                seen.setdefault(host, set()).add(url)
        with self.lock:
            for host, urls in seen.items():
                self.runner_urls.setdefault(host, set()).update(urls)
                for url in urls:
                    if url and url not in self.url_listeners:
                        self.url_listeners[url] = _listener_comms(int(url.rsplit(":", 1)[1].split("/")[0]))


def _files_holding(root: Path, needle: bytes) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and needle in _read(str(path)):
            hits.append(str(path))
    return hits


def _refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_openai_suite_on_local_and_two_sshd_hosts_keeps_the_key_home(
    sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-it-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    fleet = sshd_hosts.fleet
    workspace_root = f"/tmp/crosshost-openai-{secrets.token_hex(4)}"
    inventory = fleet.write_inventory(
        tmp_path / "hosts.toml", ["box-a", "box-b"], connect_timeout_s=5,
        extra_defaults={"workspace_root": workspace_root},
    )  # fmt: skip
    watch = ProcessWatch(
        key, {n: _uts(fleet.hosts[n].ns_pid()) or "" for n in ("box-a", "box-b")}, workspace_root
    )
    try:
        with FakeProvider(script=SCRIPT, key=key, on_request=watch) as provider:
            suite = openai_suite(tmp_path, provider.base_url)  # no repeat: a live model defaults to 3
            # every host asks the provider itself here (a held model would answer the others at home)
            request = ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs", hold_model=False)
            out = replay(request)
        run_dir = out.run_dir.path
        manifest = RunDir(run_dir).read_manifest()
        rows = read_jsonl(run_dir / "results.jsonl")

        # Every attempt passed on every host, three attempts each.
        assert manifest.repeat == 3
        assert sorted((r["env"], r["attempt"], r["verdict"]) for r in rows) == [
            (h, a, "pass") for h in ("box-a", "box-b", "local") for a in range(3)
        ], [r.get("why") for r in rows]
        assert all(not rec.error for rec in manifest.hosts.values())

        # All calls reached the provider, and only through the proxy (only it holds the key).
        assert len(provider.requests) == 3 * 3 * 3
        assert {r.headers["authorization"] for r in provider.requests} == {f"Bearer {key}"}
        for host in ("local", "box-a", "box-b"):
            calls = [
                json.loads(line)
                for line in (run_dir / "hosts" / host / "model_calls.jsonl").read_text().splitlines()
            ]
            assert [c["status"] for c in calls] == [200] * 9, host
            trace = read_jsonl(run_dir / "hosts" / host / "traces" / "answer.0.jsonl")
            assert (
                trace[-1]["model"]["requests"] == 3
                and trace[1]["model"]["system_fingerprint"] == "fp_fake_0001"
            )

        # The runners were seen waiting on the model, on each host; SSH hosts through their own forward.
        assert set(watch.runner_urls) == {"local", "box-a", "box-b"}, watch.runner_urls
        assert watch.foreign_processes > 0
        for host in ("box-a", "box-b"):
            (url,) = watch.runner_urls[host]
            assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
            assert watch.url_listeners[url] == {"sshd"}, (host, url, watch.url_listeners)
            assert _refused(int(url.rsplit(":", 1)[1].split("/")[0])), (
                f"{host}: forward still open after the run"
            )
        (local_url,) = watch.runner_urls["local"]
        assert watch.url_listeners[local_url] != {"sshd"}  # the local runner talks to the proxy directly

        # The key is in no runner's or remote process's environment, no remote file, no pulled file.
        assert watch.offenders == []
        for host in ("box-a", "box-b"):
            for sub in ("root", "tmp", "opt"):
                assert _files_holding(fleet.hosts[host].dir / sub, key.encode()) == [], (host, sub)
        assert _files_holding(Path(workspace_root), key.encode()) == []
        assert _files_holding(run_dir, key.encode()) == []
        assert _files_holding(run_dir, KEY_ENV.encode() + b"=") == []
    finally:
        shutil.rmtree(workspace_root, ignore_errors=True)


def test_unset_api_key_env_stops_the_replay_before_any_host(
    sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    suite = openai_suite(tmp_path, "http://127.0.0.1:9/v1", repeat=1)
    with pytest.raises(ApiKeyMissing) as got:
        replay(
            ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs")
        )
    assert KEY_ENV in got.value.one_line() and "suite.toml" in got.value.one_line()
    assert got.value.exit_code == 2
    assert not any((tmp_path / "runs").glob("*/manifest.json"))


def test_unreachable_provider_is_an_error_verdict_on_every_host(
    sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-it-" + secrets.token_hex(16))
    suite = openai_suite(tmp_path, f"http://127.0.0.1:{unused_port()}/v1", repeat=1)
    out = replay(
        ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs")
    )
    rows = read_jsonl(out.run_dir.path / "results.jsonl")
    assert sorted(r["env"] for r in rows) == ["box-a", "box-b", "local"]
    for row in rows:
        assert (row["verdict"], row["reason"]) == ("error", "agent_error"), row
        assert "unreachable" in row["why"] and "\n" not in row["why"]
    report = json.loads((out.run_dir.path / "report.json").read_text())
    assert [t["classification"] for t in report["tasks"]] == ["infra_error"]  # never the agent's failure
    # an error verdict is the harness's or the host's failure: exit 3, naming the hosts, never 0
    assert out.exit_code == 3, out.exit_reason
    assert out.exit_reason.startswith("1 error verdict(s) on local: agent_error"), out.exit_reason
