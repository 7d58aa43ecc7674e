"""Build the runner zipapp reproducibly: sorted entries, fixed timestamps and permissions, stored
(uncompressed, so no zlib version can change a byte), named by its own sha256."""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import zipfile
from pathlib import Path

import agent_runner
from orchestrator.hosts.runner_boot import SOURCES

RUNNER_PACKAGE = Path(agent_runner.__file__).resolve().parent
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)
_SHEBANG = b"#!/usr/bin/env python3\n"
#: the zipapp's ``__main__.py``: runs the runner, from bytecode an earlier run kept where that is safe
_BOOT = Path(__file__).with_name("runner_boot.py").read_bytes()


def _entry(name: str, data: bytes) -> tuple[zipfile.ZipInfo, bytes]:
    info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = (0o100644 & 0xFFFF) << 16
    info.create_system = 3  # unix, whatever machine builds it
    return info, data


def runner_zipapp_bytes(package_dir: Path = RUNNER_PACKAGE) -> bytes:
    """The zipapp's bytes: ``__main__.py``, the list of the runner's sources (``SOURCES``, one file name
    a line, what ``__main__.py`` checks a compiled copy against) and every ``agent_runner/*.py``, in
    name order."""
    sources = sorted(package_dir.glob("*.py"), key=lambda p: p.name)
    entries = [_entry("__main__.py", _BOOT), _entry(SOURCES, "".join(f"{p.name}\n" for p in sources).encode())]
    for path in sources:
        entries.append(_entry(f"agent_runner/{path.name}", path.read_bytes()))
    buffer = io.BytesIO()
    buffer.write(_SHEBANG)
    with zipfile.ZipFile(buffer, "w") as archive:
        for info, data in entries:
            archive.writestr(info, data)
    return buffer.getvalue()


def build_runner_zipapp(out_dir: Path) -> Path:
    """Write ``runner-<sha256>.pyz`` into ``out_dir`` (atomically) and return its path."""
    data = runner_zipapp_bytes()
    digest = hashlib.sha256(data).hexdigest()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"runner-{digest}.pyz"
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == digest:
        return target
    fd, tmp = tempfile.mkstemp(prefix=".runner-", suffix=".pyz", dir=out_dir)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
