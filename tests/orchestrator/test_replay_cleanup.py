"""The controller verifies that a run's workspace is gone; it never takes `rm -rf` on trust."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.commands.replay import replay
from orchestrator.hosts.transport.base import ExecResult, Host
from orchestrator.hosts.transport.local import LocalHost
from tests.orchestrator.test_replay import _left, _req, _setup


class RmThatLeavesFiles(LocalHost):
    """A host whose `rm -rf` of the workspace removes nothing (a busy mount, a file re-created by a
    stray process): every other command runs for real."""

    def exec(self, argv: list[str], timeout: float) -> ExecResult:
        if argv[:2] == ["sh", "-c"] and "! test -e" in argv[2]:
            argv = ["sh", "-c", argv[2].replace("rm -rf ", ": ", 1)]
        return super().exec(argv, timeout)


def test_a_workspace_still_there_after_the_run_is_that_hosts_error(tmp_path: Path) -> None:
    inv, bundle = _setup(tmp_path, ["local", "box-b"])

    def opener(cfg: Any, *, accept_new: bool = False, on_retry: Callable[[dict[str, Any]], None]) -> Host:
        return RmThatLeavesFiles(cfg.name) if cfg.name == "box-b" else LocalHost(cfg.name)

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


def test_a_failed_cleanup_is_said_even_when_the_host_had_already_failed(tmp_path: Path) -> None:
    inv, bundle = _setup(tmp_path, ["local", "box-b"])

    def opener(cfg: Any, *, accept_new: bool = False, on_retry: Callable[[dict[str, Any]], None]) -> Host:
        return PullFailsAndRmLeavesFiles(cfg.name) if cfg.name == "box-b" else LocalHost(cfg.name)

    out = replay(_req(tmp_path, inv), opener=opener, bundle=bundle, with_analysis=False)
    rec = out.manifest.hosts["box-b"]
    assert _left(tmp_path, "box-b") != []
    assert rec.workspace_removed is False
    assert rec.error and "TransferError" in rec.error  # the first failure stays the headline
    assert "cleanup: " in rec.error and "WorkspaceLeft" in rec.error and "still there" in rec.error
    assert out.exit_code == 3
