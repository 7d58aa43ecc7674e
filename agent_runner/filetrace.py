"""File-access evidence: the paths outside an attempt's own directories that its processes touched.

With ``run --trace-files`` every process of an attempt (the command or exec agent, each tool process,
the predicate) runs under ``strace -f -e trace=file,process`` when the host has strace in its system directories; the
absolute paths they opened, stat'ed, listed or executed are kept, except the attempt's own
workspace, HOME, TMPDIR and scratch, the suite and the runner's own files, and the kernel's pseudo
file systems. The result is ``files/<task>.<attempt>.json``: ``{"traced": true, "paths": {path:
[syscalls]}, "agent_paths": {...}, "env_path": PATH}`` (``paths``: the predicate's; ``agent_paths``: the
agent's and its tools'; ``env_path``: the attempt's PATH, None when it looks like it holds a secret),
or ``{"traced": false, "why": ..., "env_path": ...}`` when strace is not there (the evidence is then
absent, not guessed). Past ``MAX_PATHS`` a side keeps the paths outside any interpreter's or library's
own tree first (``library_path``: an agent's imports alone fill hundreds), and ``cut`` says, per side,
how many were dropped and under which directories (``{"agent": {"dropped": 812, "under": {...}}}``).
Standard library only, Python 3.9.
"""

import itertools
import json
import re
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from .digests import write_announced
from .records import EvidenceCut, FileEvidence
from .redact import redact_text
from .sandbox import system_tool

#: paths kept per attempt and side (predicate, agent), the first ones in the order they were touched:
#: an interpreter's start alone names some hundreds
MAX_PATHS = 1000
_PSEUDO = ("/proc/", "/sys/", "/dev/")
# an interpreter's or a package manager's own tree: what starting an agent reads on every host alike
_LIBRARY = re.compile(r"/(site-packages|dist-packages|node_modules|__pycache__)(/|$)|/lib/python\d[^/]*(/|$)"
                      r"|^/usr/(lib|lib64|share|local/lib)/|^/(lib|lib64)/")
# `1234  openat(AT_FDCWD, "/opt/x", O_RDONLY) = -1 ENOENT (...)`: the syscall and its first path argument
_CALL = re.compile(r'^(?:\[pid\s+)?\d*\]?\s*(\w+)\((?:[A-Z_]+, )?"((?:[^"\\]|\\.)*)"')


def strace_path() -> Optional[str]:
    """strace from the system's directories (it runs as the runner, never from the attempts' PATH)."""
    return system_tool("strace")


def traced_argv(strace: str, log: Path, argv: Sequence[str]) -> List[str]:
    """``argv`` under strace, following children, file and process calls only, into ``log``."""
    return [strace, "-f", "-qq", "-e", "trace=file,process", "-o", str(log), *argv]


def _unescape(text: str) -> str:
    try:
        return text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except (UnicodeDecodeError, UnicodeEncodeError):
        return text


def library_path(path: str) -> bool:
    """Whether ``path`` lies in an interpreter's or a library's own tree (ranked last, dropped first)."""
    return _LIBRARY.search(path) is not None


def touched_paths(log_text: str, own: Sequence[str], cut: Optional[EvidenceCut] = None) -> Dict[str, List[str]]:
    """path -> the syscalls that named it, for absolute paths outside ``own`` (and not a parent of one of
    them) and the pseudo file systems; at most ``MAX_PATHS``, library paths dropped first. ``cut``
    (when given) gets ``dropped`` and ``under`` (top directories -> paths dropped) when any was."""
    prefixes = [p.rstrip("/") + "/" for p in own if p]
    found: Dict[str, List[str]] = {}
    for line in log_text.splitlines():
        match = _CALL.match(line.strip())
        if match is None:
            continue
        call, path = match.group(1), _unescape(match.group(2))
        if not path.startswith("/") or path.startswith(_PSEUDO):
            continue
        path = path.rstrip("/") or "/"  # "dir/" and "dir" are one path
        if redact_text(path) != path:  # a credential-shaped name never leaves the host
            continue
        # under its own directories, or on the way to them (their parents differ as the roots do)
        if any((path + "/").startswith(p) or p.startswith(path.rstrip("/") + "/") for p in prefixes):
            continue
        calls = found.setdefault(path, [])
        if call not in calls:
            calls.append(call)
    if len(found) <= MAX_PATHS:
        return found
    order = sorted(found, key=library_path)  # stable: the others first, each in the order touched
    kept, dropped = order[:MAX_PATHS], order[MAX_PATHS:]
    if cut is not None:
        under: Dict[str, int] = {}
        for path in dropped:
            top = "/".join(path.split("/")[:3]) or "/"
            under[top] = under.get(top, 0) + 1
        cut.dropped, cut.under = len(dropped), under
    return {path: found[path] for path in kept}


class Tracer:
    """Hands out traced command lines, one log each under ``logs``, and reads them back per side."""

    def __init__(self, strace: str, logs: Path) -> None:
        self.strace = strace
        self.logs = logs
        self._count = itertools.count()
        self._given: Dict[str, List[Path]] = {}

    def wrap(self, side: str) -> Callable[[List[str]], List[str]]:
        def traced(argv: List[str]) -> List[str]:
            log = self.logs / f"{side}.{next(self._count)}.strace"
            self._given.setdefault(side, []).append(log)
            return traced_argv(self.strace, log, argv)

        return traced

    def paths(self, side: str, own: Sequence[str], cut: Optional[EvidenceCut] = None) -> Dict[str, List[str]]:
        """What ``side``'s processes touched, in the order they ran (``cut``: what was dropped). A command
        line that never started left no log; OSError when none of ``side``'s did (strace itself could
        not run)."""
        texts: List[str] = []
        error: Optional[OSError] = None
        for log in self._given.get(side, []):
            try:
                texts.append(log.read_text("utf-8", "replace"))
            except OSError as exc:
                error = exc
        if error is not None and not texts:
            raise error
        return touched_paths("".join(texts), own, cut)


def shown_path(env_path: str) -> Optional[str]:
    """The attempt's PATH as the evidence keeps it: None when redaction would change it."""
    return env_path if redact_text(env_path) == env_path else None


def write_evidence(
    target: Path,
    *,
    traced: bool,
    paths: Optional[Dict[str, List[str]]] = None,
    agent_paths: Optional[Dict[str, List[str]]] = None,
    why: str = "",
    env_path: Optional[str] = None,
    cut: Optional[Dict[str, EvidenceCut]] = None,
) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    record = FileEvidence(traced=traced, paths=paths or {}, agent_paths=agent_paths or {}, why=why,
                          env_path=env_path, cut=cut or {})
    # out/files/<task>.<attempt>.json: announced like every file the runner writes in out/
    write_announced(target.parent.parent, target, json.dumps(record.to_json(), sort_keys=True) + "\n")
