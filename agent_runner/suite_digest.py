"""The suite's integrity during a run: its parts' digests (a task's own directory, everything else
shared), read once and again, part by part, before the attempts that run from them
(``Runner.bundle_check``); and whether only root or the runner may change it (``suite_sealed``).

Standard library only, Python 3.9.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple

from .errors import RunnerError


class BundleChanged(RunnerError):
    """The suite's files changed after the run started."""


#: The parts a suite's integrity is checked in: ``tasks/<name>`` (a task's own directory) for every
#: entry of ``tasks/``, and ``SHARED_PART`` for everything else (suite.json, agent/, ...).
SHARED_PART = ""
_TASKS = "tasks"
EMPTY_DIGEST = hashlib.sha256().hexdigest()


def task_part(task_id: str) -> str:
    return f"{_TASKS}/{task_id}"


def _feed(h: Any, rel: str, path: str, st: os.stat_result) -> None:
    """One path of a suite into a digest: its name, mode and content (a link: its target)."""
    h.update(f"{rel}\0{st.st_mode}\0".encode())
    if stat.S_ISREG(st.st_mode):
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    elif stat.S_ISLNK(st.st_mode):
        h.update(os.readlink(path).encode())


def _walk(root: str, top: str, shared_only: bool) -> Iterator[Tuple[str, str, os.stat_result]]:
    """(relative path, path, lstat) of everything under ``top``, top-down in sorted order; with
    ``shared_only``, nothing inside ``root/tasks/``."""
    for base, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(base, name)
            yield os.path.relpath(path, root), path, os.lstat(path)
        if shared_only and base == root and _TASKS in dirs:
            dirs.remove(_TASKS)  # not even listed: its entries are the tasks' own parts


def part_digests(root: Path) -> Dict[str, str]:
    """The digest of every part of the suite at ``root`` (see ``SHARED_PART``), in one walk."""
    hashes: Dict[str, Any] = {SHARED_PART: hashlib.sha256()}
    for rel, path, st in _walk(str(root), str(root), shared_only=False):
        first, _, rest = rel.partition("/")
        part = task_part(rest.split("/", 1)[0]) if first == _TASKS and rest else SHARED_PART
        _feed(hashes.setdefault(part, hashlib.sha256()), rel, path, st)
    return {part: h.hexdigest() for part, h in hashes.items()}


def _only_ours(st: os.stat_result, me: int, sticky_ok: bool = False) -> bool:
    """Only root or ``me`` may change it: owned by one of them, writable by neither its group nor
    others (a link's own mode means nothing: its target is never followed; with ``sticky_ok``, a
    sticky directory anyone may write, whose entries only their owners may rename or remove)."""
    if st.st_uid not in (0, me):
        return False
    if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o022:
        return True
    return sticky_ok and stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_ISVTX)


def suite_sealed(root: Path) -> bool:
    """Whether only root or this process's user may change the suite: every path in it, the directory
    itself, and every directory above it (there a sticky one anyone may write will do: only an entry's
    owner may move it). Its paths' modes and owners only: no file is read."""
    me = os.geteuid()
    named, real = Path(os.path.abspath(str(root))), Path(os.path.realpath(str(root)))
    try:  # the directory as named (a link?) and as it is, and every directory above either
        if not (_only_ours(os.lstat(named), me) and _only_ours(os.stat(real), me) and all(
                _only_ours(os.stat(above), me, sticky_ok=True) for above in {*named.parents, *real.parents})):
            return False
        return _all_ours(str(root), me)
    except OSError:
        return False


def _all_ours(top: str, me: int) -> bool:
    """Every path under ``top`` is ``_only_ours`` (never through a link)."""
    with os.scandir(top) as entries:
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            if not _only_ours(st, me) or (stat.S_ISDIR(st.st_mode) and not _all_ours(entry.path, me)):
                return False
    return True


def part_digest(root: Path, part: str) -> str:
    """The digest of one part as ``part_digests`` makes it, reading only that part."""
    h = hashlib.sha256()
    if part == SHARED_PART:
        for rel, path, st in _walk(str(root), str(root), shared_only=True):
            _feed(h, rel, path, st)
        return h.hexdigest()
    top = os.path.join(str(root), part)
    try:
        st = os.lstat(top)
    except OSError:
        return EMPTY_DIGEST  # the part is gone (or never was): the same as a part with nothing in it
    _feed(h, part, top, st)
    if stat.S_ISDIR(st.st_mode):  # never through a link: the walk of the whole suite does not follow one
        for rel, path, entry in _walk(str(root), top, shared_only=False):
            _feed(h, rel, path, entry)
    return h.hexdigest()
