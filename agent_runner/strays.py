"""Files an attempt left outside its workspace, found by the attempt's uid without walking the host.

An attempt runs as a uid of its own (``pidns+uid``) with no supplementary group, so the only places it
can create a file are directories anyone may write (``/tmp``, ``/var/tmp``, ``/dev/shm`` and any
world-writable directory below them or below the runner's HOME, within ``DEPTH`` levels) and
directories it made itself (which are then strays already). The run walks those roots once, when it
starts, to find the world-writable directories (``StrayWatch``); each attempt then only looks again in
the ones in which an entry was made or moved since it started, as the kernel tells it (inotify,
``_Changes``), or where it cannot, whose modification time moved (``Mark``). So its cost follows what
changed, not how much the host's ``/tmp`` holds or how many attempts came before.

What the whole-tree walk found and this does not: a file of the uid in a directory it can neither
write nor enter (only root could have put it there), and a world-writable directory that someone
else makes during the run inside a directory the attempt cannot write. Standard library only.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import stat
import struct
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

#: where an attempt's stray files are looked for (besides the runner's HOME), and how deep
STRAY_ROOTS = ("/tmp", "/var/tmp", "/dev/shm")
DEPTH = 4
#: entries looked at when the run starts: a host whose /tmp holds millions is looked at in part (the
#: directories nearest each root first)
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
    """The watched directories as they were when an attempt started: their inodes and times, or
    (``seq``) how far the kernel's notices of changes had been read."""

    def __init__(self, watch: "StrayWatch", at_ns: int, sigs: Dict[str, _Sig], seq: int = -1) -> None:
        self.watch = watch
        self.at_ns = at_ns
        self.sigs = sigs
        self.seq = seq


#: the kernel says which watched directories changed (inotify) where it can; off: every directory's
#: inode and times are looked at again after each attempt
USE_INOTIFY = True
_IN_MOVED_TO, _IN_CREATE, _IN_DELETE_SELF, _IN_MOVE_SELF = 0x80, 0x100, 0x400, 0x800
_IN_Q_OVERFLOW, _IN_IGNORED, _IN_ONLYDIR = 0x4000, 0x8000, 0x01000000
_IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, length of the name that follows


class _Changes:
    """Which watched directories had an entry made or moved in, as the kernel tells it (inotify),
    numbered by when this process read it: a directory changed after a mark when its number is
    larger than the mark's. Its watch follows the directory's inode: a directory deleted or moved
    away is looked in at its path again (and watched again) until something is there."""

    _MASK = _IN_CREATE | _IN_MOVED_TO | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.fd = fd
        self.seq = 0
        self._wds: Dict[int, Set[str]] = {}  # one inode may be watched under two paths
        self._changed: Dict[str, int] = {}  # directory -> the number of its last change
        self._overflow = -1  # the number of the last lost notices: every directory changed then
        self.lost: Set[str] = set()  # directories whose watch ended: looked in at every ``since``

    def watch(self, path: str) -> bool:
        """Watch ``path`` from now on; it counts as changed now (what it holds was never told)."""
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), self._MASK)
        self.seq += 1
        self._changed[path] = self.seq
        if wd < 0:
            self.lost.add(path)  # looked in at every ``since`` until it can be watched
            return False
        self._wds.setdefault(wd, set()).add(path)
        self.lost.discard(path)
        return True

    def read(self) -> int:
        """Take in every notice queued so far; the number a mark taken now has."""
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return self.seq
            if not data:
                return self.seq
            self.seq += 1
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                if mask & _IN_Q_OVERFLOW:
                    self._overflow = self.seq
                paths = self._wds.get(wd, ())
                for path in paths:
                    self._changed[path] = self.seq
                if paths and mask & (_IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED):
                    # the inode is gone or elsewhere: its paths are looked in, and watched again, at once
                    del self._wds[wd]
                    if not mask & _IN_IGNORED:
                        self._libc.inotify_rm_watch(self.fd, wd)
                    self.lost.update(paths)

    def since(self, path: str, seq: int) -> bool:
        """Whether ``path`` may have changed after the mark numbered ``seq``."""
        return self._changed.get(path, 0) > seq or self._overflow > seq or path in self.lost

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        if sys.is_finalizing():  # the process's exit closes it without waiting (see ``keep_until_exit``)
            return
        with contextlib.suppress(OSError, AttributeError):
            self.close()


def walk_beside(home: Optional[str]) -> Callable[[], "StrayWatch"]:
    """``StrayWatch(home)`` on a thread of its own, started now: it waits on the file system while the
    run goes on. Returns what waits for it (raising what it raised)."""
    got: List[StrayWatch] = []
    failed: List[BaseException] = []

    def walk() -> None:
        try:
            got.append(StrayWatch(home))
        except BaseException as exc:  # noqa: B036 (raised again by ``result``)
            failed.append(exc)

    thread = threading.Thread(target=walk, name="strays", daemon=True)
    thread.start()

    def result() -> StrayWatch:
        thread.join()
        if failed:
            raise failed[0]
        return got[0]

    return result


#: the last run's watch (``keep_until_exit``)
_kept: Optional["StrayWatch"] = None


def keep_until_exit(watch: Optional["StrayWatch"]) -> None:
    """Keep ``watch`` (its inotify descriptor) open until the next run keeps its own or the process
    ends: closing an inotify descriptor waits for the kernel (10-15 ms at the end of every run), the
    process's exit does not."""
    global _kept
    _kept = watch


class StrayWatch:
    """The world-writable directories under the stray roots (one walk, when the run starts)."""

    def __init__(self, home: Optional[str] = None, roots: Sequence[str] = STRAY_ROOTS) -> None:
        self._lock = threading.Lock()
        self.depth: Dict[str, int] = {}  # watched directory -> its depth below its root
        self._latest: Optional[Mark] = None  # the last look at every watched directory (``since``)
        self._changes: Optional[_Changes] = None
        self._tried_changes = False
        self._start = -1
        seen = 0
        for top in [*roots, *([home] if home else [])]:
            try:
                st = os.stat(top)  # a root may itself be a link (/tmp -> private/tmp)
            except OSError:
                continue
            if _others_may(st, stat.S_IWOTH):
                self.depth.setdefault(top, 0)
            # breadth first: where a root holds more than MAX_ENTRIES, what is left unlooked at is its
            # deepest part, never a shallow world-writable directory beside a crowded tree
            queue = collections.deque([(top, 0)])
            while queue and seen <= MAX_ENTRIES:
                directory, depth = queue.popleft()
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
                            queue.append((entry.path, below))
        self._start = 0  # the notices' number when the walk ended: the first mark's
        with self._lock:
            self._notices()  # from the end of the walk: a directory changed before the first attempt counts

    def _notices(self) -> Optional[_Changes]:
        """The kernel's notices of changes to every watched directory (under the lock), made at the
        run's first mark; None where they cannot be had (not Linux, no inotify instance or watch
        left for this user), and every directory is looked at again after each attempt."""
        if not self._tried_changes:
            self._tried_changes = True
            if USE_INOTIFY and sys.platform.startswith("linux"):
                try:
                    changes = _Changes()
                except (OSError, AttributeError):
                    return None
                # a directory that cannot be watched (no watch left for this user) turns them off;
                # one that is not there is looked for at every ``since``
                if all(changes.watch(d) or not os.path.isdir(d) for d in self.depth):
                    self._changes = changes
                    self._start = changes.seq
                else:
                    changes.close()
        return self._changes

    def close_beside(self) -> Optional[threading.Thread]:
        """The run's last attempt was looked at: close the kernel's notices on a thread of its own,
        started now (closing an inotify descriptor waits 10-15 ms for the kernel; beside the run's end
        that wait no longer delays the process's exit). A mark or ``since`` after it looks at every
        directory. Returns the thread (None: there was no descriptor)."""
        with self._lock:
            changes, self._changes = self._changes, None
            self._tried_changes = True
        if changes is None:
            return None
        thread = threading.Thread(target=changes.close, name="strays-close", daemon=True)
        thread.start()
        return thread

    def mark(self) -> Mark:
        """Before an attempt starts: how far the kernel's notices of changes have been read; where
        there are none, every watched directory's inode and times. The last ``since`` of the run
        looked at every one of them already: its look is the mark (taken before this attempt started,
        it can only make ``since`` look in more directories, never in fewer), and only the run's
        first attempt looks itself."""
        with self._lock:
            changes = self._notices()
            if changes is not None:
                seq = changes.read()
                if self._start >= 0:  # the run's first: what changed since the walk is looked at
                    seq, self._start = self._start, -1
                return Mark(self, time.time_ns(), {}, seq)
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
            changes = self._changes if mark.seq >= 0 else None
            if changes is not None:
                changes.read()
                for path in list(changes.lost):  # looked in below; watched again where it is back
                    changes.watch(path)
                todo = [(d, depth) for d, depth in self.depth.items() if changes.since(d, mark.seq)]
            else:
                todo = list(self.depth.items())
        at = time.time_ns()
        seen: Dict[str, _Sig] = {}
        for directory, depth in todo:  # in the roots' order: a file seen twice is named as under the first
            if changes is None:
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
                            if new and self._changes is not None:
                                self._changes.watch(entry.path)  # no watch left: looked in every time
                        if new:
                            todo.append((entry.path, depth + 1))
        if changes is None:
            with self._lock:  # the next attempt's mark (the latest look wins)
                if self._latest is None or at > self._latest.at_ns:
                    self._latest = Mark(self, at, seen)
        found = [p for p in found if not p.startswith(own + "/")]
        return sorted(p for p in found if not any(p.startswith(f + "/") for f in found))  # top-most only
