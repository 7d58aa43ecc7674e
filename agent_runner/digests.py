"""The runner's word on each file it wrote, sent where the attempt cannot write: its own stdout.

Every file the runner closes in ``out/`` (a trace, its observations, ``results.jsonl``,
``fingerprint.json``) is announced on the run exec's stdout as one line,
``crosshost-digest <sha256> <path relative to out/>``, the sha256 of the bytes the runner wrote (hashed
as they were written, never read back). What the attempt runs has no handle on that stream (its
output goes to pipes the runner reads), so the controller checks every pulled file against these
lines: a file changed, added or removed after the runner wrote it is found. Standard library only.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import IO, Optional

from . import paced

MARKER = "crosshost-digest"


def announce(out: Path, path: Path, sha256: str) -> None:
    """One line on stdout, written with the others of the same second (``paced``); every line is out
    when the run ends."""
    rel = Path(os.path.relpath(path, out)).as_posix()
    paced.STDOUT.line(f"{MARKER} {sha256} {rel}")


def write_announced(out: Path, path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` and announce what was written."""
    data = text.encode("utf-8")
    path.write_bytes(data)
    announce(out, path, hashlib.sha256(data).hexdigest())


class HashingWriter:
    """A text file whose written bytes are hashed as they go; ``close`` announces them."""

    def __init__(self, out: Optional[Path], path: Path) -> None:
        self.out = out
        self.path = path
        self._handle: IO[bytes] = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._sha = hashlib.sha256()
        self.closed = False

    def write(self, text: str) -> int:
        data = text.encode("utf-8")
        self._sha.update(data)
        self._handle.write(data)
        return len(text)

    def flush(self) -> None:
        self._handle.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._handle.close()
        if self.out is not None:
            announce(self.out, self.path, self._sha.hexdigest())

    def __enter__(self) -> "HashingWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
