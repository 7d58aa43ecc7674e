"""A run's traces in one file of ``out/``: ``traces.stream``, appended to by the runner and split into
``traces/<task>.<attempt>.jsonl`` (and ``.obs.jsonl``) by the controller as it reads the host's archive
(``orchestrator/hosts/archive.py``). A runner started with ``--trace-stream`` writes it (crosshost
starts every runner so); a runner started by hand writes the files themselves.

Why: every attempt wrote one or two files of its own into ``out/`` on the host's disk, and the run's
removal deleted them all again. On a disk file system a new file may cost a search past the ones
removed a moment ago (ext4 without a journal looks past every inode freed in the last minutes), so a
fleet's runs slowed each other down; one file a run costs one.

The format: frames, each ``<name> <length>\\n`` and then ``length`` bytes, ``name`` a trace file's path
relative to ``out/`` (``traces/`` and a name of letters, digits, ``.``, ``_`` and ``-``). A file's bytes
are its frames' bytes in the order written. Each frame is one ``write(2)`` of a file opened for
appending (a frame that fails part of the way is taken back), so a runner killed at any point leaves
whole frames and at most a last one cut short, which is read as far as it goes; the file's digest
line (``digests.py``) is still what says it was complete. Standard library only, Python 3.9.
"""

from __future__ import annotations

import errno
import os
import re
import threading
from pathlib import Path
from typing import IO, Iterator, Optional, Tuple

#: the stream's name in ``out/``
STREAM = "traces.stream"
#: the names a frame may carry: a file of ``traces/``, never a path that leaves it
NAME = re.compile(rb"traces/[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
#: a header is the name, a space, the length and the newline: anything longer is not one
_MAX_HEADER = 8 + 200 + 1 + 20 + 1


class StreamError(ValueError):
    """A stream whose frames cannot be read: a header that is not one, or a name outside ``traces/``."""


class TraceStream:
    """``out/traces.stream``, open for appending while the run lasts; safe to share between slots."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o666)
        self._lock = threading.Lock()
        #: a frame that failed part of the way could not be taken back: nothing more is appended
        self._broken: Optional[OSError] = None

    def write(self, name: str, data: bytes) -> None:
        """Append one frame of ``name`` (a path relative to ``out/``, see ``check_name``) holding
        ``data``. A frame that cannot be written whole is taken back (the stream ends where it
        ended before) and its ``OSError`` raised: no later frame lands inside a cut one."""
        check_name(name)
        view = memoryview(f"{name} {len(data)}\n".encode("ascii") + data)
        with self._lock:  # one write a frame: no other slot's frame lands inside it
            if self._fd < 0 or self._broken is not None:
                raise self._broken or OSError(errno.EBADF, f"{self.path}: closed")
            end = os.fstat(self._fd).st_size
            try:
                while view:
                    view = view[os.write(self._fd, view):]
            except OSError:
                try:
                    os.ftruncate(self._fd, end)
                except OSError as cut:
                    self._broken = cut  # the file ends inside this frame: a cut frame, as a kill leaves
                raise

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def check_name(name: str) -> None:
    """Raise ``StreamError`` unless ``name`` is one a frame may carry (``NAME``)."""
    if not NAME.fullmatch(name.encode("utf-8", "replace")):
        raise StreamError(f"{name!r}: not a name a trace stream carries")


def frames(src: IO[bytes], chunk: int = 1 << 20) -> Iterator[Tuple[str, bytes]]:
    """``(name, bytes)`` for each frame of the stream ``src`` in order, a long frame in pieces of at
    most ``chunk`` bytes (a frame of no bytes: one piece of none). A frame cut short by the stream's end
    gives the bytes there are (a runner killed while writing it); a header cut short gives nothing.
    Raises ``StreamError`` for a header that is not one or a name outside ``traces/``."""
    while True:
        header = src.readline(_MAX_HEADER)
        if not header.endswith(b"\n"):
            if len(header) >= _MAX_HEADER:
                raise StreamError(f"a frame's header longer than {_MAX_HEADER} bytes")
            return  # the end, or a header cut short by it
        name, sep, size = header[:-1].partition(b" ")
        if not sep or not NAME.fullmatch(name) or not size.isdigit() or len(size) > 20:
            raise StreamError(f"{header[:80]!r} is not a frame's header (<name> <length>)")
        text, left = name.decode("ascii"), int(size)
        piece: Optional[bytes] = None
        while left or piece is None:
            piece = src.read(min(chunk, left)) if left else b""
            if left and not piece:
                return  # cut short: what there was has been given
            left -= len(piece)
            yield text, piece
