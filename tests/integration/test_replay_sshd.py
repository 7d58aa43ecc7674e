"""crosshost replay against real sshd hosts (each in its own UTS + mount namespace).

What a user relies on: the run directory is complete with different fingerprints; a host that dies
mid-run is that host's failure only (exit 3, no hang); nothing of the controller's environment
reaches a runner; and after success, failure, Ctrl-C and a host's death nothing of the run is left
under workspace_root on any host that can still be reached.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.commands.replay import ReplayRequest, replay
from orchestrator.hosts import remote
from orchestrator.hosts.transport import SshHost, open_host
from orchestrator.store.jsonl import read_jsonl
from orchestrator.store.rundir import RunDir
from tests.support.runner import predicate_suite

pytestmark = pytest.mark.sshd

REPO = Path(__file__).resolve().parents[2]
TRIAGE = REPO / "examples" / "suites" / "triage"
SECRET = "crosshost-test-token-3c1f9a"


def _slow_suite(root: Path, *, tasks: int, sleep_s: float) -> Path:
    """A suite of predicate-only tasks, each sleeping ``sleep_s``: long enough to be killed mid-run."""
    return predicate_suite(root, f"sleep {sleep_s}\necho ok", tasks=tasks, prefix="sleep")


def _left_of_run(inventory_path: Path, run_id: str, skip: set[str] = frozenset()) -> dict[str, str]:
    """Per reachable host: what is left of this run under its workspace_root ('' when nothing)."""
    from orchestrator.hosts.inventory import load_inventory

    left: dict[str, str] = {}
    for cfg in load_inventory(inventory_path).hosts:
        if cfg.name in skip:
            continue
        host = open_host(cfg)
        try:
            res = host.exec(
                ["sh", "-c", f"ls -d {cfg.workspace_root}/runs/{run_id}* {cfg.workspace_root}/runs/probe-* "
                 f"{cfg.workspace_root}/probe-* "
                 f"{cfg.workspace_root}/bundles/.tmp-* 2>/dev/null; true"],
                30,
            )  # fmt: skip
            left[cfg.name] = res.stdout.strip()
        finally:
            host.close()
    return left


def _runs_on(inventory_path: Path, name: str) -> list[str]:
    """The names under a host's <workspace_root>/runs right now (where a run's workspace lives)."""
    from orchestrator.hosts.inventory import load_inventory

    cfg = load_inventory(inventory_path).get(name)
    host = open_host(cfg)
    try:
        return host.exec(["sh", "-c", f"ls {cfg.workspace_root}/runs"], 30).stdout.split()
    finally:
        host.close()


def test_replay_on_local_and_two_sshd_hosts(sshd_hosts: Any, tmp_path: Path) -> None:
    req = ReplayRequest(
        suite_dir=TRIAGE, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs",
        tasks=["feature-flag-probe", "restart-unhealthy-only", "locale-probe"], repeat=1,
    )  # fmt: skip
    out = replay(req)
    rd = out.run_dir.path
    m = RunDir(rd).read_manifest()
    assert out.exit_code in (0, 1), m.hosts  # no infrastructure failure
    assert list(m.hosts) == ["local", "box-a", "box-b"] and m.reference == "local"
    fingerprints = {}
    for name in ("local", "box-a", "box-b"):
        rec = m.hosts[name]
        assert rec.reachable and rec.error is None and rec.workspace_removed is True, (name, rec)
        fp = json.loads((rd / "hosts" / name / "fingerprint.json").read_text())
        fingerprints[name] = fp["fingerprint"]
        if name != "local":
            assert fp["hostname"] == name  # its own UTS namespace
        traces = sorted(p.name for p in (rd / "hosts" / name / "traces").glob("*.jsonl"))
        assert "feature-flag-probe.0.jsonl" in traces and "locale-probe.0.jsonl" in traces
    assert len(set(fingerprints.values())) == 3
    rows = read_jsonl(rd / "results.jsonl")
    assert len(rows) == 9 and {r["env"] for r in rows} == {"local", "box-a", "box-b"}
    assert all(r["verdict"] in ("pass", "fail") for r in rows)
    assert json.loads((rd / "contract.json").read_text())["contract_id"] == "issue.triage.v3"
    assert not any("identity_file" in h for h in m.inventory["hosts"])  # no key paths in the record
    assert _left_of_run(sshd_hosts.inventory_path, m.run_id) == {"local": "", "box-a": "", "box-b": ""}
    # The analysis ran on what came back: the three reports, one entry per task with every host's
    # verdict and a decision-table row, and the exit code that validity and the gate give.
    report = json.loads((rd / "report.json").read_text())
    assert {t["task"] for t in report["tasks"]} == set(req.tasks or [])
    for task in report["tasks"]:
        assert set(task["verdicts"]) == {"local", "box-a", "box-b"}
        assert task["classification"] and task["action"]
    assert out.exit_code == (0 if report["valid"] and report["flip_rate"] <= report["gate"] else 1)
    junit = (rd / "junit.xml").read_text()
    assert all(f'name="{t}"' in junit for t in req.tasks or [])
    assert "locale-probe" in (rd / "report.md").read_text()
    # A second replay finds the bundle cached on every host.
    again = replay(ReplayRequest(suite_dir=TRIAGE, inventory_path=sshd_hosts.inventory_path,
                                 out=tmp_path / "runs", tasks=["locale-probe"], repeat=1))  # fmt: skip
    assert all(rec.bundle_pushed is False for rec in again.manifest.hosts.values())


@pytest.mark.parametrize("inline_max", [remote.INLINE_MAX_BYTES, 0], ids=["in-the-runs-output", "fetched"])
def test_the_workspace_is_removed_on_the_host_while_the_controller_reads_its_archive(
    sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inline_max: int
) -> None:
    """The clean's exec starts once the archive is home, beside the controller's reading and checking
    of it: by the time the archive is read the host's workspace is gone (seen on the host), the
    results are whole, and the manifest says removed. Alike for an archive that came in the run's own
    output and one fetched over SFTP (a host's archive over the inline size)."""
    from orchestrator.hosts import workspace as workspace_module

    monkeypatch.setattr(remote, "INLINE_MAX_BYTES", inline_max)
    fetched: list[str] = []
    get = SshHost.get

    def counting_get(self: SshHost, remote_path: str, local: Path, **kwargs: Any) -> None:
        fetched.append(self.name)
        get(self, remote_path, local, **kwargs)

    monkeypatch.setattr(SshHost, "get", counting_get)

    read_archive = workspace_module.read_archive
    gone_before_read: dict[str, bool] = {}

    def read_once_removed(local: Path, into: Path, *, host: str, **kwargs: Any) -> Any:
        deadline = time.monotonic() + 10
        gone = False
        while not gone and time.monotonic() < deadline:
            gone = not any(n.endswith(f"-{host}") for n in _runs_on(sshd_hosts.inventory_path, host))
            time.sleep(0.05)
        gone_before_read[host] = gone
        return read_archive(local, into, host=host, **kwargs)

    monkeypatch.setattr(workspace_module, "read_archive", read_once_removed)
    out = replay(ReplayRequest(suite_dir=TRIAGE, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs",
                               hosts=["box-a", "box-b"], tasks=["locale-probe"], repeat=1))  # fmt: skip
    m = RunDir(out.run_dir.path).read_manifest()
    assert out.exit_code in (0, 1) and all(rec.error is None for rec in m.hosts.values()), m.hosts
    assert gone_before_read == {"box-a": True, "box-b": True}
    assert all(rec.workspace_removed for rec in m.hosts.values())
    rows = read_jsonl(out.run_dir.path / "results.jsonl")
    assert sorted(r["env"] for r in rows) == ["box-a", "box-b"]
    assert _left_of_run(sshd_hosts.inventory_path, out.run_dir.run_id, skip={"local"}) == {"box-a": "", "box-b": ""}
    assert sorted(fetched) == ([] if inline_max else ["box-a", "box-b"])


def test_controller_secret_reaches_no_runner_and_no_pulled_file(
    sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CROSSHOST_TEST_TOKEN", SECRET)
    # A real interpreter everywhere: a pyenv shim (the controller's python3 here) adds PYENV_* itself.
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(
        sshd_hosts.inventory_path.read_text().replace("[defaults]\n", '[defaults]\npython = "/usr/bin/python3"\n', 1)
    )
    req = ReplayRequest(suite_dir=TRIAGE, inventory_path=inventory, out=tmp_path / "runs",
                        tasks=["locale-probe", "leaky-workdir"], repeat=1)  # fmt: skip
    out = replay(req, with_analysis=False)
    rd = out.run_dir.path
    allow = set(sshd_hosts.config("box-a").env_allowlist)
    for name in ("local", "box-a", "box-b"):
        assert out.manifest.hosts[name].error is None, out.manifest.hosts[name]
        fp = json.loads((rd / "hosts" / name / "fingerprint.json").read_text())
        # The runner's own view of its environment: allowlisted keys (those the host has) only.
        assert "CROSSHOST_TEST_TOKEN" not in fp["env_keys"]
        assert "PATH" in fp["env_keys"]
        # LC_CTYPE: Python itself sets it under the C locale (PEP 538 locale coercion).
        assert set(fp["env_keys"]) - allow <= {"LC_CTYPE"}, fp["env_keys"]
    files = [p for p in rd.rglob("*") if p.is_file()]
    assert any(p.suffix == ".jsonl" for p in files)
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path


def test_host_killed_mid_run_others_finish_exit_3(fresh_sshd_host: Any, tmp_path: Path) -> None:
    suite = _slow_suite(tmp_path, tasks=3, sleep_s=2)
    fleet = fresh_sshd_host.fleet
    killed = threading.Event()

    def hook(host: str, stage: str, detail: str) -> None:
        if host == "box-c" and stage == "run" and not killed.is_set():
            killed.set()
            threading.Timer(2.5, fleet.kill, args=["box-c"]).start()

    started = time.monotonic()
    out = replay(
        ReplayRequest(suite_dir=suite, inventory_path=fresh_sshd_host.inventory_path, out=tmp_path / "runs"),
        on_event=hook, with_analysis=False,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    m = RunDir(out.run_dir.path).read_manifest()
    assert killed.is_set()
    assert out.exit_code == 3
    assert m.hosts["box-c"].reachable is False
    assert m.hosts["box-c"].error and "box-c: HostUnreachable" in m.hosts["box-c"].error
    assert m.hosts["local"].error is None and m.hosts["local"].workspace_removed is True
    rows = read_jsonl(out.run_dir.results_path)
    local_rows = [r for r in rows if r["env"] == "local"]
    assert len(local_rows) == 3 and all(r["verdict"] == "pass" for r in local_rows)
    assert [r["verdict"] for r in rows if r["env"] == "box-c"] == ["error"] * 3
    assert elapsed < 60, f"took {elapsed:.0f}s"  # bounded by the connect/keepalive timeouts, not the run's
    assert _left_of_run(fresh_sshd_host.inventory_path, m.run_id, skip={"box-c"}) == {"local": ""}


def test_ctrl_c_and_failure_leave_nothing_behind(sshd_hosts: Any, tmp_path: Path) -> None:
    suite = _slow_suite(tmp_path, tasks=4, sleep_s=3)
    box_b_running = threading.Event()
    during: list[str] = []

    def hook(host: str, stage: str, detail: str) -> None:
        if host == "box-b" and stage == "run":
            box_b_running.set()
        if host == "box-a" and stage == "run":
            assert box_b_running.wait(20)
            time.sleep(1.0)  # box-b's runner is now well under way
            during.extend(_runs_on(sshd_hosts.inventory_path, "box-b"))
            raise KeyboardInterrupt

    started = time.monotonic()
    out = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs",
                               jobs=3), on_event=hook, with_analysis=False)  # fmt: skip
    m = RunDir(out.run_dir.path).read_manifest()
    assert out.exit_code == 130 and m.interrupted
    assert time.monotonic() - started < 30  # runners were killed, not waited out (4 x 3 s each)
    for name in ("local", "box-a", "box-b"):
        assert m.hosts[name].workspace_removed is not False, (name, m.hosts[name])
    # the place _left_of_run looks at is where the run really lived: it was there mid-run
    assert f"{m.run_id}-box-b" in during
    assert _left_of_run(sshd_hosts.inventory_path, m.run_id) == {"local": "", "box-a": "", "box-b": ""}

    # A failing runner (an interpreter that exits 1) is exit 3, and its workspace goes too.
    text = sshd_hosts.inventory_path.read_text()
    broken = tmp_path / "broken.toml"
    broken.write_text(text.replace('name = "box-b"', 'name = "box-b"\npython = "/bin/false"'))
    out = replay(ReplayRequest(suite_dir=suite, inventory_path=broken, out=tmp_path / "runs", hosts=["box-b"]),
                 with_analysis=False)  # fmt: skip
    rec = out.manifest.hosts["box-b"]
    assert out.exit_code == 3 and rec.reachable and rec.error and "RunnerCrashed" in rec.error
    assert rec.workspace_removed is True
    assert _left_of_run(broken, out.manifest.run_id) == {"local": "", "box-a": "", "box-b": ""}


def test_hosts_probe_reports_each_host_and_cleans_up(sshd_hosts: Any) -> None:
    from orchestrator.commands.probe import probe

    results = {r.name: r for r in probe(sshd_hosts.inventory_path)}
    assert list(results) == ["local", "box-a", "box-b"]
    for name in ("box-a", "box-b"):
        r = results[name]
        assert r.reachable and r.error is None and r.cleaned is True
        assert r.hostname == name and r.python and r.python.startswith("CPython 3.")
        assert r.fingerprint and len(r.fingerprint) == 16
    assert results["box-a"].fingerprint != results["box-b"].fingerprint
    left = _left_of_run(sshd_hosts.inventory_path, "no-such-run")
    assert left == {"local": "", "box-a": "", "box-b": ""}  # no probe-* directory left anywhere


def test_hosts_probe_digest_is_stable_and_is_the_one_a_replay_records(sshd_hosts: Any, tmp_path: Path) -> None:
    from orchestrator.commands.probe import probe

    first = {r.name: r.fingerprint for r in probe(sshd_hosts.inventory_path)}
    second = {r.name: r.fingerprint for r in probe(sshd_hosts.inventory_path)}
    assert all(first.values()) and first == second
    probed = {r.name: r.fingerprint for r in probe(sshd_hosts.inventory_path, suite=TRIAGE)}
    out = replay(
        ReplayRequest(suite_dir=TRIAGE, inventory_path=sshd_hosts.inventory_path, hosts=["box-a"],
                      out=tmp_path / "runs", tasks=["locale-probe"], repeat=1),
        with_analysis=False,
    )  # fmt: skip
    rec = out.manifest.hosts["box-a"]
    assert rec.error is None, rec
    assert rec.fingerprint == probed["box-a"] != probed["box-b"]
    assert _left_of_run(sshd_hosts.inventory_path, out.manifest.run_id) == {"local": "", "box-a": "", "box-b": ""}


def test_sshd_starting_late_succeeds_and_the_manifest_records_the_retries(
    fresh_sshd_host: Any, tmp_path: Path
) -> None:
    suite = _slow_suite(tmp_path, tasks=1, sleep_s=0)
    fleet = fresh_sshd_host.fleet
    fleet.kill("box-c")
    fleet.start("box-c", delay_s=2, wait=False)
    out = replay(
        ReplayRequest(suite_dir=suite, inventory_path=fresh_sshd_host.inventory_path, out=tmp_path / "runs"),
        with_analysis=False,
    )
    m = RunDir(out.run_dir.path).read_manifest()
    assert m.hosts["box-c"].error is None and m.hosts["box-c"].reachable, m.hosts["box-c"]
    retries = [r for r in m.retries if r["host"] == "box-c"]
    assert retries and all("HostUnreachable" in r["error"] for r in retries)
    assert [r["attempt"] for r in retries] == list(range(1, len(retries) + 1))
    assert [r["verdict"] for r in read_jsonl(out.run_dir.results_path) if r["env"] == "box-c"] == ["pass"]
