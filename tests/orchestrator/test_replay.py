"""replay end to end on LocalHost "hosts" with a stand-in runner: the run directory, failures that
stay one host's, retries in the manifest, Ctrl-C, the clean environment, and no workspace left."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent_runner.recordclass import replace
from agent_runner.suite import suite_from_dict
from orchestrator.commands.replay import ReplayRequest, replay
from orchestrator.errors import HostUnreachable
from orchestrator.hosts.bundle import Bundle, build_bundle
from orchestrator.hosts.transport.base import ExecResult, Host
from orchestrator.hosts.transport.local import LocalHost, login_path
from orchestrator.store.jsonl import read_jsonl
from orchestrator.store.rundir import RunDir

FAKE_RUNNER = Path(__file__).resolve().parents[1] / "support" / "fake_runner.py"
NORMALISED = {
    "name": "mini",
    "repeat": 2,
    "agent": {"kind": "none"},
    "contract": {"contract_id": "c.v1", "tools": []},
    "tasks": [{"id": "t1", "prompt": "p"}, {"id": "t2", "prompt": "p"}],
    "gate": {"flip_rate": 0.1},
}


def _setup(tmp_path: Path, hosts: list[str], behaviour: dict[str, str] | None = None) -> tuple[Path, Bundle]:
    suite = tmp_path / "mini"
    suite.mkdir()
    (suite / "suite.toml").write_text('name = "mini"\n')
    (suite / "contract.json").write_text('{"contract_id": "c.v1", "tools": []}\n')
    (suite / "behaviour.json").write_text(json.dumps(behaviour or {}))
    # A real interpreter, not a pyenv shim (a shim adds its own PYENV_* variables).
    lines = [f'[defaults]\nenv_allowlist = ["PATH", "TZ", "LANG"]\ntimeout_s = 5\npython = "{sys.executable}"\n']
    for name in hosts:
        lines.append(
            f'[[hosts]]\nname = "{name}"\ntransport = "local"\nworkspace_root = "{tmp_path}/roots/{name}"\n'
        )
    lines.append('[hosts.env]\nTZ = "Pinned/Zone"\n')  # the last host pins TZ
    inv = tmp_path / "hosts.toml"
    inv.write_text("\n".join(lines))
    bundle = build_bundle(suite, tmp_path / "cache", runner=FAKE_RUNNER, suite=suite_from_dict(NORMALISED, suite))
    return inv, bundle


def _local_opener(down: dict[str, int] | None = None) -> Callable[..., Host]:
    """LocalHost per inventory entry; hosts in ``down`` report that many retries, then fail."""

    def opener(cfg: Any, *, accept_new: bool = False, on_retry: Callable[[dict[str, Any]], None]) -> Host:
        if down and cfg.name in down:
            for attempt in range(1, down[cfg.name] + 1):
                on_retry({"attempt": attempt, "error": "connection refused", "wait_s": 0.0})
            raise HostUnreachable(cfg.name, "127.0.0.1:1: connection refused (gave up)")
        return LocalHost(cfg.name)

    return opener


def _left(tmp_path: Path, host: str) -> list[str]:
    """Everything of a run left under a host's workspace_root (the bundle cache is kept on purpose)."""
    runs = tmp_path / "roots" / host / "runs"
    return [p.name for p in runs.iterdir()] if runs.exists() else []


def _req(tmp_path: Path, inv: Path, **kw: Any) -> ReplayRequest:
    return ReplayRequest(suite_dir=tmp_path / "mini", inventory_path=inv, out=tmp_path / "runs", **kw)


def test_replay_writes_a_complete_run_directory(tmp_path: Path) -> None:
    inv, bundle = _setup(tmp_path, ["local", "box-b"])
    out = replay(_req(tmp_path, inv), opener=_local_opener(), bundle=bundle, with_analysis=False)
    rd = out.run_dir.path
    m = RunDir(rd).read_manifest()
    assert m.kind == "replay" and m.finished and not m.interrupted
    assert m.suite.name == "mini" and m.suite.sha == bundle.suite_sha and m.reference == "local"
    assert m.gate == 0.1 and m.tasks == ["t1", "t2"] and m.repeat == 2
    assert [h["name"] for h in m.inventory["hosts"]] == ["local", "box-b"]
    assert json.loads((rd / "contract.json").read_text()) == {"contract_id": "c.v1", "tools": []}
    fps = set()
    for host in ("local", "box-b"):
        rec = m.hosts[host]
        assert rec.reachable and rec.error is None and rec.workspace_removed is True and rec.bundle_pushed
        fp = json.loads((rd / "hosts" / host / "fingerprint.json").read_text())
        assert rec.fingerprint == fp["fingerprint"]
        fps.add(rec.fingerprint)
        traces = sorted(p.name for p in (rd / "hosts" / host / "traces").iterdir())
        assert traces == ["t1.0.jsonl", "t1.1.jsonl", "t2.0.jsonl", "t2.1.jsonl"]
        assert _left(tmp_path, host) == []
        assert (tmp_path / "roots" / host / "bundles" / bundle.sha / "runner.pyz").is_file()
    assert len(fps) == 2
    rows = read_jsonl(rd / "results.jsonl")
    assert len(rows) == 8 and {r["env"] for r in rows} == {"local", "box-b"}
    assert m.pins == {"t1": {"prompt_sha": "pt1"}, "t2": {"prompt_sha": "pt2"}}
    assert out.exit_code == 0  # two different fingerprints, no host error (no analysis here)
    # The second replay finds the bundle on each host and pushes nothing.
    again = replay(_req(tmp_path, inv, tasks=["t2"], repeat=1), opener=_local_opener(), bundle=bundle,
                   with_analysis=False)  # fmt: skip
    assert all(r.bundle_pushed is False for r in again.manifest.hosts.values())
    assert again.run_dir.path != rd
    assert len(read_jsonl(again.run_dir.results_path)) == 2


def test_unreachable_host_is_a_result_with_its_retries(tmp_path: Path) -> None:
    inv, bundle = _setup(tmp_path, ["local", "box-b", "box-c"])
    out = replay(_req(tmp_path, inv), opener=_local_opener({"box-b": 2}), bundle=bundle, with_analysis=False)
    m = out.manifest
    assert out.exit_code == 3
    assert m.hosts["box-b"].reachable is False
    assert m.hosts["box-b"].error == "box-b: HostUnreachable: 127.0.0.1:1: connection refused (gave up)"
    assert [(r["host"], r["attempt"]) for r in m.retries] == [("box-b", 1), ("box-b", 2)]
    for ok in ("local", "box-c"):
        assert m.hosts[ok].error is None and m.hosts[ok].workspace_removed
    rows = read_jsonl(out.run_dir.results_path)
    b_rows = [r for r in rows if r["env"] == "box-b"]
    assert len(b_rows) == 4 and all(r["verdict"] == "error" for r in b_rows)
    assert "HostUnreachable" in b_rows[0]["reason"]
    assert sum(1 for r in rows if r["verdict"] == "pass") == 8
    assert RunDir(out.run_dir.path).read_manifest() == m


def test_runner_crash_is_exit_3_and_the_workspace_still_goes(tmp_path: Path) -> None:
    inv, bundle = _setup(tmp_path, ["local", "box-b"], {"box-b": "crash"})
    out = replay(_req(tmp_path, inv), opener=_local_opener(), bundle=bundle, with_analysis=False)
    rec = out.manifest.hosts["box-b"]
    assert out.exit_code == 3
    assert rec.reachable and rec.runner_exit == 3
    assert rec.error and "RunnerCrashed" in rec.error and "boom" in rec.error
    assert rec.workspace_removed and _left(tmp_path, "box-b") == []
    # What it wrote before crashing was pulled: its first trace is there.
    assert (out.run_dir.path / "hosts" / "box-b" / "traces" / "t1.0.jsonl").is_file()


def test_unsafe_archive_from_a_host_is_refused(tmp_path: Path) -> None:
    inv, bundle = _setup(tmp_path, ["local", "box-b"], {"box-b": "symlink"})
    out = replay(_req(tmp_path, inv), opener=_local_opener(), bundle=bundle, with_analysis=False)
    rec = out.manifest.hosts["box-b"]
    assert out.exit_code == 3 and rec.error and "ArchiveRejected" in rec.error
    assert not (out.run_dir.path / "hosts" / "box-b" / "traces").exists()
    assert _left(tmp_path, "box-b") == []


def test_only_allowlisted_env_reaches_the_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CROSSHOST_TEST_TOKEN", "s3cr3t-token-value")
    monkeypatch.setenv("TZ", "Controller/Zone")
    inv, bundle = _setup(tmp_path, ["local", "box-b"])
    out = replay(_req(tmp_path, inv), opener=_local_opener(), bundle=bundle, with_analysis=False)
    for host in ("local", "box-b"):
        header = json.loads((out.run_dir.path / "hosts" / host / "traces" / "t1.0.jsonl").read_text().splitlines()[0])
        assert set(header["env"]) <= {"PATH", "TZ", "LANG"}
        # the host's own value: a local host's is the login PATH, not this process's
        assert header["env"]["PATH"] == login_path()
    assert json.loads((out.run_dir.path / "hosts/box-b/traces/t1.0.jsonl").read_text().splitlines()[0])["env"]["TZ"] == "Pinned/Zone"
    for path in out.run_dir.path.rglob("*"):
        if path.is_file():
            assert b"s3cr3t-token-value" not in path.read_bytes(), path


def test_ctrl_c_from_a_hook_cleans_every_host_and_exits_130(tmp_path: Path) -> None:
    inv, bundle = _setup(tmp_path, ["local", "box-b"], {"local": "sleep", "box-b": "sleep"})
    local_running = threading.Event()

    def hook(host: str, stage: str, detail: str) -> None:
        if host == "local" and stage == "run":
            local_running.set()
        # box-b presses Ctrl-C once local's runner is under way.
        if host == "box-b" and stage == "run":
            assert local_running.wait(10)
            raise KeyboardInterrupt

    out = replay(_req(tmp_path, inv, jobs=2), opener=_local_opener(), bundle=bundle, on_event=hook, with_analysis=False)
    m = RunDir(out.run_dir.path).read_manifest()
    assert out.exit_code == 130 and m.interrupted and m.finished
    for host in ("local", "box-b"):
        assert m.hosts[host].workspace_removed is True, host
        assert _left(tmp_path, host) == []
    # local's runner was killed (not waited out: it sleeps 30 s per attempt).
    assert m.hosts["local"].stages["run"] < 20
    assert m.hosts["local"].error == "interrupted"
    # Partial results: the trace local wrote before it was stopped came home.
    assert (out.run_dir.path / "hosts" / "local" / "traces" / "t1.0.jsonl").is_file()
    rows = read_jsonl(out.run_dir.results_path)
    assert len(rows) == 8 and all(r["verdict"] == "error" and r["reason"] == "interrupted" for r in rows)


def test_bad_suite_is_exit_2_naming_the_file_and_no_run_dir(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli import app

    inv, _ = _setup(tmp_path, ["local"])
    (tmp_path / "mini" / "suite.toml").write_text('name = "mini"\nrepaet = 2\n')
    res = CliRunner().invoke(app, ["replay", str(tmp_path / "mini"), "-i", str(inv), "--out", str(tmp_path / "runs")])
    assert res.exit_code == 2
    assert "suite.toml" in res.output and "repaet" in res.output
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").glob("2*"))


def test_unknown_task_and_host_are_exit_2(tmp_path: Path) -> None:
    from orchestrator.errors import InputError

    inv, bundle = _setup(tmp_path, ["local", "box-b"])
    with pytest.raises(InputError, match="nope"):
        replay(_req(tmp_path, inv, tasks=["nope"]), opener=_local_opener(), bundle=bundle)
    with pytest.raises(InputError, match="box-z"):
        replay(_req(tmp_path, inv, hosts=["box-z"]), opener=_local_opener(), bundle=bundle)


def test_a_bad_results_file_is_that_hosts_crash_and_the_run_is_still_written(tmp_path: Path) -> None:
    inv, bundle = _setup(tmp_path, ["local", "box-b"], {"box-b": "badresults"})
    out = replay(_req(tmp_path, inv), opener=_local_opener(), bundle=bundle, with_analysis=False)
    m = RunDir(out.run_dir.path).read_manifest()
    assert out.exit_code == 3  # the host's fault, not bad user input (2)
    assert m.finished and not m.interrupted
    err = m.hosts["box-b"].error
    assert err and err.startswith("box-b: RunnerCrashed:") and "results.jsonl:5" in err and "\n" not in err
    assert m.hosts["local"].error is None and out.errors == {"box-b": err}
    rows = read_jsonl(out.run_dir.results_path)
    assert sorted((r["env"], r["verdict"]) for r in rows) == [("box-b", "error")] * 4 + [("local", "pass")] * 4
    assert all(r["reason"] == err for r in rows if r["env"] == "box-b")


def test_an_archive_over_the_cap_is_refused_before_it_is_transferred(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.hosts import workspace
    from orchestrator.hosts.archive import ArchiveLimits, max_archive_bytes

    limits = ArchiveLimits(max_members=10, max_total_bytes=100_000)
    monkeypatch.setattr(workspace, "PULL_LIMITS", limits)
    fetched: list[str] = []

    class CountingHost(LocalHost):
        def get(self, remote: str, local: Path, **kw: Any) -> None:
            fetched.append(self.name)
            super().get(remote, local, **kw)

    def opener(cfg: Any, *, accept_new: bool = False, on_retry: Callable[[dict[str, Any]], None]) -> Host:
        return CountingHost(cfg.name)

    inv, bundle = _setup(tmp_path, ["local", "box-b"], {"box-b": "big"})  # box-b's out/ holds 1 MB
    out = replay(_req(tmp_path, inv), opener=opener, bundle=bundle, with_analysis=False)
    err = out.manifest.hosts["box-b"].error
    assert out.exit_code == 3 and err and err.startswith("box-b: ArchiveRejected:")
    assert "out.tar" in err and str(max_archive_bytes(limits)) in err and "not transferred" in err
    assert fetched == []  # local's archive came in its run's output; box-b's never left the host
    assert not (out.run_dir.path / "hosts" / "box-b" / "traces").exists()
    assert out.manifest.hosts["local"].error is None and _left(tmp_path, "box-b") == []


def test_a_token_on_a_runners_stderr_is_redacted_in_the_manifest_and_on_the_terminal(tmp_path: Path) -> None:
    from io import StringIO

    from rich.console import Console

    from orchestrator import ui
    from orchestrator.commands.replay import replay_command
    from orchestrator.progress import ProgressView

    token = "ghp_" + "A1b2" * 9
    inv, bundle = _setup(tmp_path, ["local", "box-b"], {"box-b": "leak"})
    out = replay(_req(tmp_path, inv), opener=_local_opener(), bundle=bundle, with_analysis=False)
    err = out.manifest.hosts["box-b"].error
    assert out.exit_code == 3 and err and "RunnerCrashed" in err and "auth failed for token" in err
    assert token not in err and "[REDACTED]" in err
    assert token not in out.run_dir.manifest_path.read_text()
    assert token not in out.run_dir.results_path.read_text()

    # the terminal: progress and error lines on stderr, the summary table on stdout
    terminal, stdout = StringIO(), StringIO()
    req = _req(tmp_path, inv)
    err_console = Console(file=terminal, width=400)
    with ProgressView(["local", "box-b"], err_console) as view:
        outcome = replay_command(req, opener=_local_opener(), bundle=bundle, on_event=view, lint=False)
    code = ui.render_replay(outcome, err=err_console, out=Console(file=stdout, width=400))
    assert code == 3
    assert "auth failed for token" in terminal.getvalue()
    assert token not in terminal.getvalue() and token not in stdout.getvalue()


def test_error_verdicts_from_a_runner_that_exited_0_are_exit_3_and_the_summary_says_why(tmp_path: Path) -> None:
    from io import StringIO

    from rich.console import Console

    from orchestrator import ui
    from orchestrator.commands.replay import replay_command

    inv, bundle = _setup(tmp_path, ["local", "box-b"], {"local": "provider_down", "box-b": "provider_down"})
    out = replay(_req(tmp_path, inv), opener=_local_opener(), bundle=bundle, with_analysis=False)
    assert all(rec.error is None and rec.runner_exit == 0 for rec in out.manifest.hosts.values())
    assert out.exit_code == 3  # error is "the harness or the host failed": never a valid exit 0
    assert out.exit_reason.startswith("4 error verdict(s) on local: ") and "box-b" in out.exit_reason
    assert "agent_error" in out.exit_reason

    stdout = StringIO()
    outcome = replay_command(_req(tmp_path, inv), opener=_local_opener(), bundle=bundle, lint=False)
    code = ui.render_replay(outcome, err=Console(file=StringIO()), out=Console(file=stdout, width=400))
    assert code == 3
    assert "(exit 3: 4 error verdict(s) on local: " in stdout.getvalue()


def test_exit_code_precedence() -> None:
    from types import SimpleNamespace

    from orchestrator.exit_policy import replay_exit as exit_code
    from orchestrator.store.records import HostRecord, Manifest, SuiteRef
    from orchestrator.store.rundir import ResultRow

    def manifest(**hosts: HostRecord) -> Manifest:
        return Manifest(run_id="r", started="t", suite=SuiteRef(name="s", sha="x", path="p"), reference="a",
                        crosshost_version="0", hosts=hosts)  # fmt: skip

    ok = {"a": HostRecord(reachable=True, fingerprint="1" * 16), "b": HostRecord(reachable=True, fingerprint="2" * 16)}
    row = ResultRow(env="b", task="t", attempt=0, verdict="error", reason="agent_error")
    invalid = SimpleNamespace(valid=False, invalid_reasons=["fewer than two hosts replayed (a)"], flip_rate=0.5, gate=0.1)
    over = SimpleNamespace(valid=True, invalid_reasons=[], flip_rate=0.5, gate=0.1)
    good = SimpleNamespace(valid=True, invalid_reasons=[], flip_rate=0.0, gate=0.1)
    assert exit_code(manifest(**ok), good, None, [])[0] == 0
    assert exit_code(manifest(**ok), over, None, []) == (1, "flip rate 0.5 over the gate 0.1")
    assert exit_code(manifest(**ok), invalid, None, [])[0] == 1
    # invalid is exit 1 on its own, with a flip rate well within the gate
    invalid_within = SimpleNamespace(valid=False, invalid_reasons=["pins differ: prompt_sha on b"], flip_rate=0.0,
                                     gate=0.1)  # fmt: skip
    assert exit_code(manifest(**ok), invalid_within, None, []) == (1, "invalid run: pins differ: prompt_sha on b")
    assert exit_code(manifest(**ok), invalid, None, [row]) == (3, "1 error verdict(s) on b: agent_error")
    assert exit_code(manifest(**ok), good, None, [row])[0] == 3
    crashed = {**ok, "b": HostRecord(reachable=True, error="b: RunnerCrashed: boom")}
    code, why = exit_code(manifest(**crashed), good, None, [])
    assert code == 3 and "b: RunnerCrashed: boom" in why
    crash_row = replace(row, reason="b: RunnerCrashed: boom")
    assert exit_code(manifest(**crashed), good, None, [crash_row]) == (3, "1 error verdict(s) on b: RunnerCrashed: boom")
    interrupted = manifest(**crashed)
    interrupted.interrupted = True
    assert exit_code(interrupted, good, None, [row])[0] == 130


class _CountingHost(LocalHost):
    """LocalHost that logs each exec's first words (the round trips a host costs)."""

    log: list[tuple[str, str]] = []

    def exec(self, argv: list[str], timeout: float) -> Any:
        self.log.append((self.name, " ".join(argv)[:60]))
        return super().exec(argv, timeout)


def _counting_opener(log: list[tuple[str, str]]) -> Callable[..., Host]:
    def opener(cfg: Any, *, accept_new: bool = False, on_retry: Callable[[dict[str, Any]], None]) -> Host:
        host = _CountingHost(cfg.name)
        host.log = log
        return host

    return opener


def test_a_host_costs_one_exec_when_its_bundle_is_cached(tmp_path: Path) -> None:
    """run (the workspace made, the bundle checked by the runner's own start, the runner, the tar of
    out/ sent in its output, then the workspace removed): the fingerprint is the one the runner writes
    before its first task. A host with pinned values (box-b) has its workspace made first (the bundle
    looked for in that exec), the pins put into it, then the run: two."""
    inv, bundle = _setup(tmp_path, ["local", "box-b"])
    first: list[tuple[str, str]] = []
    out = replay(_req(tmp_path, inv), opener=_counting_opener(first), bundle=bundle, with_analysis=False)
    # pushing: the run that refused the bundle (local) or the look (box-b), the bundle's
    # mkdir/unpack/rm, the run (and the removal, in its exec)
    for host in ("local", "box-b"):
        assert sum(1 for h, _ in first if h == host) == 5, first
        assert out.manifest.hosts[host].bundle_pushed is True and not out.manifest.hosts[host].bundle_replaced
    assert out.exit_code == 0
    assert list(out.manifest.hosts["local"].stages) == ["connect", "run", "push", "pull", "clean"]
    cached = {host: tmp_path / "roots" / host / "bundles" / bundle.sha for host in ("local", "box-b")}
    for path in cached.values():  # last used long ago: the next replay's use says it is in use now
        os.utime(path, (1_000_000, 1_000_000))
    log: list[tuple[str, str]] = []
    out = replay(_req(tmp_path, inv), opener=_counting_opener(log), bundle=bundle, with_analysis=False)
    assert out.exit_code == 0
    assert all(path.stat().st_mtime > time.time() - 600 for path in cached.values())
    for host, execs, stages in (("local", 1, ["connect", "run", "pull", "clean"]),
                                ("box-b", 2, ["connect", "push", "run", "pull", "clean"])):  # fmt: skip
        assert sum(1 for h, _ in log if h == host) == execs, log
        rec = out.manifest.hosts[host]
        assert rec.bundle_pushed is False and not rec.bundle_replaced
        fp = json.loads((out.run_dir.path / "hosts" / host / "fingerprint.json").read_text())
        assert rec.fingerprint == fp["fingerprint"] and rec.python
        assert list(rec.stages) == stages
        assert len(list((out.run_dir.path / "hosts" / host / "traces").iterdir())) == 4


def test_a_changed_bundle_is_never_run_its_runner_refuses_it_and_it_is_pushed_again(tmp_path: Path) -> None:
    """The check is the runner's own first step: a cached runner.pyz replaced on the host (what an
    attempt of the login user's uid could do after a chmod) is not run; the bundle is replaced and
    the run goes on from the bundle pushed now."""
    inv, bundle = _setup(tmp_path, ["local", "box-b"])
    replay(_req(tmp_path, inv), opener=_local_opener(), bundle=bundle, with_analysis=False)
    marker = tmp_path / "planted-runner-ran"
    for host in ("local", "box-b"):
        cached = tmp_path / "roots" / host / "bundles" / bundle.sha / "runner.pyz"
        cached.chmod(0o644)
        cached.write_text(f"open({str(marker)!r}, 'a').write('ran\\n')\n")
    out = replay(_req(tmp_path, inv), opener=_local_opener(), bundle=bundle, with_analysis=False)
    assert not marker.exists()
    assert out.exit_code == 0
    for host in ("local", "box-b"):
        rec = out.manifest.hosts[host]
        assert rec.bundle_replaced is True and rec.bundle_pushed is True and rec.error is None, rec
        cached = tmp_path / "roots" / host / "bundles" / bundle.sha / "runner.pyz"
        assert cached.read_bytes() == FAKE_RUNNER.read_bytes()
        assert len(list((out.run_dir.path / "hosts" / host / "traces").iterdir())) == 4


def test_a_runner_crashing_mid_run_still_has_its_fingerprint_recorded(tmp_path: Path) -> None:
    inv, bundle = _setup(tmp_path, ["local", "box-b"], {"box-b": "crash"})
    out = replay(_req(tmp_path, inv), opener=_local_opener(), bundle=bundle, with_analysis=False)
    rec = out.manifest.hosts["box-b"]
    assert out.exit_code == 3 and rec.error and "RunnerCrashed" in rec.error
    fp = json.loads((out.run_dir.path / "hosts" / "box-b" / "fingerprint.json").read_text())
    assert rec.fingerprint == fp["fingerprint"] and len(rec.fingerprint) == 16
    assert rec.fingerprint != out.manifest.hosts["local"].fingerprint


def test_a_runner_refusing_before_its_fingerprint_still_gets_one_taken(tmp_path: Path) -> None:
    """The runner writes fingerprint.json before its first task; one that stops earlier (bad input on
    that host) gets `runner fingerprint` in the same exec, so the host is still described."""
    inv, bundle = _setup(tmp_path, ["local", "box-b"], {"box-b": "refuse"})
    out = replay(_req(tmp_path, inv), opener=_local_opener(), bundle=bundle, with_analysis=False)
    rec = out.manifest.hosts["box-b"]
    assert out.exit_code == 3 and rec.error and "refused its input" in rec.error and rec.runner_exit == 2
    fp = json.loads((out.run_dir.path / "hosts" / "box-b" / "fingerprint.json").read_text())
    assert rec.fingerprint == fp["fingerprint"]
    assert set(fp["env_keys"]) <= {"PATH", "TZ", "LANG"}  # taken like the runner's: env -i, allowlist
    assert _left(tmp_path, "box-b") == []


def test_a_runner_killed_by_the_timeout_still_sends_what_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.hosts import host_job

    monkeypatch.setattr(host_job, "RUN_MARGIN_S", -18)  # timeout_s 5 x 4 attempts - 18: killed after 2 s
    inv, bundle = _setup(tmp_path, ["local", "box-b"], {"box-b": "sleep"})
    log: list[tuple[str, str]] = []
    out = replay(_req(tmp_path, inv, jobs=2), opener=_counting_opener(log), bundle=bundle, with_analysis=False)
    rec = out.manifest.hosts["box-b"]
    assert out.exit_code == 3 and rec.error and "runner killed after 2 s" in rec.error
    assert (out.run_dir.path / "hosts" / "box-b" / "traces" / "t1.0.jsonl").is_file()
    assert rec.fingerprint and rec.workspace_removed and _left(tmp_path, "box-b") == []
    assert rec.stages["run"] < 15


def test_a_chosen_reference_is_recorded_and_named_by_the_report(tmp_path: Path) -> None:
    inv, bundle = _setup(tmp_path, ["local", "box-b", "box-c"])
    out = replay(_req(tmp_path, inv, reference="box-b"), opener=_local_opener(), bundle=bundle)
    assert out.manifest.reference == "box-b"
    assert "- reference host: **box-b**" in (out.run_dir.path / "report.md").read_text()
    default = replay(_req(tmp_path, inv, hosts=["box-c", "box-b"]), opener=_local_opener(), bundle=bundle,
                     with_analysis=False)  # fmt: skip
    assert default.manifest.reference == "box-b"  # the first selected host in inventory order


def test_a_reference_outside_the_selection_is_exit_2_before_any_run(tmp_path: Path) -> None:
    from orchestrator.errors import InputError

    inv, bundle = _setup(tmp_path, ["local", "box-b", "box-c"])
    with pytest.raises(InputError) as info:
        replay(_req(tmp_path, inv, hosts=["local", "box-b"], reference="box-c"), opener=_local_opener(), bundle=bundle)
    assert str(info.value) == (
        f"{inv}: --reference 'box-c' is not among the selected hosts (local, box-b); add it to --hosts"
    )
    with pytest.raises(InputError, match="no host 'box-z'"):
        replay(_req(tmp_path, inv, reference="box-z"), opener=_local_opener(), bundle=bundle)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_after_seven_suites_each_host_keeps_the_five_newest_bundles_and_any_in_use(tmp_path: Path) -> None:
    inv, first = _setup(tmp_path, ["local", "box-b"])
    # a run in progress elsewhere on box-b still uses the first bundle: it must survive the pruning
    busy = tmp_path / "roots" / "box-b" / "runs" / "other-run"
    shas = []
    for i in range(7):
        bundle = first if i == 0 else build_bundle(
            tmp_path / "mini", tmp_path / "cache", runner=FAKE_RUNNER,
            suite=suite_from_dict({**NORMALISED, "name": f"mini{i}"}, tmp_path / "mini"),
        )
        shas.append(bundle.sha)
        out = replay(_req(tmp_path, inv), opener=_local_opener(), bundle=bundle, with_analysis=False)
        assert out.exit_code == 0 and all(r.workspace_removed for r in out.manifest.hosts.values())
        if i == 0:
            busy.mkdir(parents=True)
            (busy / "bundle-sha").write_text(first.sha + "\n")
        time.sleep(0.01)  # distinct mtimes: "newest" is the order of use
    assert len(set(shas)) == 7
    kept_a = sorted(p.name for p in (tmp_path / "roots" / "local" / "bundles").iterdir())
    kept_b = sorted(p.name for p in (tmp_path / "roots" / "box-b" / "bundles").iterdir())
    assert kept_a == sorted(shas[2:])
    assert kept_b == sorted([shas[0], *shas[2:]])


def test_only_a_replay_that_pushed_a_bundle_prunes_the_hosts_bundles(tmp_path: Path) -> None:
    """Bundles are added by a push only: a replay that found its bundle on the host leaves the cache
    as it is (no pruning to do), and the next push bounds it again to the five newest."""
    inv, bundle = _setup(tmp_path, ["local", "box-b"])
    bundles = tmp_path / "roots" / "local" / "bundles"
    assert replay(_req(tmp_path, inv), opener=_local_opener(), bundle=bundle, with_analysis=False).exit_code == 0
    old = []
    for i in range(6):  # older than everything a replay uses: pruned first
        stale = bundles / f"{i:064x}"
        stale.mkdir()
        os.utime(stale, (1_000_000 + i, 1_000_000 + i))
        old.append(stale.name)
    cached = replay(_req(tmp_path, inv), opener=_local_opener(), bundle=bundle, with_analysis=False)
    assert cached.exit_code == 0 and cached.manifest.hosts["local"].bundle_pushed is False
    assert sorted(p.name for p in bundles.iterdir()) == sorted([bundle.sha, *old])
    other = build_bundle(tmp_path / "mini", tmp_path / "cache", runner=FAKE_RUNNER,
                         suite=suite_from_dict({**NORMALISED, "name": "mini-new"}, tmp_path / "mini"))
    pushed = replay(_req(tmp_path, inv), opener=_local_opener(), bundle=other, with_analysis=False)
    assert pushed.exit_code == 0 and pushed.manifest.hosts["local"].bundle_pushed is True
    assert sorted(p.name for p in bundles.iterdir()) == sorted([other.sha, bundle.sha, *old[3:]])


def test_at_most_pulling_at_once_hosts_write_and_check_their_archives_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's CPU work of a pull (writing a host's archive, checking it) is done by a few
    hosts at a time, never by a whole fleet that ends together; every host's results still arrive."""
    from orchestrator.hosts import host_job, workspace

    hosts = [f"box-{c}" for c in "abcdef"]
    inv, bundle = _setup(tmp_path, hosts)
    read_archive = workspace.read_archive
    lock = threading.Lock()
    now, most = [0], [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        try:
            time.sleep(0.2)  # long enough for every host to arrive here meanwhile, were it let in
            return read_archive(*args, **kwargs)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(workspace, "read_archive", counted)
    out = replay(_req(tmp_path, inv), opener=_local_opener(), bundle=bundle, with_analysis=False)
    assert most[0] == host_job.PULLING_AT_ONCE == 2
    assert out.exit_code == 0 and all(rec.error is None for rec in out.manifest.hosts.values())
    assert sorted(r["env"] for r in read_jsonl(out.run_dir.path / "results.jsonl")) == sorted(hosts * 4)


class _ForgesItsInlineArchive(LocalHost):
    """A host whose run sends home, in its output, an archive whose results rows say fail where the
    runner wrote pass: the same size, a consistent tar, its base64 and size line made to match."""

    def exec(self, argv: list[str], timeout: float) -> ExecResult:
        import base64
        import io
        import tarfile

        from orchestrator.hosts import remote

        done = super().exec(argv, timeout)
        stdout, out_tar = remote.split_out_tar(done.stdout)
        if out_tar.inline is None:
            return done
        forged = io.BytesIO()
        with tarfile.open(fileobj=io.BytesIO(out_tar.inline)) as src, tarfile.open(fileobj=forged, mode="w") as dst:
            for member in src:
                data = src.extractfile(member).read() if member.isreg() else None  # type: ignore[union-attr]
                if member.name.endswith("results.jsonl") and data is not None:
                    data = data.replace(b'"pass"', b'"fail"')
                dst.addfile(member, io.BytesIO(data) if data is not None else None)
        raw = forged.getvalue()
        text = (f"{stdout}\n{remote.INLINE_MARKER}\n{base64.b64encode(raw).decode()}\n\n"
                f"{remote.OUT_TAR_MARKER} {len(raw)} inline\n")
        return dataclasses.replace(done, stdout=text)


def test_an_archive_forged_in_the_runs_own_output_is_the_hosts_error(tmp_path: Path) -> None:
    """The archive that comes in the run's output is checked against the digests the runner announced,
    as a fetched one is: a forged results row is that host's error and no forged verdict is kept."""
    inv, bundle = _setup(tmp_path, ["local", "box-b"])

    def opener(cfg: Any, *, accept_new: bool = False, on_retry: Callable[[dict[str, Any]], None]) -> Host:
        return (_ForgesItsInlineArchive if cfg.name == "box-b" else LocalHost)(cfg.name)

    out = replay(_req(tmp_path, inv), opener=opener, bundle=bundle, with_analysis=False)
    err = out.manifest.hosts["box-b"].error or ""
    assert out.exit_code == 3 and "OutputTampered" in err and "results.jsonl" in err, err
    rows = read_jsonl(out.run_dir.path / "results.jsonl")
    assert rows and not [r for r in rows if r["env"] == "box-b" and r["verdict"] == "fail"]
    assert out.manifest.hosts["local"].error is None


def test_hosts_whose_archives_travel_slowly_hold_up_no_other_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the controller's own work on an archive waits its turn, never its transfer: two hosts
    whose archives take long to fetch do not keep the others' results from being written."""
    from orchestrator.hosts import host_job, remote, workspace

    monkeypatch.setattr(remote, "INLINE_MAX_BYTES", 0)  # every archive is fetched
    hosts = ["slow-a", "slow-b", "box-c", "box-d"]
    inv, bundle = _setup(tmp_path, hosts)
    fetched_slowly = threading.Event()
    read_before: dict[str, bool] = {}
    read_archive = workspace.read_archive

    class SlowToFetch(LocalHost):
        def get(self, remote_path: str, local: Path, **kw: Any) -> None:
            time.sleep(3)  # both slow hosts are in their transfer while the others are read
            fetched_slowly.set()
            super().get(remote_path, local, **kw)

    def noting(*args: Any, host: str, **kwargs: Any) -> Any:
        read_before[host] = not fetched_slowly.is_set()
        return read_archive(*args, host=host, **kwargs)

    class EndsLater(LocalHost):
        def exec(self, argv: list[str], timeout: float) -> ExecResult:
            if remote.OUT_TAR_MARKER in " ".join(argv):  # the run: the slow hosts are in their pull by its end
                time.sleep(1)
            return super().exec(argv, timeout)

    def opener(cfg: Any, *, accept_new: bool = False, on_retry: Callable[[dict[str, Any]], None]) -> Host:
        return (SlowToFetch if cfg.name.startswith("slow") else EndsLater)(cfg.name)

    monkeypatch.setattr(workspace, "read_archive", noting)
    out = replay(_req(tmp_path, inv), opener=opener, bundle=bundle, with_analysis=False)
    assert host_job.PULLING_AT_ONCE == 2 and out.exit_code == 0
    assert read_before == {"slow-a": False, "slow-b": False, "box-c": True, "box-d": True}
