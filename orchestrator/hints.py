"""Commands crosshost suggests, complete: pasted as printed they act on the same files.

A hint names the inventory (``-i``), the suite and the runs directory the user's command used, as
that command got them, so ``crosshost hosts --accept-new`` never trusts keys into another inventory's
known_hosts and ``history --rebuild`` rebuilds the index it was talking about.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from orchestrator.errors import HostKeyUnknown, one_line


def command(*words: str | Path) -> str:
    """``crosshost`` and ``words``, quoted for a POSIX shell."""
    return shlex.join(["crosshost", *(str(w) for w in words)])


def inventory_words(inventory: Path) -> list[str]:
    """``-i INVENTORY``, always: the default depends on the directory the hint is pasted in."""
    return ["-i", str(inventory)]


def out_words(out: Path) -> list[str]:
    """``--out RUNS``, always, for the same reason."""
    return ["--out", str(out)]


def host_error_line(exc: BaseException, rerun: Sequence[str | Path]) -> str:
    """One line for a host's error; an unknown host key gets the command to trust it on first use:
    ``rerun`` (the user's command, without ``crosshost``) with ``--accept-new``."""
    line = one_line(exc)
    if isinstance(exc, HostKeyUnknown):
        line += f"; to trust it on first use: {command(*rerun, '--accept-new')}"
    return line
