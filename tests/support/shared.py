"""What a test host or an attempt's own uid runs, staged where every host and every uid can read it.

The sshd test hosts (tools/testhosts.py) have their own /tmp, /root and /opt; /usr and /var/tmp are
this machine's. An attempt on the local host runs as a uid of its own, which cannot pass a checkout
under /root. So a test never hands a host a path inside the checkout (a clone may be anywhere): it
stages a world-readable copy under /var/tmp, named by its content, so clones of one version and
parallel test workers share one copy and a changed file is a new one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

#: shared by the test hosts (their /tmp, /root and /opt are their own) and passable by every uid
SHARED = Path("/var/tmp")
#: the interpreter the SDK venv is made from: under /usr, which the test hosts share
SYSTEM_PYTHON = "/usr/bin/python3"


def _digest(files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for path in files:
        h.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            h.update(hashlib.file_digest(f, "sha256").digest())
    return h.hexdigest()[:16]


def _publish(name: str, build: Callable[[Path], None]) -> Path:
    """``SHARED/name``, built by ``build`` into a private directory and renamed into place once whole;
    a copy another process published first is used as it is (only ever whole)."""
    target = SHARED / name
    if not target.is_dir():
        building = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=SHARED))
        try:
            build(building)
            building.chmod(0o755)
            os.rename(building, target)
        except OSError:
            if not target.is_dir():
                raise
        finally:
            shutil.rmtree(building, ignore_errors=True)
    # /var/tmp is writable by every uid: a copy someone else placed there is not ours to run
    info = target.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        pytest.fail(f"{target} is not a directory of this uid writable only by it: remove it and rerun",
                    pytrace=False)
    return target


def stage(name: str, files: Sequence[Path]) -> Path:
    """A world-readable copy of ``files`` (their modes kept, made readable by all) in a directory of
    its own under /var/tmp, named ``crosshost-<name>-<digest of the files>``; returns that directory."""

    def build(into: Path) -> None:
        for path in files:
            copy = into / path.name
            shutil.copyfile(path, copy)
            copy.chmod(0o755 if os.access(path, os.X_OK) else 0o644)

    return _publish(f"crosshost-{name}-{_digest(files)}", build)


def sdk_venv(packages: Sequence[str]) -> Path:
    """The interpreter of a venv under /var/tmp holding ``packages`` from the package registry, made
    once from the system Python (the dev venv's interpreter may live where no test host can see it)."""
    tag = hashlib.sha256(" ".join((SYSTEM_PYTHON, *packages)).encode()).hexdigest()[:12]

    def build(into: Path) -> None:
        # umask 022: every uid reads what pip writes, whatever this process's umask
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(into)], check=True, umask=0o022)
        subprocess.run([str(into / "bin" / "pip"), "install", "-q", *packages], check=True, umask=0o022)

    # a venv moved once keeps a working bin/python (only that is used)
    return _publish(f"crosshost-sdk-agents-{tag}", build) / "bin" / "python"
