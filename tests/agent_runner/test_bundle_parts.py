"""The runner's in-run bundle check reads only what an attempt is run from (its task's directory and the
suite's shared files), yet sees every change the whole-suite digest it replaces saw."""

from __future__ import annotations

import hashlib
import os
import random
import stat
from pathlib import Path

from agent_runner.runner import SHARED_PART, part_digest, part_digests, task_part
from tests.support.runner import clean_env, records, run_runner, write_suite


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
