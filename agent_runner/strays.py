"""Files an attempt left outside its workspace, found by the attempt's uid without walking the host.

An attempt runs as a uid of its own (``pidns+uid``) with no supplementary group, so the only places it
can create a file are directories anyone may write (``/tmp``, ``/var/tmp``, ``/dev/shm`` and any
world-writable directory below them or below the runner's HOME, within ``DEPTH`` levels) and
directories it made itself (which are then strays already). The run walks those roots once, when it
starts, to find the world-writable directories (``StrayWatch``); each attempt then only looks again in
the ones whose modification time moved since it started (``Mark``), so its cost follows what the
attempt changed, not how much the host's ``/tmp`` holds or how many attempts came before.

What the whole-tree walk found and this does not: a file of the uid in a directory it can neither
write nor enter (only root could have put it there), and a world-writable directory that someone
else makes during the run inside a directory the attempt cannot write. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from typing import Dict, List, Optional, Sequence, Set, Tuple

#: where an attempt's stray files are looked for (besides the runner's HOME), and how deep
STRAY_ROOTS = ("/tmp", "/var/tmp", "/dev/shm")
DEPTH = 4
#: entries looked at when the run starts: a host whose /tmp holds millions is looked at in part
MAX_ENTRIES = 20000
#: a directory changed this close to a mark may have changed again within the same clock tick of the
#: file system's timestamps: it is looked in again whatever its time says
_RACY_NS = 50_000_000

_Sig = Tuple[int, int, int]  # (inode, mtime_ns, ctime_ns)


def _sig(st: os.stat_result) -> _Sig:
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def _others_may(st: os.stat_result, bit: int) -> bool:
    return bool(st.st_mode & bit)


class Mark:
    """The watched directories as they were when an attempt started."""

    def __init__(self, watch: "StrayWatch", at_ns: int, sigs: Dict[str, _Sig]) -> None:
        self.watch = watch
        self.at_ns = at_ns
        self.sigs = sigs


class StrayWatch:
    """The world-writable directories under the stray roots (one walk, when the run starts)."""

    def __init__(self, home: Optional[str] = None, roots: Sequence[str] = STRAY_ROOTS) -> None:
        self._lock = threading.Lock()
        self.depth: Dict[str, int] = {}  # watched directory -> its depth below its root
        self._latest: Optional[Mark] = None  # the last look at every watched directory (``since``)
        seen = 0
        for top in [*roots, *([home] if home else [])]:
            try:
                st = os.stat(top)  # a root may itself be a link (/tmp -> private/tmp)
            except OSError:
                continue
            if _others_may(st, stat.S_IWOTH):
                self.depth.setdefault(top, 0)
            stack = [(top, 0)]
            while stack and seen <= MAX_ENTRIES:
                directory, depth = stack.pop()
                try:
                    with os.scandir(directory) as listing:
                        entries = list(listing)
                except OSError:
                    continue
                seen += len(entries)
                below = depth + 1
                for entry in entries:
                    # try/except, not contextlib.suppress: this loop sees every entry of the roots
                    try:
                        if not entry.is_dir(follow_symlinks=False):
                            continue
                        mode = entry.stat(follow_symlinks=False).st_mode
                    except OSError:
                        continue
                    if mode & stat.S_IXOTH:
                        if mode & stat.S_IWOTH:
                            self.depth.setdefault(entry.path, below)
                        # a directory at DEPTH is watched but never listed here: what it holds is
                        # below DEPTH (its entries are what ``since`` looks at)
                        if below < DEPTH:
                            stack.append((entry.path, below))

    def mark(self) -> Mark:
        """Before an attempt starts: the time and every watched directory's inode and times. The
        last ``since`` of the run looked at every one of them already: its look is the mark (taken
        before this attempt started, it can only make ``since`` look in more directories, never in
        fewer), and only the run's first attempt looks itself."""
        with self._lock:
            if self._latest is not None:
                return self._latest
            watched = list(self.depth)
        at = time.time_ns()
        sigs: Dict[str, _Sig] = {}
        for directory in watched:
            with contextlib.suppress(OSError):
                sigs[directory] = _sig(os.stat(directory))
        return Mark(self, at, sigs)

    def since(self, mark: Mark, uid: int, own: str) -> List[str]:
        """After the attempt: every top-most path owned by ``uid`` in a watched directory that changed
        since ``mark`` (or that may have changed within a clock tick of it), outside ``own``."""
        own = own.rstrip("/")
        found: List[str] = []
        inodes: Set[Tuple[int, int]] = set()
        with self._lock:
            todo = list(self.depth.items())
        at = time.time_ns()
        seen: Dict[str, _Sig] = {}
        for directory, depth in todo:  # in the roots' order: a file seen twice is named as under the first
            try:
                st = os.stat(directory)
            except OSError:
                continue
            seen[directory] = _sig(st)
            before = mark.sigs.get(directory)
            if before is not None and before == _sig(st) and before[1] < mark.at_ns - _RACY_NS:
                continue
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.path == own:
                        continue
                    sub = entry.stat(follow_symlinks=False)
                    if sub.st_uid == uid:
                        if (sub.st_dev, sub.st_ino) not in inodes:
                            inodes.add((sub.st_dev, sub.st_ino))  # one file seen twice (a bind mount) once
                            found.append(entry.path)
                    elif (depth < DEPTH and stat.S_ISDIR(sub.st_mode) and _others_may(sub, stat.S_IXOTH)
                          and _others_may(sub, stat.S_IWOTH)):
                        with self._lock:  # made by someone else during the run: watched from now on
                            new = entry.path not in self.depth
                            self.depth.setdefault(entry.path, depth + 1)
                        if new:
                            todo.append((entry.path, depth + 1))
        with self._lock:  # the next attempt's mark (the latest look wins)
            if self._latest is None or at > self._latest.at_ns:
                self._latest = Mark(self, at, seen)
        found = [p for p in found if not p.startswith(own + "/")]
        return sorted(p for p in found if not any(p.startswith(f + "/") for f in found))  # top-most only
