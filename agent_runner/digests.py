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
from .trace_stream import TraceStream, check_name

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
    """A text file whose written bytes are hashed as they go; ``close`` announces them. With a
    ``stream`` (``trace_stream.py``) the file is that stream's frames of its name, each ``write`` one
    frame written at once (``flush`` then has nothing left to do), and ``out`` must be given."""

    def __init__(self, out: Optional[Path], path: Path, stream: Optional[TraceStream] = None) -> None:
        self.out = out
        self.path = path
        self._stream = stream
        self._name = ""  # its name in the stream: its path relative to out/
        if stream is not None:
            if out is None:
                raise ValueError("a file of a trace stream is named relative to out/: give out")
            self._name = Path(os.path.relpath(path, out)).as_posix()
            check_name(self._name)  # before the attempt writes anything: refused whole, never half-way
        self._handle: Optional[IO[bytes]] = None if stream is not None else open(path, "wb")  # noqa: SIM115
        self._sha = hashlib.sha256()
        self._written = False
        self.closed = False

    def write(self, text: str) -> int:
        data = text.encode("utf-8")
        if self._handle is not None:
            self._handle.write(data)
        elif self._stream is not None:
            self._stream.write(self._name, data)
            self._written = True
        self._sha.update(data)  # what was written: a write that failed is not in the digest
        return len(text)

    def flush(self) -> None:
        if self._handle is not None:
            self._handle.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._handle is not None:
            self._handle.close()
        elif self._stream is not None and not self._written:
            self._stream.write(self._name, b"")  # an empty file still comes home as one
        if self.out is not None:
            announce(self.out, self.path, self._sha.hexdigest())

    def __enter__(self) -> "HashingWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
