"""File-access evidence: the paths outside an attempt's own directories that its predicate touched.

With ``run --trace-files`` the predicate runs under ``strace -f -e trace=file,process`` when strace is
on this host's PATH; the absolute paths it opened, stat'ed, listed or executed are kept, except the
attempt's own workspace, HOME, TMPDIR and scratch and the kernel's pseudo file systems. The result is
``files/<task>.<attempt>.json``: ``{"traced": true, "paths": {path: [syscalls]}}``, or
``{"traced": false, "why": ...}`` when strace is not there (the evidence is then absent, not guessed).
Standard library only, Python 3.9.
"""

import json
import re
import shutil
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .digests import write_announced

MAX_PATHS = 300  # paths kept per attempt (the first ones, in the order the predicate touched them)
_PSEUDO = ("/proc/", "/sys/", "/dev/")
# `1234  openat(AT_FDCWD, "/opt/x", O_RDONLY) = -1 ENOENT (...)`: the syscall and its first path argument
_CALL = re.compile(r'^(?:\[pid\s+)?\d*\]?\s*(\w+)\((?:[A-Z_]+, )?"((?:[^"\\]|\\.)*)"')


def strace_path() -> Optional[str]:
    return shutil.which("strace")


def traced_argv(strace: str, log: Path, argv: Sequence[str]) -> List[str]:
    """``argv`` under strace, following children, file and process calls only, into ``log``."""
    return [strace, "-f", "-qq", "-e", "trace=file,process", "-o", str(log), *argv]


def _unescape(text: str) -> str:
    try:
        return text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except (UnicodeDecodeError, UnicodeEncodeError):
        return text


def touched_paths(log_text: str, own: Sequence[str]) -> Dict[str, List[str]]:
    """path -> the syscalls that named it, for absolute paths outside ``own`` and the pseudo file systems."""
    prefixes = [p.rstrip("/") + "/" for p in own if p]
    found: Dict[str, List[str]] = {}
    for line in log_text.splitlines():
        match = _CALL.match(line.strip())
        if match is None:
            continue
        call, path = match.group(1), _unescape(match.group(2))
        if not path.startswith("/") or path.startswith(_PSEUDO):
            continue
        if any((path + "/").startswith(p) for p in prefixes):
            continue
        calls = found.get(path)
        if calls is None:
            if len(found) >= MAX_PATHS:
                continue
            calls = found[path] = []
        if call not in calls:
            calls.append(call)
    return found


def write_evidence(
    target: Path, *, traced: bool, paths: Optional[Dict[str, List[str]]] = None, why: str = ""
) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    record = {"traced": traced, "paths": paths or {}} if traced else {"traced": False, "why": why}
    # out/files/<task>.<attempt>.json: announced like every file the runner writes in out/
    write_announced(target.parent.parent, target, json.dumps(record, sort_keys=True) + "\n")
