"""Where an attempt's processes run: out of sight and reach of the runner and the controller.

Every process an attempt starts (the command agent, a shell tool, the predicate) is started through
``Sandbox.argv`` and ``Sandbox.popen_kwargs``. The level is decided once per runner, by trying it:

- ``pidns+uid`` (the runner is root): a new PID and mount namespace (``unshare --pid --mount
  --mount-proc --kill-child``) whose processes run as an unprivileged uid of their own
  (``setpriv``, no new privileges, no capabilities). It sees only its own processes in ``/proc``,
  cannot read any other user's environment, and cannot write the runner's files or the bundle cache.
- ``pidns`` (not root, unprivileged user namespaces allowed; or root whose attempt paths another
  user cannot reach): the same namespaces through a user namespace. Ancestors are invisible, so their
  environment cannot be read; files of the runner's uid are still writable (the runner re-checks the
  bundle before each attempt and the controller before each run).
- ``none``: neither works; the fingerprint carries a ``burn`` finding.

The namespace is also the process tracker: when its first process ends (or the ``unshare`` holding
it is killed, or the runner dies: parent-death signal), the kernel kills every process in it, even
those that started their own session. Standard library only, Python 3.9.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import os
import secrets
import shutil
import signal
import stat
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

PIDNS_UID = "pidns+uid"
PIDNS = "pidns"
NONE = "none"
LEVELS = (PIDNS_UID, PIDNS, NONE)

#: attempts run as a uid of this range when the runner is root (no account needs to exist)
UID_BASE = 1_990_000_000
UID_SPAN = 1_000_000
_PR_SET_PDEATHSIG = 1
_PROBE_TIMEOUT_S = 10
#: where an attempt's stray files are looked for (besides the runner's HOME), and how deep
STRAY_ROOTS = ("/tmp", "/var/tmp", "/dev/shm")
_STRAY_DEPTH = 4
_STRAY_MAX_ENTRIES = 20000


def _pdeathsig() -> None:
    """In the child before exec: die with the runner (a SIGKILLed runner cannot kill its children)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _prefix(level: str, uid: Optional[int]) -> List[str]:
    unshare = shutil.which("unshare") or "unshare"
    ns = ["--pid", "--fork", "--mount", "--mount-proc", "--kill-child"]
    if level == PIDNS_UID and uid is not None:
        setpriv = shutil.which("setpriv") or "setpriv"
        drop = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--"]
        # The namespace's first process stays a root shell that waits: a change of uid clears the
        # parent-death signal --kill-child gives it, and without it the namespace would outlive the
        # runner. It holds nothing (the attempt's environment, no capability the attempt can use).
        return [unshare, *ns, "--", "/bin/sh", "-c", '"$@"; exit $?', "sh", *drop]
    if level == PIDNS:
        # A shell is the namespace's init, the attempt its child: init ignores the signals it has
        # no handler for, so an attempt that was init could not be killed (a predicate's own
        # `kill -KILL $$` would be ignored and it would run on to exit 0).
        return [unshare, "--user", *ns, "--", "/bin/sh", "-c", '"$@"; exit $?', "sh"]
    return []


def _works(level: str) -> bool:
    """Try the level once: a process in it sees a fresh /proc (its own few processes), and with a uid
    of its own, is not root."""
    check = 'set -- /proc/[0-9]*; test "$#" -le 3' + (' && test "$(id -u)" != 0' if level == PIDNS_UID else "")
    argv = _prefix(level, UID_BASE + UID_SPAN - 1) + ["sh", "-c", check]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=_PROBE_TIMEOUT_S, env={"PATH": os.defpath})
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


_detected: Optional[str] = None


def detect() -> str:
    """The strongest level this host gives a runner of this uid (tried once per process)."""
    global _detected
    if _detected is None:
        _detected = NONE
        if os.name == "posix" and shutil.which("unshare"):
            if os.geteuid() == 0 and shutil.which("setpriv") and _works(PIDNS_UID):
                _detected = PIDNS_UID
            elif _works(PIDNS):
                _detected = PIDNS
    return _detected


def reachable_by_others(path: str) -> bool:
    """Every directory above ``path`` lets another user pass (the attempt's uid must reach it)."""
    current = os.path.dirname(os.path.abspath(path))
    while True:
        try:
            if not os.stat(current).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        parent = os.path.dirname(current)
        if parent == current:
            return True
        current = parent


def run_uid() -> int:
    """The uid a root runner's attempts run as: one per run (not per attempt, so attempts of a run may
    share what they leave in /tmp, as they would as one user), unlikely to be any other run's."""
    return UID_BASE + secrets.randbelow(UID_SPAN)


class Sandbox:
    """The isolation of one attempt: how its processes are started, and what it left behind."""

    def __init__(self, level: str, uid: Optional[int] = None) -> None:
        self.level = level
        self.uid = uid if level == PIDNS_UID else None
        self.started = time.time()
        self._wrap: Optional[Callable[[List[str]], List[str]]] = None

    @classmethod
    def for_attempt(cls, level: str, uid: int, *paths: str) -> "Sandbox":
        """A sandbox at ``level`` (``uid``: the run's, see ``run_uid``); a root runner whose ``paths``
        another uid cannot reach gets ``pidns``."""
        if level == PIDNS_UID:
            if all(reachable_by_others(p) for p in paths):
                return cls(level, uid)
            level = PIDNS if _works(PIDNS) else NONE
        return cls(level)

    def argv(self, argv: Sequence[str]) -> List[str]:
        full = _prefix(self.level, self.uid) + list(argv)
        return self._wrap(full) if self._wrap is not None else full

    def traced(self, wrap: Callable[[List[str]], List[str]]) -> "Sandbox":
        """The same sandbox whose every command line goes through ``wrap`` (a tracer around it: the
        tracer runs as the runner, outside the namespace, its log out of the attempt's reach)."""
        other = copy.copy(self)
        other._wrap = wrap
        return other

    def popen_kwargs(self) -> Dict[str, Any]:
        """Its own session (a ``kill(0)`` inside reaches only the sandbox) and death with the runner."""
        preexec: Optional[Callable[[], None]] = _pdeathsig if os.name == "posix" else None
        return {"start_new_session": True, "preexec_fn": preexec}

    def cannot_start(self, argv0: str, cwd: str, env: Dict[str, str]) -> Optional[str]:
        """Why ``argv0`` cannot start (as exec would say), checked before the sandbox is entered, so a
        missing program is the same error with and without one; None when it can."""
        if self.level == NONE:
            return None  # Popen itself says so
        path = os.path.join(cwd, argv0) if "/" in argv0 else shutil.which(argv0, path=env.get("PATH", os.defpath))
        if path is None or not os.path.exists(path):
            return os.strerror(2)
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            return os.strerror(13)
        return None

    def give(self, *paths: str) -> None:
        """Hand the attempt's directories to its uid (only they are writable to it)."""
        if self.uid is None:
            return
        for top in paths:
            for root, dirs, files in os.walk(top):
                for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                    with contextlib.suppress(OSError):
                        os.lchown(name, self.uid, self.uid)

    def strays(self, own: str, home: Optional[str] = None) -> List[str]:
        """Files the run's attempts wrote outside ``own`` (this attempt's directory): owned by the run's
        uid under /tmp, /var/tmp, /dev/shm and the runner's HOME. Reported, not removed (a test suite
        may leave a log there on purpose); only a uid of its own makes them attributable, other levels
        report nothing. The caller reports each path once (attempts in slots share the uid)."""
        if self.uid is None:
            return []
        found: List[str] = []
        inodes: Set[Tuple[int, int]] = set()
        seen = 0
        roots = [*STRAY_ROOTS, *([home] if home else [])]
        for top in roots:
            base_depth = top.rstrip("/").count("/")
            for root, dirs, files in os.walk(top):
                if root.count("/") - base_depth >= _STRAY_DEPTH:
                    dirs[:] = []
                for name in dirs + files:
                    seen += 1
                    path = os.path.join(root, name)
                    with contextlib.suppress(OSError):
                        st = os.lstat(path)
                        if st.st_uid == self.uid and (st.st_dev, st.st_ino) not in inodes:
                            inodes.add((st.st_dev, st.st_ino))  # one file seen twice (a bind mount) once
                            found.append(path)
                if seen > _STRAY_MAX_ENTRIES:
                    break
        found = [p for p in found if p != own and not p.startswith(own.rstrip("/") + "/")]
        found = [p for p in found if not any(p.startswith(f + "/") for f in found)]  # top-most only
        return sorted(found)
