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
from typing import IO, Any, Dict, Iterator, List, Optional, Type, Union

from .errors import InputError

#: the largest input file read whole (a suite file, a contract, a fingerprint): 64 MiB
MAX_FILE_BYTES = 64 * 1024 * 1024
#: deeper than any record crosshost writes or a suite needs; far below the interpreter's recursion limit
MAX_DEPTH = 100
#: the longest line of a JSONL file (a trace record, a results row): 16 MiB; a longer one is damage
MAX_LINE_BYTES = 16 * 1024 * 1024

#: a JSON value as parsed: a reader narrows it with isinstance before it reads a field (a body crosshost
#: forwards unchanged, a provider's answer, an agent's request: none of them is trusted to have a shape)
JSONValue = Union[None, bool, int, float, str, List["JSONValue"], Dict[str, "JSONValue"]]
#: a JSON object as parsed
JSONObject = Dict[str, JSONValue]


def str_or_none(value: Any) -> Optional[str]:
    """A field of a record read back: a string, or None when it holds another type."""
    return value if isinstance(value, str) else None


def int_or_none(value: Any) -> Optional[int]:
    """A field of a record read back: an integer (never a bool), or None when it holds another type."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def list_or_empty(value: Any) -> List[JSONValue]:
    """A field of a record read back: a list, or empty when it holds another type."""
    return value if isinstance(value, list) else []


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


def too_deep(doc: str, value: Any) -> bool:
    """Whether ``value`` (parsed from ``doc``) nests deeper than ``MAX_DEPTH``; counting brackets
    first keeps the walk off every ordinary document."""
    return doc.count("[") + doc.count("{") > MAX_DEPTH and _too_deep(value)


def loads(text: "str | bytes") -> Any:
    """``json.loads``, and a JSONDecodeError (a ValueError) for a document nested deeper than ``MAX_DEPTH``."""
    doc = text if isinstance(text, str) else text.decode("utf-8")
    try:
        value = json.loads(doc)
    except RecursionError:
        raise json.JSONDecodeError(f"nested more than {MAX_DEPTH} levels deep", doc, 0) from None
    if too_deep(doc, value):
        raise json.JSONDecodeError(f"nested more than {MAX_DEPTH} levels deep", doc, 0)
    return value


def open_regular(
    path: "str | os.PathLike[str]", *, follow_links: bool = True, limit: Optional[int] = None
) -> IO[bytes]:
    """``path`` open for reading when it is a regular file (of at most ``limit`` bytes). A FIFO, a
    device or a directory is refused before a byte is read (a FIFO would hang, /dev/zero would fill
    memory), and so is a symbolic link unless ``follow_links``; each as an OSError whose strerror says why."""
    name = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow_links else getattr(os, "O_NOFOLLOW", 0))
    if not follow_links and os.path.islink(name):
        raise OSError(0, "a symbolic link (refused: not read)", name)
    fd = os.open(name, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(0, "not a regular file (refused: not read)", name)
        if limit is not None and info.st_size > limit:
            raise OSError(0, f"larger than {limit} bytes (refused: not read)", name)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(
    path: "str | os.PathLike[str]", *, follow_links: bool = True, limit: int = MAX_FILE_BYTES
) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (``open_regular``'s refusals first)."""
    with open_regular(path, follow_links=follow_links, limit=limit) as handle:
        data = handle.read(limit + 1)  # the file may have grown since it was looked at
    if len(data) > limit:
        raise OSError(0, f"larger than {limit} bytes (refused)", os.fspath(path))
    return data


def bounded_lines(handle: IO[bytes], limit: int = MAX_LINE_BYTES) -> Iterator[Optional[bytes]]:
    """The lines of ``handle`` as bytes; a line longer than ``limit`` is yielded as None (its bytes
    skipped, never held), so one endless line costs no more memory than the limit."""
    while True:
        line = handle.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit or line.endswith(b"\n"):  # a whole line, or the last one
            yield line
            continue
        while not line.endswith(b"\n"):  # the rest of the long line
            line = handle.readline(1 << 20)
            if not line:
                break
        yield None


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
