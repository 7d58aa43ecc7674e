"""The controller verifies that a run's workspace is gone; it never takes `rm -rf` on trust."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.commands.replay import replay
from orchestrator.hosts import remote
from orchestrator.hosts.transport.base import ExecResult, Host
from orchestrator.hosts.transport.local import LocalHost
from orchestrator.store.rundir import RunDir
from tests.orchestrator.test_replay import _left, _local_opener, _req, _setup


class RmThatLeavesFiles(LocalHost):
    """A host whose `rm -rf` of the workspace removes nothing (a busy mount, a file re-created by a
    stray process), in the run's own exec and in one of its own: every other command runs for real."""

    def exec(self, argv: list[str], timeout: float) -> ExecResult:
        if argv[:2] == ["sh", "-c"] and "! test -e" in argv[2]:
            argv = ["sh", "-c", re.sub(r"rm -rf (\S+); ! test -e", r": \1; ! test -e", argv[2])]
        return super().exec(argv, timeout)


def _removal_exec(argv: list[str]) -> bool:
    """The workspace's removal in an exec of its own (not the run's, which removes it too when its
    archive went out in its output)."""
    return argv[:2] == ["sh", "-c"] and "is still there after rm -rf" in argv[2] and remote.OUT_TAR_MARKER not in argv[2]


def _box_b_as(host: Callable[[str], Host]) -> Callable[..., Host]:
    """An opener that gives box-b ``host`` and every other host a plain ``LocalHost``."""

    def opener(cfg: Any, *, accept_new: bool = False, on_retry: Callable[[dict[str, Any]], None]) -> Host:
        return host(cfg.name) if cfg.name == "box-b" else LocalHost(cfg.name)

    return opener


def test_a_workspace_still_there_after_the_run_is_that_hosts_error(tmp_path: Path) -> None:
    inv, bundle = _setup(tmp_path, ["local", "box-b"])

    opener = _box_b_as(RmThatLeavesFiles)

    out = replay(_req(tmp_path, inv), opener=opener, bundle=bundle, with_analysis=False)
    rec = out.manifest.hosts["box-b"]
    assert _left(tmp_path, "box-b") != []  # the leftover is real
    assert rec.workspace_removed is False
    assert rec.error and "WorkspaceLeft" in rec.error and "still there" in rec.error
    assert out.exit_code == 3
    ok = out.manifest.hosts["local"]
    assert ok.workspace_removed is True and ok.error is None and _left(tmp_path, "local") == []


class PullFailsAndRmLeavesFiles(RmThatLeavesFiles):
    """A host that already failed (its archive cannot be fetched) and whose cleanup then fails too."""

    def get(self, remote: str, local: Path, **_: Any) -> None:
        from orchestrator.errors import TransferError

        raise TransferError(self.name, f"{remote}: connection lost")


def test_a_failed_cleanup_is_said_even_when_the_host_had_already_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.hosts import remote

    monkeypatch.setattr(remote, "INLINE_MAX_BYTES", 0)  # the archive is fetched, and that fails
    inv, bundle = _setup(tmp_path, ["local", "box-b"])

    opener = _box_b_as(PullFailsAndRmLeavesFiles)

    out = replay(_req(tmp_path, inv), opener=opener, bundle=bundle, with_analysis=False)
    rec = out.manifest.hosts["box-b"]
    assert _left(tmp_path, "box-b") != []
    assert rec.workspace_removed is False
    assert rec.error and "TransferError" in rec.error  # the first failure stays the headline
    assert "cleanup: " in rec.error and "WorkspaceLeft" in rec.error and "still there" in rec.error
    assert out.exit_code == 3


class RemovalWaitsForTheReport(LocalHost):
    """A host whose workspace removal starts only once the run's report.json exists (or 10 s went):
    it tells whether the replay analysed the run while the removal was still to be answered."""

    saw_report: list[bool] = []

    def exec(self, argv: list[str], timeout: float) -> ExecResult:
        if _removal_exec(argv):
            runs = Path(self.root_hint)
            deadline = time.monotonic() + 10
            while not list(runs.glob("*/report.json")) and time.monotonic() < deadline:
                time.sleep(0.01)
            self.saw_report.append(bool(list(runs.glob("*/report.json"))))
        return super().exec(argv, timeout)


def test_the_workspaces_go_while_the_run_is_analysed_and_the_manifest_says_they_went(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "INLINE_MAX_BYTES", 0)  # fetched archives: the removal is an exec of its own
    inv, bundle = _setup(tmp_path, ["local", "box-b"])
    RemovalWaitsForTheReport.saw_report = []

    def opener(cfg: Any, *, accept_new: bool = False, on_retry: Callable[[dict[str, Any]], None]) -> Host:
        host = RemovalWaitsForTheReport(cfg.name)
        host.root_hint = str(tmp_path / "runs")  # type: ignore[attr-defined]
        return host

    events: list[tuple[str, str]] = []
    out = replay(_req(tmp_path, inv), opener=opener, bundle=bundle, on_event=lambda h, s, d: events.append((h, s)))
    assert RemovalWaitsForTheReport.saw_report == [True, True]  # neither host's removal held the analysis up
    on_disk = RunDir(out.run_dir.path).read_manifest()
    for host in ("local", "box-b"):
        rec = on_disk.hosts[host]
        assert rec.workspace_removed is True and rec.error is None and "clean" in rec.stages
        assert _left(tmp_path, host) == []
        assert events.count((host, "done")) == 1
    assert out.exit_code in (0, 1) and not out.errors


def test_a_removal_that_fails_after_the_analysis_fails_its_host_in_the_manifest_and_the_report(
    tmp_path: Path,
) -> None:
    inv, bundle = _setup(tmp_path, ["local", "box-b"])

    opener = _box_b_as(RmThatLeavesFiles)

    out = replay(_req(tmp_path, inv), opener=opener, bundle=bundle)
    assert _left(tmp_path, "box-b") != []
    for manifest in (out.manifest, RunDir(out.run_dir.path).read_manifest()):
        rec = manifest.hosts["box-b"]
        assert rec.workspace_removed is False and rec.error and "WorkspaceLeft" in rec.error
        assert manifest.hosts["local"].workspace_removed is True and manifest.hosts["local"].error is None
    report = json.loads((out.run_dir.path / "report.json").read_text())
    said = {h["name"]: h.get("error") for h in report["hosts"]}
    assert said["box-b"] and "WorkspaceLeft" in said["box-b"] and said["local"] is None
    assert out.report is not None and out.exit_code == 3 and "box-b" in out.errors


class RemovalInterruptedByCtrlC(LocalHost):
    """A host whose workspace removal, once the replay waits for its answer (``waiting`` set), presses
    Ctrl-C (SIGINT to the replay's process) before it goes on."""

    waiting = threading.Event()

    def exec(self, argv: list[str], timeout: float) -> ExecResult:
        if _removal_exec(argv):
            assert self.waiting.wait(10)
            time.sleep(0.2)  # the replay is in its wait for this answer by now
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
        return super().exec(argv, timeout)


def test_ctrl_c_while_the_workspaces_go_after_the_analysis_waits_for_them(tmp_path: Path, monkeypatch: Any) -> None:
    import orchestrator.commands.replay as replay_module

    monkeypatch.setattr(remote, "INLINE_MAX_BYTES", 0)  # a fetched archive: the removal is an exec of its own
    inv, bundle = _setup(tmp_path, ["local"])
    RemovalInterruptedByCtrlC.waiting = threading.Event()
    finish = replay_module._finish_removals

    def finish_after_saying(*args: Any) -> Any:
        RemovalInterruptedByCtrlC.waiting.set()
        return finish(*args)

    monkeypatch.setattr(replay_module, "_finish_removals", finish_after_saying)

    def opener(cfg: Any, *, accept_new: bool = False, on_retry: Callable[[dict[str, Any]], None]) -> Host:
        return RemovalInterruptedByCtrlC(cfg.name)

    events: list[tuple[str, str, str]] = []
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, as in a terminal
    try:
        out = replay(_req(tmp_path, inv), opener=opener, bundle=bundle,
                     on_event=lambda h, s, d: events.append((h, s, d)))
    finally:
        signal.signal(signal.SIGINT, before)
    assert ("*", "waiting", "cleaning remote workspaces; please wait") in events
    assert ("local", "done") in [(h, s) for h, s, _ in events]
    assert out.report is not None and not out.manifest.interrupted  # the analysis was done before the press
    rec = RunDir(out.run_dir.path).read_manifest().hosts["local"]
    assert rec.workspace_removed is True and rec.error is None and _left(tmp_path, "local") == []


def test_a_removal_is_recorded_even_when_the_analysis_crashes(tmp_path: Path, monkeypatch: Any) -> None:
    # The removal overlaps the analysis: an analysis that raises must not take the removal's answer
    # with it (a workspace left on the host, and the manifest saying nothing of it).
    import orchestrator.report as report

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("a bug in the analysis")

    monkeypatch.setattr(report, "analyse_and_write", broken)
    inv, bundle = _setup(tmp_path, ["local", "box-b"])

    opener = _box_b_as(RmThatLeavesFiles)

    with pytest.raises(RuntimeError, match="a bug in the analysis"):
        replay(_req(tmp_path, inv), opener=opener, bundle=bundle)
    assert _left(tmp_path, "box-b") != [] and _left(tmp_path, "local") == []
    manifest = RunDir(next((tmp_path / "runs").iterdir())).read_manifest()
    assert manifest.hosts["box-b"].workspace_removed is False
    assert manifest.hosts["box-b"].error and "WorkspaceLeft" in manifest.hosts["box-b"].error
    assert manifest.hosts["local"].workspace_removed is True and manifest.hosts["local"].error is None


def test_a_host_the_merge_fails_is_never_said_done_after(tmp_path: Path) -> None:
    from orchestrator.progress import ProgressView

    inv, bundle = _setup(tmp_path, ["local", "box-b"], {"box-b": "badresults"})
    view = ProgressView(["local", "box-b"])
    said: list[tuple[str, str]] = []

    def sink(host: str, stage: str, detail: str) -> None:
        said.append((host, stage))
        view(host, stage, detail)

    out = replay(_req(tmp_path, inv), opener=_local_opener(), bundle=bundle, on_event=sink)
    assert out.exit_code == 3 and "box-b" in out.errors
    assert [s for h, s in said if h == "box-b" and s in ("done", "failed")][-1] == "failed"
    assert view.state["box-b"][0] == "failed" and view.state["local"][0] == "done"
    assert _left(tmp_path, "box-b") == []  # its workspace went all the same
