"""An attempt's directory removed beside the attempts that follow (``removals.Removals``) leaves what the
plain removal before the next attempt left: the same results, nothing in the workspace root, and no
attempt ever given the uid of a directory still there. In memory, where a removal waits on no disk, it
is removed at once, on no thread of its own."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_runner import removals, runner
from agent_runner.errors import RunnerError
from agent_runner.fingerprint import filesystem_of
from agent_runner.runner import RunOptions, run_suite
from tests.support.runner import passable_to_attempts, records, write_suite

#: an agent that leaves a tree behind in every directory of its own: files, a read-only directory, depth
LEAVES = [{"tool_calls": [{"name": "shell", "args": {"argv": ["sh", "leave.sh"]}}]},
          {"content": "left it all", "finish": "stop"}]
LEAVE_SH = ('for d in . "$HOME" "$TMPDIR"; do mkdir -p "$d/a/b/c" "$d/ro" && echo x > "$d/a/b/c/f" '
            '&& touch "$d/ro/g" && chmod 500 "$d/ro"; done\n')


def _suite(tmp_path: Path) -> Path:
    passable_to_attempts(tmp_path)
    return write_suite(tmp_path / "suite", {
        "leaves": {"script": LEAVES, "repo": {"run_tests.sh": "test -f a/b/c/f\n", "leave.sh": LEAVE_SH}},
        "fails": {"script": [{"content": "nothing", "finish": "stop"}], "repo": {"run_tests.sh": "exit 3\n"}},
    }, tools={"allow": ["sh"], "deny": []}, suite_toml=(
        'name = "t"\nrepeat = 3\n[agent]\nkind = "scripted"\n[budget]\nmax_steps = 8\ntimeout_s = 20\n'))


def _run(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    ws = tmp_path / f"ws-{name}"
    code = run_suite(RunOptions(suite=str(tmp_path / "suite"), out=str(tmp_path / f"out-{name}"),
                                workspace_root=str(ws), run_id="r", host="h"))
    assert code == 0
    assert list(ws.iterdir()) == []
    return [{k: v for k, v in row.items() if k != "wall_ms"} for row in records(tmp_path / f"out-{name}" / "results.jsonl")]


@contextlib.contextmanager
def _plain(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The removal this replaces: the attempt's directory gone before the next attempt starts."""
    with monkeypatch.context() as m:
        m.setattr(removals.Removals, "remove", lambda self, path, done: (removals.remove_tree(path), done()))
        yield


def _on_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workspace root counted as a disk's whatever file system the test's temporary directory is on."""
    monkeypatch.setattr(runner, "IN_MEMORY", frozenset())


def _slowed(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    real = removals.remove_tree

    def slow(path: Path) -> None:
        if path.parent.name.startswith("ws-"):  # an attempt's directory, not a file inside it
            time.sleep(seconds)
        real(path)

    monkeypatch.setattr(removals, "remove_tree", slow)


@pytest.mark.root
def test_deferred_removal_gives_the_results_and_the_empty_root_of_the_plain_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _suite(tmp_path)
    with _plain(monkeypatch):
        plain = _run(tmp_path, "plain")
    _on_disk(monkeypatch)
    _slowed(monkeypatch, 0.2)  # removals still running while the next attempts run
    deferred = _run(tmp_path, "deferred")
    assert deferred == plain
    assert [r["verdict"] for r in plain] == ["fail"] * 3 + ["pass"] * 3, plain


@pytest.mark.root
def test_no_attempt_gets_the_uid_of_a_directory_still_being_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _suite(tmp_path)
    _on_disk(monkeypatch)
    _slowed(monkeypatch, 0.3)
    ws = tmp_path / "ws-uids"
    pending: list[int] = []
    wrong: list[str] = []
    real: Callable[[set[int]], int] = runner.attempt_uid

    def checked(taken: set[int]) -> int:
        owners = set()
        for d in ws.iterdir() if ws.exists() else []:
            with contextlib.suppress(OSError):
                owners.add((d / "home").stat().st_uid)
        pending.append(len(owners))
        wrong.extend(f"uid {u} free while its directory exists" for u in owners - taken)
        return real(taken)

    monkeypatch.setattr(runner, "attempt_uid", checked)
    _run(tmp_path, "uids")
    assert max(pending) >= 1, "no removal was still running when an attempt started: nothing was checked"
    assert wrong == []


@pytest.mark.root
def test_in_memory_each_directory_is_removed_at_once_with_the_plain_results(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert filesystem_of("/dev/shm") == "tmpfs", "this test needs /dev/shm to be a tmpfs"
    _suite(tmp_path)
    with _plain(monkeypatch):
        plain = _run(tmp_path, "plain")
    made: list[removals.Removals] = []
    real_init = removals.Removals.__init__

    def init(self: removals.Removals, beside: bool = True) -> None:
        real_init(self, beside)
        made.append(self)

    monkeypatch.setattr(removals.Removals, "__init__", init)
    removed_paths: list[Path] = []
    real_remove = removals.Removals._remove

    def remove_now(self: removals.Removals, path: Path, done: Callable[[], None]) -> None:
        assert threading.current_thread() is threading.main_thread(), "removed on a thread of its own"
        removed_paths.append(path)
        real_remove(self, path, done)

    monkeypatch.setattr(removals.Removals, "_remove", remove_now)
    mem = Path(tempfile.mkdtemp(dir="/dev/shm"))
    mem.chmod(0o711)  # passable: the attempts run as uids of their own, so their directories go to ``Removals``
    try:
        (tmp_path / "ws-mem").symlink_to(mem)  # resolved by the runner: its workspace root is in memory
        in_memory = _run(tmp_path, "mem")
    finally:
        shutil.rmtree(mem)
    where = ("fingerprint", "env_sha")  # the file system's type is part of both
    assert [{k: v for k, v in r.items() if k not in where} for r in in_memory] == \
        [{k: v for k, v in r.items() if k not in where} for r in plain]
    assert [(r.beside, r._threads) for r in made] == [(False, [])]
    assert len(removed_paths) == 6 and all(p.parent == mem for p in removed_paths), removed_paths  # every attempt's


@pytest.mark.root
@pytest.mark.parametrize("on_disk", [True, False], ids=["beside", "in-memory"])
def test_a_directory_that_cannot_be_removed_is_the_runners_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on_disk: bool) -> None:
    _suite(tmp_path)
    if on_disk:
        _on_disk(monkeypatch)
    else:
        monkeypatch.setattr(runner, "IN_MEMORY", frozenset({filesystem_of(str(tmp_path))}))
    real = removals.remove_tree

    def refuse(path: Path) -> None:
        if path.name.startswith("fails.1."):
            raise PermissionError(13, os.strerror(13), str(path))
        real(path)

    monkeypatch.setattr(removals, "remove_tree", refuse)
    with pytest.raises(RunnerError, match="could not be removed.*fails.1"):
        run_suite(RunOptions(suite=str(tmp_path / "suite"), out=str(tmp_path / "out"),
                             workspace_root=str(tmp_path / "ws-err"), run_id="r", host="h"))


def test_a_signal_during_a_removal_in_memory_ends_the_run_with_the_removal_accounted_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # in memory the removal runs on the attempts' thread, where Ctrl-C and the run's SIGTERM are raised:
    # it goes on up (the run ends) once the directory is gone, its uid freed, the run's end waiting on nothing
    real = removals.remove_tree
    calls: list[Path] = []

    def interrupted_once(path: Path) -> None:
        calls.append(path)
        if len(calls) == 1:
            (path / "half").unlink()  # cut short part of the way
            raise KeyboardInterrupt
        real(path)

    monkeypatch.setattr(removals, "remove_tree", interrupted_once)
    attempt = tmp_path / "attempt"
    (attempt / "work").mkdir(parents=True)
    (attempt / "half").write_text("x")
    (attempt / "work" / "left").write_text("x")
    freed: list[str] = []
    in_memory = removals.Removals(beside=False)
    with pytest.raises(KeyboardInterrupt):
        in_memory.remove(attempt, lambda: freed.append("uid"))
    assert not attempt.exists() and freed == ["uid"]
    in_memory.wait()  # nothing open, nothing recorded: the interruption is the run's, not a removal's error
    in_memory.close()
