"""What an attempt left outside its workspace, found by looking again only in the world-writable
directories that changed during the attempt, is what the plain walk of every entry under the stray roots
found (run as root: the trees hold files of another uid)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from agent_runner import strays
from agent_runner.sandbox import UID_BASE
from agent_runner.strays import DEPTH, StrayWatch
from tests.support.runner import predicate_suite, records, run_runner

UID = UID_BASE + 4242
OTHER = UID_BASE + 4343


@pytest.fixture(params=[True, False], ids=["notified", "looked-at"], autouse=True)
def notices(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Every test runs with the kernel's notices of changes (inotify) and without them (every
    watched directory's inode and times looked at again after each attempt)."""
    monkeypatch.setattr(strays, "USE_INOTIFY", request.param)
    return bool(request.param)


def plain_strays(uid: int, roots: list[str], own: str) -> list[str]:
    """The walk this replaces: lstat every entry to depth 4 under each root, keep the uid's own."""
    found: list[str] = []
    inodes: set[tuple[int, int]] = set()
    for top in roots:
        base_depth = top.rstrip("/").count("/")
        for root, dirs, files in os.walk(top):
            if root.count("/") - base_depth >= 4:
                dirs[:] = []
            for name in dirs + files:
                path = os.path.join(root, name)
                with contextlib.suppress(OSError):
                    st = os.lstat(path)
                    if st.st_uid == uid and (st.st_dev, st.st_ino) not in inodes:
                        inodes.add((st.st_dev, st.st_ino))
                        found.append(path)
    found = [p for p in found if p != own and not p.startswith(own.rstrip("/") + "/")]
    found = [p for p in found if not any(p.startswith(f + "/") for f in found)]
    return sorted(found)


def plain_watched(roots: list[str]) -> dict[str, int]:
    """The directories the watch must look in, by a plain walk of every directory: a root anyone may
    write, and every directory anyone may write within DEPTH levels, reached through directories
    anyone may pass (never through a link); the first root that reaches one names its depth."""
    watched: dict[str, int] = {}
    for top in roots:
        with contextlib.suppress(OSError):
            if os.stat(top).st_mode & 0o002:
                watched.setdefault(top, 0)
        base = top.rstrip("/").count("/")
        for root, dirs, _files in os.walk(top):
            below = root.rstrip("/").count("/") - base + 1
            passable = []
            for name in dirs:
                path = os.path.join(root, name)
                with contextlib.suppress(OSError):
                    st = os.lstat(path)
                    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o001:
                        if st.st_mode & 0o002:
                            watched.setdefault(path, below)
                        passable.append(name)
            dirs[:] = passable if below < DEPTH else []
    return watched


MODES = [0o755, 0o700, 0o711, 0o1777, 0o777, 0o555, 0o733, 0o770, 0o703]


def _host_tree(top: Path, rng: random.Random, depth: int = 0) -> None:
    """A host's directories of every kind of permission, of root and of another user."""
    for i in range(rng.randrange(1, 5)):
        path = top / f"e{depth}{i}"
        kind = rng.random()
        if kind < 0.45 and depth < 6:
            path.mkdir()
            _host_tree(path, rng, depth + 1)
            os.lchown(path, rng.choice([0, OTHER]), 0)
            path.chmod(rng.choice(MODES))
        elif kind < 0.55:
            path.symlink_to(rng.choice(["/etc", str(top), "nowhere"]))
        else:
            path.write_text("x")
            os.lchown(path, rng.choice([0, OTHER]), 0)


def _writable_by_the_uid(roots: list[Path]) -> list[Path]:
    """Every directory the uid can reach and write (other's x on the way, other's w there)."""
    out = []
    for top in roots:
        stack = [top]
        while stack:
            d = stack.pop()
            st = d.lstat()
            if not st.st_mode & 0o001 and st.st_uid != UID:
                continue
            if st.st_mode & 0o002 or st.st_uid == UID:
                out.append(d)
            stack += [c for c in d.iterdir() if c.is_dir() and not c.is_symlink()]
    return sorted(out)


def _attempt_writes(roots: list[Path], rng: random.Random, n: int) -> None:
    """What an attempt running as the uid does: files, directories with files in them, links, each
    where the uid may create it."""
    for _ in range(n):
        where = rng.choice(_writable_by_the_uid(roots))
        path = where / f"u{rng.randrange(10**9)}"
        kind = rng.random()
        if kind < 0.3:
            path.mkdir()
            (path / "inner").write_text("x")
            os.lchown(path / "inner", UID, UID)
            path.chmod(rng.choice([0o755, 0o777, 0o700]))
        elif kind < 0.4:
            path.symlink_to("/etc/passwd")
        else:
            path.write_text("x")
        os.lchown(path, UID, UID)


@pytest.mark.parametrize("seed", range(12))
def test_the_watch_finds_what_the_plain_walk_finds_attempt_after_attempt(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    roots = []
    for name in ("tmp", "vartmp", "shm", "home"):
        top = tmp_path / name
        top.mkdir()
        _host_tree(top, rng)
        top.chmod(0o755 if name == "home" else 0o1777)
        roots.append(top)
    own = tmp_path / "tmp" / "attempt"
    own.mkdir()
    watch = StrayWatch(str(roots[3]), roots=[str(r) for r in roots[:3]])
    reported: set[str] = set()
    for _attempt in range(3):
        mark = watch.mark()
        (own / "work").mkdir()
        os.lchown(own / "work", UID, UID)
        _attempt_writes(roots, rng, rng.randrange(0, 6))
        want = [p for p in plain_strays(UID, [str(r) for r in roots], str(own)) if p not in reported]
        got = [p for p in watch.since(mark, UID, str(own)) if p not in reported]
        assert got == want
        reported.update(got)
        shutil.rmtree(own / "work")
    assert reported or seed  # the attempts do leave files


def test_a_file_made_within_the_clock_tick_of_the_mark_is_found(tmp_path: Path) -> None:
    top = tmp_path / "tmp"
    top.mkdir()
    top.chmod(0o1777)
    watch = StrayWatch(roots=[str(top)])
    for i in range(50):
        mark = watch.mark()
        (top / f"f{i}").write_text("x")
        os.lchown(top / f"f{i}", UID, UID)
        assert watch.since(mark, UID, str(tmp_path / "own")) == [str(top / f"f{j}") for j in sorted(range(i + 1), key=str)]


def test_a_world_writable_directory_made_during_the_run_is_watched_from_then_on(tmp_path: Path) -> None:
    top = tmp_path / "tmp"
    top.mkdir()
    top.chmod(0o1777)
    watch = StrayWatch(roots=[str(top)])
    shared = top / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # another user's, made after the run started
    (shared / "left").write_text("x")
    os.lchown(shared / "left", UID, UID)
    assert watch.since(watch.mark(), UID, str(tmp_path / "own")) == [str(shared / "left")]
    mark = watch.mark()
    (shared / "later").write_text("x")
    os.lchown(shared / "later", UID, UID)
    assert watch.since(mark, UID, str(tmp_path / "own")) == [str(shared / "later"), str(shared / "left")]


@pytest.mark.parametrize("seed", range(12))
def test_the_watch_starts_with_what_a_plain_walk_of_every_directory_finds(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    roots = []
    for name in ("tmp", "vartmp", "shm"):
        top = tmp_path / name
        top.mkdir()
        _host_tree(top, rng)
        top.chmod(rng.choice([0o1777, 0o755, 0o711]))
        roots.append(str(top))
    home = rng.choice([str(tmp_path / "home"), os.path.join(roots[0], "home")])  # a HOME under /tmp too
    os.makedirs(home, exist_ok=True)
    _host_tree(Path(home), rng)
    chain = Path(roots[2], *[f"d{i}" for i in range(DEPTH + 1)])  # anyone may write past DEPTH
    chain.mkdir(parents=True)
    for part in [chain, *chain.parents][: DEPTH + 1]:
        part.chmod(0o777)
    (tmp_path / "link").symlink_to(roots[1])  # a root that is a link (/tmp -> private/tmp)
    roots[1] = str(tmp_path / "link")
    watch = StrayWatch(home, roots=roots)
    assert watch.depth == plain_watched([*roots, home])
    assert watch.depth[str(chain.parent)] == DEPTH and str(chain) not in watch.depth


@pytest.mark.parametrize("seed", range(8))
def test_a_mark_taken_from_the_last_look_finds_what_a_fresh_mark_finds(
        tmp_path: Path, seed: int, notices: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """An attempt's mark is how far the kernel's notices were read, or else the last ``since`` of
    the run (every watched directory was looked at then, before the attempt started), never a look
    of its own: with attempts overlapping as slots run them, and files of other users made between
    them, each attempt's strays are those a fresh look at every directory finds."""
    rng = random.Random(seed)
    roots = []
    for name in ("tmp", "vartmp"):
        top = tmp_path / name
        top.mkdir()
        _host_tree(top, rng)
        top.chmod(0o1777)
        roots.append(top)
    own = tmp_path / "own"
    reused = StrayWatch(roots=[str(r) for r in roots])
    monkeypatch.setattr(strays, "USE_INOTIFY", False)
    fresh = StrayWatch(roots=[str(r) for r in roots])
    assert (reused._changes is not None) == notices

    def fresh_mark() -> object:
        fresh._latest = None  # as before: every attempt looked itself
        return fresh.mark()

    uids = [UID_BASE + 5000 + i for i in range(6)]
    running: list[tuple[int, object, object]] = []
    for uid in uids:
        running.append((uid, reused.mark(), fresh_mark()))
        for _ in range(rng.randrange(1, 4)):  # the running attempts write, and so does someone else
            writer = rng.choice([u for u, _, _ in running] + [OTHER])
            where = rng.choice(_writable_by_the_uid(roots))
            path = where / f"w{rng.randrange(10**9)}"
            path.write_text("x")
            os.lchown(path, writer, writer)
        if len(running) > 1 or uid == uids[-1]:  # up to two at once; the oldest ends first
            done, mark_reused, mark_fresh = running.pop(0)
            got = reused.since(mark_reused, done, str(own))  # type: ignore[arg-type]
            assert got == fresh.since(mark_fresh, done, str(own))  # type: ignore[arg-type]
            assert got == plain_strays(done, [str(r) for r in roots], str(own))
    assert (reused._latest is None) == notices


@pytest.mark.root
def test_a_run_reports_what_its_attempt_left_in_a_shared_directory_of_tmp(tmp_path: Path) -> None:
    """The whole path: the run's walk (beside the isolation probe) finds a world-writable directory
    below /tmp made before the run inside one only root may write (so only that walk can find it), and
    the attempt's file there is in its trace's finish record."""
    assert os.geteuid() == 0, "needs root: only attempts of a uid of their own have their strays found"
    token = f"crosshost-strays-{os.getpid()}-{random.randrange(10**9)}"
    shared = Path("/tmp") / token / "shared"
    scratch = Path(tempfile.mkdtemp(prefix="crosshost-strays-", dir="/var/tmp"))
    try:
        shared.mkdir(parents=True)
        shared.parent.chmod(0o755)
        shared.chmod(0o1777)
        scratch.chmod(0o755)  # the attempt's uid reaches its workspace: pidns+uid
        suite = predicate_suite(scratch, f"touch {shared}/left && exit 0", tasks=1)
        done = run_runner("run", "--suite", str(suite), "--out", str(scratch / "out"),
                          "--workspace-root", str(scratch / "ws"), "--host", "h")
        assert done.returncode == 0, done.stderr
        assert json.loads((scratch / "out" / "fingerprint.json").read_text())["isolation"].endswith("pidns+uid")
        finish = records(scratch / "out" / "traces" / "t-0.0.jsonl")[-1]
        assert finish["outside_workspace"] == [f"{shared}/left"]
        assert f"wrote outside its workspace: {shared}/left" in done.stderr
    finally:
        shutil.rmtree(shared.parent, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


def test_a_watched_directory_made_again_is_looked_in_and_watched_again(tmp_path: Path) -> None:
    """A directory's watch follows its inode: one removed (or moved away) and made again at its path
    is looked in at the next attempt, and watched from then on."""
    top = tmp_path / "tmp"
    top.mkdir()
    top.chmod(0o755)  # only the directory below is anyone's: what changes in top is never told
    shared = top / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    watch = StrayWatch(roots=[str(top)])
    own = str(tmp_path / "own")
    shutil.rmtree(shared)
    mark = watch.mark()
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "first").write_text("x")
    os.lchown(shared / "first", UID, UID)
    assert watch.since(mark, UID, own) == [str(shared / "first")]
    mark = watch.mark()
    (shared / "second").write_text("x")
    os.lchown(shared / "second", OTHER, OTHER)
    assert watch.since(mark, OTHER, own) == [str(shared / "second")]
    shared.rename(top / "away")  # and a directory moved away: its path is looked in again
    mark = watch.mark()
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "third").write_text("x")
    os.lchown(shared / "third", OTHER, OTHER)
    assert watch.since(mark, OTHER, own) == [str(shared / "third")]


def test_without_the_kernels_notices_every_directory_is_looked_at(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """No inotify instance left for this user (or none at all): the watch looks at every directory's
    inode and times after each attempt, and finds the same."""

    def refused(self: object) -> None:
        raise OSError(24, "inotify_init1")

    monkeypatch.setattr(strays._Changes, "__init__", refused)
    top = tmp_path / "tmp"
    top.mkdir()
    top.chmod(0o1777)
    watch = StrayWatch(roots=[str(top)])
    assert watch._changes is None
    mark = watch.mark()
    (top / "left").write_text("x")
    os.lchown(top / "left", UID, UID)
    assert watch.since(mark, UID, str(tmp_path / "own")) == [str(top / "left")]


def _inotify_fds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
    return count


def test_a_watch_closed_beside_the_runs_end_lets_its_descriptor_go_and_still_finds_what_is_left(
    tmp_path: Path, notices: bool
) -> None:
    """After the run's last attempt the kernel's notices are closed on a thread of their own (the
    close waits for the kernel, the process's exit no longer does): the descriptor goes, and a look
    after it, from a mark taken before or after, still finds what an attempt left."""
    top = tmp_path / "tmp"
    top.mkdir()
    top.chmod(0o1777)
    own = str(tmp_path / "own")
    watch = StrayWatch(roots=[str(top)])
    before = watch.mark()
    (top / "left").write_text("x")
    os.lchown(top / "left", UID, UID)
    held = _inotify_fds()
    closing = watch.close_beside()
    assert (closing is not None) == notices
    if closing is not None:
        closing.join(10)
        assert not closing.is_alive() and _inotify_fds() == held - 1
    assert watch.close_beside() is None  # once
    assert watch.since(before, UID, own) == [str(top / "left")]
    after = watch.mark()
    (top / "later").write_text("x")
    os.lchown(top / "later", UID, UID)
    assert watch.since(after, UID, own) == [str(top / "later"), str(top / "left")]


def test_a_crowded_tree_never_hides_a_shallow_world_writable_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A root holding more than the walk looks at (``MAX_ENTRIES``): what is left unlooked at is the
    deepest part. A world-writable directory two levels down, beside eight trees crowded one level
    deeper, is watched whatever order the file system lists them in."""
    monkeypatch.setattr(strays, "MAX_ENTRIES", 60)
    top = tmp_path / "tmp"
    top.mkdir()
    top.chmod(0o1777)
    for i in range(8):
        crowd = top / f"crowd{i}" / "sub"
        crowd.mkdir(parents=True)
        for j in range(40):
            (crowd / f"f{j}").write_text("")
    shared = top / "token" / "shared"
    shared.mkdir(parents=True)
    shared.chmod(0o1777)
    watch = StrayWatch(roots=[str(top)])
    assert watch.depth.get(str(shared)) == 2
    (shared / "left").write_text("x")
    os.lchown(shared / "left", UID, UID)
    assert watch.since(watch.mark(), UID, str(tmp_path / "own")) == [str(shared / "left")]
