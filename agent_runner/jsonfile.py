"""Read JSON input, bounded: naming the file and what is wrong in the one error a user sees.

``loads`` is ``json.loads`` with a nesting bound: a document nested deeper than ``MAX_DEPTH`` is a
``json.JSONDecodeError`` like any other damage (never a ``RecursionError`` that would crash a
command, or nest so deep a later step crashes on it). Every reader of suite, run-directory, trace
and fingerprint JSON goes through it.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, Type

from .errors import InputError

#: the largest input file read whole (a suite file, a contract, a fingerprint): 64 MiB
MAX_FILE_BYTES = 64 * 1024 * 1024
#: deeper than any record crosshost writes or a suite needs; far below the interpreter's recursion limit
MAX_DEPTH = 100


def _too_deep(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, (dict, list)))
    return False


def loads(text: "str | bytes") -> Any:
    """``json.loads``, and a JSONDecodeError (a ValueError) for a document nested deeper than ``MAX_DEPTH``."""
    doc = text if isinstance(text, str) else text.decode("utf-8")
    try:
        value = json.loads(doc)
    except RecursionError:
        raise json.JSONDecodeError(f"nested more than {MAX_DEPTH} levels deep", doc, 0) from None
    if (doc.count("[") + doc.count("{") > MAX_DEPTH) and _too_deep(value):
        raise json.JSONDecodeError(f"nested more than {MAX_DEPTH} levels deep", doc, 0)
    return value


def read_regular(
    path: "str | os.PathLike[str]", *, follow_links: bool = True, limit: int = MAX_FILE_BYTES
) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes. A FIFO, a device or a directory is
    refused before a byte is read (a FIFO would hang, /dev/zero would fill memory), and so is a
    symbolic link unless ``follow_links``; each as an OSError whose strerror says why."""
    name = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow_links else getattr(os, "O_NOFOLLOW", 0))
    if not follow_links and os.path.islink(name):
        raise OSError(0, "a symbolic link (refused: not read)", name)
    fd = os.open(name, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(0, "not a regular file (refused: not read)", name)
        if info.st_size > limit:
            raise OSError(0, f"larger than {limit} bytes (refused: not read)", name)
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise OSError(0, f"larger than {limit} bytes (refused)", name)
        return data
    finally:
        os.close(fd)


def decode_text(data: bytes) -> str:
    """UTF-8 text, a leading byte-order mark dropped (an editor's, not content)."""
    return data.decode("utf-8-sig")


def read_json(path: "str | os.PathLike[str]", what: str, error: Type[InputError] = InputError) -> Any:
    """The parsed content of ``path``; ``error`` (exit 2) when it cannot be read or is not JSON."""
    name = os.fspath(path)
    try:
        return loads(decode_text(read_regular(name)))
    except OSError as exc:
        raise error(f"{name}: cannot read {what}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise error(f"{name}: cannot read {what}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except ValueError as exc:
        raise error(f"{name}: not valid JSON: {exc}") from exc
