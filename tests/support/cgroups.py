"""A memory-limited cgroup for a test's child process, so the kernel's OOM killer can be met for real
without starving the machine (cgroup v2 ``memory.max`` or v1 ``memory.limit_in_bytes``)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _own_memory_cgroup() -> tuple[Path, str]:
    """(the directory of this process's memory cgroup, the file that caps it)."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    if (ROOT / "cgroup.controllers").exists():  # the unified hierarchy is the only one
        path = next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))
        return ROOT / path.lstrip("/"), "memory.max"
    path = next(line.split(":", 2)[2] for line in lines if ":memory:" in line)
    return ROOT / "memory" / path.lstrip("/"), "memory.limit_in_bytes"


@contextlib.contextmanager
def memory_limited(limit_bytes: int) -> Iterator[Path]:
    """A fresh cgroup capped at ``limit_bytes``: write a pid to the ``cgroup.procs`` it yields. The test
    fails with the reason when the machine offers no writable memory cgroup (never skipped)."""
    parent, cap = _own_memory_cgroup()
    group = parent / f"crosshost-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / cap).write_text(str(limit_bytes))
    except OSError as exc:
        raise AssertionError(f"this test needs a writable memory cgroup under {parent}: {exc}") from exc
    try:
        yield group / "cgroup.procs"
    finally:
        for _ in range(50):  # its processes are gone a moment after they were reaped
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def join(procs: Path) -> None:
    """In a child before exec: move this process into the cgroup whose ``cgroup.procs`` is ``procs``."""
    procs.write_text(str(os.getpid()))
