"""The runner's mark that no process of any attempt is left (``reaped.leave_reaped_mark``): made at
``pidns+uid`` once the runner has no child left, never while one is, and never by an attempt."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.runner import REPO, clean_env, passable_to_attempts, predicate_suite, records

#: in a Python of its own (a test process may have children of other tests): the mark with a child
#: running, then with that child waited for
_WITH_AND_WITHOUT_A_CHILD = r"""
import json, subprocess, sys
from agent_runner.privs import make_subreaper
from agent_runner.reaped import leave_reaped_mark, no_child_left
first, second = sys.argv[1], sys.argv[2]
assert make_subreaper()
child = subprocess.Popen(["sleep", "30"])
said = {"with_child": [no_child_left(), leave_reaped_mark(first, True)]}
child.kill()
child.wait()
said["without"] = [no_child_left(), leave_reaped_mark(second, True)]
print(json.dumps(said))
"""

#: an ended child not yet waited for counts: it is looked at, never reaped (subprocess still waits it)
_A_CHILD_NOT_YET_WAITED_FOR = r"""
import json, subprocess, sys, time
from agent_runner.reaped import no_child_left
child = subprocess.Popen(["true"])
time.sleep(0.5)
first = no_child_left()
print(json.dumps([first, child.wait(), no_child_left()]))
"""

#: a child that leaves a process of its own behind and ends: that orphan becomes the subreaper's child
_AN_ORPHAN_STAYS_A_CHILD = r"""
import json, subprocess, sys
from agent_runner.privs import make_subreaper
from agent_runner.reaped import leave_reaped_mark, no_child_left
assert make_subreaper()
subprocess.run(["sh", "-c", "sleep 30 >/dev/null 2>&1 &"], check=True)
print(json.dumps([no_child_left(), leave_reaped_mark(sys.argv[1], True)]))
"""

#: what is asked, what is there, what the mark is then: (own uids, a subreaper, a file there before)
_ASKED = r"""
import json, sys
from agent_runner.privs import make_subreaper
from agent_runner.reaped import leave_reaped_mark
path, own, reaper = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
if reaper:
    assert make_subreaper()
print(json.dumps(leave_reaped_mark(path, own)))
"""


def _python(code: str, *args: str) -> object:
    done = subprocess.run([sys.executable, "-c", code, *args], env=clean_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_no_mark_while_a_child_runs_and_one_once_it_was_waited_for(tmp_path: Path) -> None:
    said = _python(_WITH_AND_WITHOUT_A_CHILD, str(tmp_path / "first"), str(tmp_path / "second"))
    assert said == {"with_child": [False, False], "without": [True, True]}
    assert not (tmp_path / "first").exists()
    assert (tmp_path / "second").is_file()


def test_an_ended_child_not_yet_waited_for_still_counts_and_is_not_reaped() -> None:
    assert _python(_A_CHILD_NOT_YET_WAITED_FOR) == [False, 0, True]


def test_a_process_whose_parent_ended_is_still_the_runners_to_wait_for(tmp_path: Path) -> None:
    """A process left behind (``cmd &`` in a shell that then ends) reparents to the runner, not to
    init: the runner sees a child, and makes no mark."""
    assert _python(_AN_ORPHAN_STAYS_A_CHILD, str(tmp_path / "mark")) == [False, False]
    assert not (tmp_path / "mark").exists()


@pytest.mark.parametrize(("own", "reaper", "made"), [(True, True, True), (False, True, False), (True, False, False)])
def test_the_mark_only_with_own_uids_and_a_subreaper_and_never_one_made_before(
    tmp_path: Path, own: bool, reaper: bool, made: bool
) -> None:
    """A file of that name already there (made by anyone) is removed; the runner's own is new."""
    mark = tmp_path / "mark"
    mark.write_text("made by someone else")
    said = _python(_ASKED, str(mark), "1" if own else "0", "1" if reaper else "0")
    assert said is made
    assert mark.exists() == made
    if made:
        assert mark.read_text() == ""


def test_the_mark_is_never_made_through_a_link(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    (tmp_path / "mark").symlink_to(target)
    assert _python(_ASKED, str(tmp_path / "mark"), "1", "1") is True
    assert not target.exists()  # the link was removed, the mark made in its place
    assert (tmp_path / "mark").is_file() and not (tmp_path / "mark").is_symlink()


def _run_one_passing(suite: Path, ws: Path, mark: Path) -> str:
    """Run the one-task ``suite`` as a replay lays out ``ws`` (``out``, ``work``), asking for ``mark``;
    its attempt passes. The run's isolation level, as its fingerprint says it."""
    out = ws / "out"
    done = subprocess.run(
        [sys.executable, "-m", "agent_runner", "run", "--suite", str(suite), "--out", str(out),
         "--workspace-root", str(ws / "work"), "--host", "h", "--reaped", str(mark)],
        env=clean_env(), cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    [row] = records(out / "results.jsonl")
    assert row["verdict"] == "pass", (row.get("why"), done.stderr[-600:])
    return str(json.loads((out / "fingerprint.json").read_text())["isolation"])


@pytest.mark.root
def test_a_root_runner_marks_its_end_and_its_attempt_cannot_forge_the_mark(tmp_path: Path) -> None:
    """As the replay lays it out: the workspace's top directory root's (0711), the mark in it. The
    predicate, as its own uid, tries to make the mark first: it cannot, and the runner makes it at
    the end."""
    passable_to_attempts(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir(mode=0o711)
    ws.chmod(0o711)
    mark = ws / "reaped"
    # a subshell: a redirection that fails ends a POSIX shell when it is the special built-in's own
    m = shlex.quote(str(mark))
    forge = f'if ( : > {m} ) 2>/dev/null || mkdir {m} 2>/dev/null; then echo forged; exit 1; fi\nexit 0\n'
    suite = predicate_suite(tmp_path, forge, tasks=1)
    isolation = _run_one_passing(suite, ws, mark)
    assert isolation.endswith("pidns+uid"), isolation
    assert mark.is_file() and mark.stat().st_uid == 0


@pytest.mark.root
def test_an_attempt_without_a_uid_of_its_own_leaves_no_mark(tmp_path: Path) -> None:
    """A root runner whose attempt paths no other uid can reach runs them at a lower level, as its own
    uid (``attempt_sandbox``): such an attempt could leave a process outside any namespace, so the run
    never says none is left, and a file of that name made before is removed."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)  # not passable: the attempts' directories below it are out of other uids' reach
    ws = private / "ws"
    ws.mkdir(mode=0o711)
    mark = ws / "reaped"
    mark.write_text("made before")
    suite = predicate_suite(private, "exit 0\n", tasks=1)
    _run_one_passing(suite, ws, mark)
    assert not mark.exists()
