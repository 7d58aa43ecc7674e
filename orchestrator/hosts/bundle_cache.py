"""The controller's local bundle cache: what a replay prunes from it, and what ``crosshost cache
prune`` empties. Nothing is removed through a cache directory that is a symbolic link."""

from __future__ import annotations

import os
import time
from pathlib import Path

from orchestrator.errors import InputError

#: the local bundle cache keeps what was used within this many days, and at most this many bytes
LOCAL_CACHE_MAX_AGE_S = 30 * 86_400
LOCAL_CACHE_MAX_BYTES = 1 << 30


def prune_local_cache(
    cache: Path,
    *,
    keep: frozenset[Path] = frozenset(),
    max_bytes: int = LOCAL_CACHE_MAX_BYTES,
    max_age_s: float = LOCAL_CACHE_MAX_AGE_S,
) -> list[Path]:
    """Remove cache files unused for ``max_age_s``, then the least recently used until the cache holds
    at most ``max_bytes``; never a file in ``keep`` (the bundle this replay uses). Returns the removed."""
    if cache.is_symlink():
        return []  # a cache that is a link may lead anywhere: nothing is removed through it
    try:
        files = [(e.stat(follow_symlinks=False).st_mtime, e.stat(follow_symlinks=False).st_size, Path(e.path))
                 for e in os.scandir(cache) if e.is_file(follow_symlinks=False)]
    except OSError:
        return []
    files.sort()  # oldest first
    total = sum(size for _, size, _ in files)
    cutoff = time.time() - max_age_s
    removed: list[Path] = []
    for mtime, size, path in files:
        if path in keep or (mtime >= cutoff and total <= max_bytes):
            continue
        try:
            path.unlink()
        except OSError:
            continue
        total -= size
        removed.append(path)
    return removed


def empty_local_cache(cache: Path) -> tuple[int, int]:
    """``crosshost cache prune``: remove every file of the local cache; (files, bytes) removed. A cache
    directory that is a symlink is refused: it may lead out of the cache, and nothing is removed
    through it."""
    count = size = 0
    if cache.is_symlink():
        raise InputError(f"{cache}: the bundle cache is a symbolic link (to {cache.resolve()}); remove the link "
                         "and rerun (crosshost removes nothing through a link)")
    try:
        entries = list(os.scandir(cache))
    except FileNotFoundError:
        return 0, 0
    except OSError as exc:
        raise InputError(f"{cache}: cannot read the bundle cache ({exc.strerror or exc})") from exc
    for entry in entries:
        if entry.is_file(follow_symlinks=False):
            n = entry.stat(follow_symlinks=False).st_size
            try:
                os.unlink(entry.path)
            except OSError as exc:
                raise InputError(f"{entry.path}: cannot remove it ({exc.strerror or exc})") from exc
            count, size = count + 1, size + n
    return count, size
