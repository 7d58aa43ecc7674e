"""The runner's in-run bundle check reads only what an attempt is run from (its task's directory and the
suite's shared files), yet sees every change the whole-suite digest it replaces saw."""

from __future__ import annotations

import hashlib
import json
import os
import random
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent_runner.sandbox import UID_BASE
from agent_runner.suite_digest import SHARED_PART, part_digest, part_digests, suite_sealed, task_part
from tests.support.runner import REPO, clean_env, records, run_runner, write_suite


def whole_tree_digest(root: Path) -> str:
    """The plain check this replaces: every path, mode and content of the suite, in one digest."""
    h = hashlib.sha256()
    for base, dirs, files in os.walk(str(root)):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(base, name)
            st = os.lstat(path)
            h.update(f"{os.path.relpath(path, str(root))}\0{st.st_mode}\0".encode())
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as fh:
                    h.update(fh.read())
            elif stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(path).encode())
    return h.hexdigest()


def _suite(root: Path) -> Path:
    for rel in ("suite.json", "agent/a.py", "agent/lib/b.py", "tasks/t1/task.toml", "tasks/t1/repo/run_tests.sh",
                "tasks/t1/repo/src/x.py", "tasks/t2/prompt.md", "tasks/t3/repo/deep/er/f.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"content of {rel}\n")
    return root


def _part_of(rel: str) -> str:
    first, _, rest = rel.partition("/")
    return task_part(rest.split("/")[0]) if first == "tasks" and rest else SHARED_PART


def _mutate(root: Path, rng: random.Random) -> str:
    """Change one thing under ``root`` the way an attempt could; the relative path it changed."""
    entries = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    files = [e for e in entries if (root / e).is_file() and not (root / e).is_symlink()]
    dirs = [e for e in entries if (root / e).is_dir() and not (root / e).is_symlink()]
    kind = rng.choice(["edit", "chmod", "add", "remove", "link", "mkdir", "edit-same-size", "add-task"])
    if kind in ("edit", "edit-same-size", "chmod", "remove", "link") and files:
        rel = rng.choice(files)
        path = root / rel
        if kind == "edit":
            path.write_text(path.read_text() + "x")
        elif kind == "edit-same-size":
            text = path.read_text()
            path.write_text(("X" if text[0] != "X" else "Y") + text[1:])
        elif kind == "chmod":
            path.chmod(path.stat().st_mode ^ 0o100)
        elif kind == "remove":
            path.unlink()
        else:
            path.unlink()
            path.symlink_to("/etc/hostname")
        return rel
    if kind == "add-task":
        rel = f"tasks/new{rng.randrange(10**6)}"
        (root / rel).mkdir()
        return rel
    base = rng.choice(dirs) if dirs else "."
    rel = os.path.normpath(f"{base}/n{rng.randrange(10**6)}")
    (root / rel).mkdir() if kind == "mkdir" else (root / rel).write_text("new")
    return rel


def test_every_change_the_whole_suite_digest_sees_is_seen_in_the_part_it_was_made_in(tmp_path: Path) -> None:
    rng = random.Random(1234)
    for trial in range(60):
        root = _suite(tmp_path / f"s{trial}")
        before, whole_before = part_digests(root), whole_tree_digest(root)
        # one walk and a walk per part agree
        assert before == {part: part_digest(root, part) for part in before}
        rel = _mutate(root, rng)
        after = part_digests(root)
        assert after == {part: part_digest(root, part) for part in after}
        changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
        assert (whole_tree_digest(root) != whole_before) == bool(changed)
        assert changed == {_part_of(rel)}, (rel, changed)


def test_a_part_that_is_gone_or_a_link_differs_from_the_directory_it_was(tmp_path: Path) -> None:
    root = _suite(tmp_path / "s")
    before = part_digests(root)
    os.rename(root / "tasks" / "t2", tmp_path / "t2")
    assert part_digest(root, task_part("t2")) != before[task_part("t2")]
    (root / "tasks" / "t2").symlink_to(tmp_path / "t2")  # the same files, reached through a link
    assert part_digest(root, task_part("t2")) != before[task_part("t2")]
    assert part_digest(root, task_part("t2")) == part_digests(root)[task_part("t2")]


def _tampering_suite(root: Path, target: str) -> Path:
    """Tasks a, b, c (run in that order); a's predicate appends to ``target`` (a path in the suite) and
    passes; b's and c's pass."""
    def predicate(extra: str = "") -> dict[str, object]:
        return {"toml": '[agent]\nkind = "none"\n', "repo": {"run_tests.sh": f"{extra}exit 0\n", "data.txt": "d\n"}}
    suite = write_suite(root, {"a": predicate(f"echo tampered >> '{root / target}'\n"), "b": predicate(),
                               "c": predicate()}, agent_files={"shared.py": "x = 1\n"})
    (root / target).chmod(0o666)  # whatever uid the attempt runs as may write it
    for parent in (root / target).parents:
        if parent == root.parent:
            break
        parent.chmod(parent.stat().st_mode | 0o005)
    return suite


def test_an_attempt_that_changes_another_tasks_files_makes_only_that_task_an_error(tmp_path: Path) -> None:
    suite = _tampering_suite(tmp_path / "s", "tasks/b/repo/data.txt")
    done = run_runner("run", "--suite", str(suite), "--out", str(tmp_path / "out"), env=clean_env())
    assert done.returncode == 3, done.stderr  # an attempt could not be run: the runner says so
    rows = {r["task"]: r for r in records(tmp_path / "out" / "results.jsonl")}
    assert (rows["a"]["verdict"], rows["b"]["verdict"], rows["c"]["verdict"]) == ("pass", "error", "pass")
    assert "the bundle changed during the run (tasks/b/)" in rows["b"]["why"]


def test_an_attempt_that_changes_the_suites_shared_files_makes_every_later_attempt_an_error(tmp_path: Path) -> None:
    suite = _tampering_suite(tmp_path / "s", "agent/shared.py")
    done = run_runner("run", "--suite", str(suite), "--out", str(tmp_path / "out"), env=clean_env())
    assert done.returncode == 3, done.stderr
    rows = {r["task"]: r for r in records(tmp_path / "out" / "results.jsonl")}
    assert (rows["a"]["verdict"], rows["b"]["verdict"], rows["c"]["verdict"]) == ("pass", "error", "error")
    assert all("the bundle changed during the run (its shared files)" in rows[t]["why"] for t in "bc")


def plain_sealed(root: Path) -> bool:
    """Whether anyone but root or this user may change the suite, path by path: every entry (a link
    by its owner), the directory itself, and every directory above it (there a sticky one will do)."""
    me = os.geteuid()

    def ours(st: os.stat_result) -> bool:
        return st.st_uid in (0, me) and (stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o022)

    for base, dirs, files in os.walk(str(root)):
        for name in dirs + files:
            if not ours(os.lstat(os.path.join(base, name))):
                return False
    if not ours(os.stat(root)):
        return False
    for above in Path(os.path.realpath(root)).parents:
        st = os.stat(above)
        if not ours(st) and not (st.st_uid in (0, me) and st.st_mode & stat.S_ISVTX):
            return False
    return True


SPOILS = [None, "a file anyone may write", "a directory its group may write", "a file of another user",
          "a link of another user", "the suite's directory anyone may write", "a directory above anyone may write",
          "a sticky directory above anyone may write"]


@pytest.mark.root
@pytest.mark.parametrize("spoil", SPOILS)
def test_a_suite_is_sealed_exactly_when_only_root_or_the_runner_may_change_it(tmp_path: Path, spoil: str) -> None:
    """The seal that spares attempts with a uid of their own the check (``suite_sealed``) is the plain
    path-by-path look."""
    above = tmp_path / "above"
    root = write_suite(above / "s", {"a": {"toml": '[agent]\nkind = "none"\n', "repo": {"run_tests.sh": "exit 0\n"}}},
                       agent_files={"shared.py": "x = 1\n"})
    (root / "tasks" / "a" / "repo" / "link").symlink_to("run_tests.sh")
    for d in (root, *root.rglob("*")):
        if not d.is_symlink():
            d.chmod(0o755 if d.is_dir() else 0o644)
    above.chmod(0o755)
    other = UID_BASE + 999
    if spoil == "a file anyone may write":
        (root / "agent" / "shared.py").chmod(0o666)
    elif spoil == "a directory its group may write":
        (root / "tasks" / "a").chmod(0o775)
    elif spoil == "a file of another user":
        os.lchown(root / "tasks" / "a" / "repo" / "run_tests.sh", other, other)
    elif spoil == "a link of another user":
        os.lchown(root / "tasks" / "a" / "repo" / "link", other, other)
    elif spoil == "the suite's directory anyone may write":
        root.chmod(0o1777)
    elif spoil == "a directory above anyone may write":
        above.chmod(0o777)
    elif spoil == "a sticky directory above anyone may write":
        above.chmod(0o1777)
    sealed = suite_sealed(root)
    assert sealed == plain_sealed(root)
    assert sealed == (spoil in (None, "a sticky directory above anyone may write"))


@pytest.mark.root
def test_an_attempt_with_a_uid_of_its_own_cannot_change_a_sealed_suite(tmp_path: Path) -> None:
    """A suite only root may write, run at pidns+uid (the check before each attempt not needed): an
    attempt that tries to change the next task's files and the shared ones cannot, and every later
    attempt runs from the files as they were."""
    assert os.geteuid() == 0, "needs root: only a root runner gives attempts a uid of their own"
    scratch = tmp_path / "pass"
    scratch.mkdir()
    for d in (scratch, *scratch.parents):
        d.chmod(d.stat().st_mode | 0o005)  # the attempts' uid reaches the suite and its workspace
    root = scratch / "s"
    targets = [root / "tasks" / "b" / "repo" / "data.txt", root / "agent" / "shared.py"]
    attack = "".join(f"echo tampered >> '{t}' 2>/dev/null; " for t in targets) + f"rm -f '{targets[0]}'; exit 0\n"

    def predicate(script: str) -> dict[str, object]:
        return {"toml": '[agent]\nkind = "none"\n', "repo": {"run_tests.sh": script, "data.txt": "d\n"}}

    write_suite(root, {"a": predicate(attack), "b": predicate("grep -qx d data.txt\n"), "c": predicate("exit 0\n")},
                agent_files={"shared.py": "x = 1\n"})
    assert suite_sealed(root)
    done = run_runner("run", "--suite", str(root), "--out", str(scratch / "out"), "--workspace-root",
                      str(scratch / "ws"), env=clean_env())
    assert done.returncode == 0, done.stderr
    assert '"isolation": "netns+pidns+uid"' in (scratch / "out" / "fingerprint.json").read_text() or \
        '"isolation": "pidns+uid"' in (scratch / "out" / "fingerprint.json").read_text()
    rows = {r["task"]: r for r in records(scratch / "out" / "results.jsonl")}
    assert [rows[t]["verdict"] for t in "abc"] == ["pass", "pass", "pass"], rows
    assert targets[0].read_text() == "d\n" and targets[1].read_text() == "x = 1\n"


def _sealed_suite_out_of_the_attempts_reach(tmp_path: Path, tamper: bool) -> Path:
    """Tasks a, b, c in a suite only root may write, in a directory no other uid may enter: a root run at
    ``pidns+uid`` (its workspace is reachable) whose attempts cannot reach the suite run as the
    runner's uid (``attempt_sandbox``), the run having started sealed. With ``tamper``, a's predicate
    appends to b's files."""
    tmp_path.chmod(0o755)
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    root = closed / "s"
    first = f"echo tampered >> '{root}/tasks/b/repo/data.txt'\nexit 0\n" if tamper else "exit 0\n"
    write_suite(root, {
        "a": {"toml": '[agent]\nkind = "none"\n', "repo": {"run_tests.sh": first}},
        "b": {"toml": '[agent]\nkind = "none"\n', "repo": {"run_tests.sh": "exit 0\n", "data.txt": "d\n"}},
        "c": {"toml": '[agent]\nkind = "none"\n', "repo": {"run_tests.sh": "exit 0\n"}},
    })
    for d in (root, *root.rglob("*")):
        d.chmod(0o755 if d.is_dir() else 0o644)
    closed.chmod(0o700)
    assert suite_sealed(root)
    return root


def _run_isolated(root: Path, tmp_path: Path, *, digests_take_s: float = 0.0) -> subprocess.CompletedProcess[str]:
    """The runner on ``root``, as root, with ``part_digests`` slowed by ``digests_take_s``; its run's
    isolation must be ``pidns+uid``."""
    code = (
        "import sys, time\n"
        "from agent_runner import suite_digest\n"
        "plain = suite_digest.part_digests\n"
        f"suite_digest.part_digests = lambda root: (time.sleep({digests_take_s}), plain(root))[1]\n"
        "from agent_runner.__main__ import main\n"
        f"sys.exit(main(['run', '--suite', {str(root)!r}, '--out', {str(tmp_path / 'out')!r}, "
        f"'--workspace-root', {str(tmp_path / 'ws')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=clean_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    isolation = json.loads((tmp_path / "out" / "fingerprint.json").read_text())["isolation"]
    assert isolation.endswith("pidns+uid"), (isolation, done.stderr)
    return done


@pytest.mark.root
def test_a_sealed_suite_whose_attempts_share_the_runners_uid_is_checked_against_what_the_run_found(
    tmp_path: Path,
) -> None:
    """A run at ``pidns+uid`` that starts from a sealed suite (no digests made then) and whose attempts
    cannot have a uid of their own: the first attempt's check digests the suite before that attempt
    runs; it changes the next task's files, and the change is seen."""
    assert os.geteuid() == 0, "needs root: a root runner's attempts are the ones a seal would spare"
    root = _sealed_suite_out_of_the_attempts_reach(tmp_path, tamper=True)
    done = _run_isolated(root, tmp_path)
    assert done.returncode == 3, done.stderr
    rows = {r["task"]: r for r in records(tmp_path / "out" / "results.jsonl")}
    assert (rows["a"]["verdict"], rows["b"]["verdict"], rows["c"]["verdict"]) == ("pass", "error", "pass"), rows
    assert "the bundle changed during the run (tasks/b/)" in rows["b"]["why"]
    assert (root / "tasks" / "b" / "repo" / "data.txt").read_text() == "d\ntampered\n"


@pytest.mark.root
def test_the_whole_suites_digests_made_at_an_attempts_check_are_not_that_attempts_time(tmp_path: Path) -> None:
    """The digests a run that started sealed makes at its first check (slowed here to 1.5 s) count
    neither in that attempt's wall time nor against its budget: a slow suite is no host's slow task."""
    assert os.geteuid() == 0, "needs root: a root runner's attempts are the ones a seal would spare"
    root = _sealed_suite_out_of_the_attempts_reach(tmp_path, tamper=False)
    done = _run_isolated(root, tmp_path, digests_take_s=1.5)
    assert done.returncode == 0, done.stderr
    rows = {r["task"]: r for r in records(tmp_path / "out" / "results.jsonl")}
    assert [rows[t]["verdict"] for t in "abc"] == ["pass", "pass", "pass"], rows
    [wall_ms] = [r["wall_ms"] for r in records(tmp_path / "out" / "traces" / "a.0.jsonl") if r["type"] == "finish"]
    assert wall_ms < 1000, wall_ms
