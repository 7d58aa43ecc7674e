"""The remote workspace lifecycle on a real LocalHost: create, put, pull (size checked), remove."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from orchestrator.errors import ArchiveRejected, RunnerCrashed, TransferError, WorkspaceLeft
from orchestrator.hosts import workspace
from orchestrator.hosts.archive import ArchiveLimits
from orchestrator.hosts.fanout import Interrupted
from orchestrator.hosts.transport.local import LocalHost
from orchestrator.hosts.workspace import Running, Workspace


def _ws(tmp_path: Path, run_id: str = "r1") -> Workspace:
    return Workspace(LocalHost("box"), "box", str(tmp_path / "root"), run_id)


def test_create_makes_a_private_workspace_once_and_remove_leaves_nothing(tmp_path: Path) -> None:
    ws = _ws(tmp_path)
    assert ws.create() is False and ws.created
    path = Path(ws.path)
    # others (the attempts' uid) may pass through to work/, never list it or enter out/
    assert stat.S_IMODE(path.stat().st_mode) == 0o711 and stat.S_IMODE((path / "out").stat().st_mode) == 0o700
    assert stat.S_IMODE((path / "work").stat().st_mode) == 0o711
    # in/ (the pinned values) is the login user's alone; the owner token is readable by it alone
    assert stat.S_IMODE((path / "in").stat().st_mode) == 0o700
    assert (path / "owner").read_text().strip() == ws.token and stat.S_IMODE((path / "owner").stat().st_mode) == 0o600
    pins = ws.put_pins({"TZ": "UTC"})
    assert pins == str(path / "in" / "pins.env") and Path(pins).read_text() == "TZ=UTC\n"
    assert ws.put_pins({}) is None
    with pytest.raises(RunnerCrashed, match="cannot create"):
        _ws(tmp_path).create()  # an existing workspace is never reused
    with pytest.raises(TransferError, match="cannot create"):
        _ws(tmp_path).create(failure=TransferError)
    assert ws.put(Path(__file__), "x.py") == str(path / "x.py") and (path / "x.py").is_file()
    assert ws.remove() is True
    assert not path.exists() and list((tmp_path / "root" / "runs").iterdir()) == []


def test_pull_brings_out_home_and_refuses_an_archive_over_the_cap_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = _ws(tmp_path)
    ws.create()
    (Path(ws.path) / "out" / "results.jsonl").write_text("{}\n")
    home = tmp_path / "home"
    assert ws.pull(home, scratch=tmp_path) == 1 and (home / "results.jsonl").read_text() == "{}\n"
    (Path(ws.path) / "out" / "big").write_bytes(b"x" * 200_000)
    monkeypatch.setattr(workspace, "PULL_LIMITS", ArchiveLimits(max_members=10, max_total_bytes=100_000))
    with pytest.raises(ArchiveRejected, match="not transferred"):
        ws.pull(tmp_path / "home2", scratch=tmp_path)
    assert not (tmp_path / "home2").exists()


def test_a_cancelled_run_never_starts(tmp_path: Path) -> None:
    ws = _ws(tmp_path)
    ws.create()
    running = Running()
    running.stop_all()
    started = Path(ws.path) / "started"
    with pytest.raises(Interrupted):
        ws.run(f"touch {started}", 10, running)
    assert not started.exists()
    ws.run(f"touch {started}", 10, Running())
    assert started.exists()


def test_a_workspace_another_worker_made_is_left_alone_and_a_changed_token_is_reported(tmp_path: Path) -> None:
    ws = _ws(tmp_path)
    ws.create()
    other = _ws(tmp_path)  # the same path, another worker
    with pytest.raises(RunnerCrashed, match="File exists"):
        other.create()
    assert other.remove(kill_first=True) is False and Path(ws.path, "work").is_dir()
    Path(ws.path, "owner").write_text("forged\n")  # what runs in it rewrote the token
    with pytest.raises(WorkspaceLeft, match="owner token changed"):
        ws.remove()
    assert Path(ws.path).is_dir()


def test_the_runs_own_removal_leaves_another_workers_workspace_alone_and_then_nothing_is_asked(
    tmp_path: Path,
) -> None:
    """``removal_script`` as the run's exec runs it (``foreign`` = fail): a workspace whose token is not
    this worker's is left, and the exit says so; once gone, ``remove`` asks nothing of the host and a
    pull with no archive in hand refuses rather than fetch from a workspace that is not there."""
    import subprocess

    ws = _ws(tmp_path)
    ws.create()
    other = _ws(tmp_path)  # the same path, another worker's token
    assert subprocess.run(["sh", "-c", other.removal_script(foreign="exit 1")]).returncode == 1
    assert Path(ws.path, "work").is_dir()
    assert subprocess.run(["sh", "-c", f"( {ws.removal_script(foreign='exit 1')} ) >/dev/null"]).returncode == 0
    assert not Path(ws.path).exists()
    ws.gone = True

    class NoExec(LocalHost):
        def exec(self, argv: list[str], timeout: float) -> object:  # type: ignore[override]
            raise AssertionError(f"asked the host: {argv}")

    ws.host = NoExec("box")
    assert ws.remove() is True
    with pytest.raises(ArchiveRejected, match="did not decode.*already removed"):
        ws.pull(tmp_path / "into", scratch=tmp_path, size="10", inline=None)
