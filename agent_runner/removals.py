"""An attempt's directory removed (``remove_tree``), beside the attempts that follow (``Removals``).

Standard library only, Python 3.9.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import stat
import threading
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

from .errors import RunnerError


def remove_tree(path: Path) -> None:
    """``path`` and everything under it, whatever modes an agent left (a read-only directory too)."""
    def retry(func: Any, target: str, exc_info: Any) -> None:
        try:  # a read-only directory an agent left behind
            os.chmod(os.path.dirname(target), stat.S_IRWXU)
            os.chmod(target, stat.S_IRWXU)
        except OSError:
            pass
        func(target)

    if path.exists():
        shutil.rmtree(path, onerror=retry)


#: file systems whose removals wait on no disk (``fingerprint.filesystem_of``'s names)
IN_MEMORY = frozenset({"tmpfs", "ramfs"})


class Removals:
    """Attempt directories removed beside the attempts that follow, on a few threads of their own.

    A removal on a disk mostly waits on it, not on the CPU: a file system that discards each block it
    frees at once (ext4 mounted ``discard`` without a journal, as on some VMs) waits milliseconds per
    directory, and an attempt has five. In memory (``beside=False``: a root runner's tmpfs, see
    ``attempt_memory``) nothing waits, and a thread beside the attempts would only take turns with them
    on the interpreter's lock, handed over at each of its system calls: dearer than the removal itself,
    so the directory is removed at once. Only a directory whose every file is its attempt's own uid's is handed
    here (``pidns+uid``): mode 700 to that uid, whose processes are all gone with its namespace, and
    the uid is given to no other attempt until the directory is gone (``done``). Every removal has
    ended before the run's leftovers are looked for (``wait``). Plain threads and a queue, not
    ``concurrent.futures``: its import (with ``logging``) was ~7 ms of every run's start."""

    WORKERS = 8

    def __init__(self, beside: bool = True) -> None:
        self.beside = beside
        self._todo: "queue.SimpleQueue[Optional[Tuple[Path, Callable[[], None]]]]" = queue.SimpleQueue()
        self._threads: List[threading.Thread] = []
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)
        self._open = 0  # handed over and not yet ended
        self._errors: List[BaseException] = []

    def remove(self, path: Path, done: Callable[[], None]) -> None:
        if not self.beside:  # in memory: nothing to wait on, so removed at once
            with self._lock:
                self._open += 1
            self._remove(path, done)
            return
        with self._lock:
            self._open += 1
            if self._open > len(self._threads) and len(self._threads) < self.WORKERS:
                thread = threading.Thread(target=self._work, name="remove", daemon=True)
                self._threads.append(thread)
                thread.start()
        self._todo.put((path, done))

    def _work(self) -> None:
        while True:
            item = self._todo.get()
            if item is None:
                return
            self._remove(*item)

    def _remove(self, path: Path, done: Callable[[], None]) -> None:
        """Remove ``path``, then ``done()``; what failed is ``wait``'s to raise. On the attempts' own
        thread (in memory) a signal's exception (Ctrl-C, the run's SIGTERM) goes on up once the removal
        is finished and accounted for: the run ends with the directory gone, as between two attempts."""
        errors: List[BaseException] = []
        try:
            remove_tree(path)
        except Exception as exc:
            errors.append(exc)
        except BaseException:
            try:  # what the signal cut short (a second signal ends this too)
                remove_tree(path)
            except Exception as exc:
                errors.append(exc)
            raise
        finally:
            try:  # its uid is free again whatever happened
                done()
            except Exception as exc:
                errors.append(exc)
            finally:
                with self._lock:
                    self._errors += errors
                    self._open -= 1
                    self._ended.notify_all()

    def wait(self) -> None:
        """Block until every removal handed over so far has ended; raise the first one's error."""
        with self._lock:
            while self._open:
                self._ended.wait()
            errors, self._errors = self._errors, []
        if errors:
            raise RunnerError(f"an attempt's directory could not be removed: {errors[0]}")

    def close(self) -> None:
        with contextlib.suppress(RunnerError):
            self.wait()
        with self._lock:
            threads, self._threads = self._threads, []
        for _ in threads:
            self._todo.put(None)
        for thread in threads:
            thread.join()
