"""Where an attempt's processes run: out of sight and reach of the runner and the controller.

Every process an attempt starts (the command agent, a shell tool, the predicate) is started through
``Sandbox.popen``. The level is decided once per runner, by trying it:

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
those that started their own session. That first process is a small init of the runner's own
Python (``INIT``): the attempt is its child, because a namespace's init ignores every signal it has no
handler for (an attempt that was init could not be killed, not even by its own ``kill -KILL $$``), and
it tells the runner how the attempt ended on a pipe of its own, because its exit code alone could
not (a signal death is 128+N there, the same as ``exit 137``). Standard library only, Python 3.9.
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
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

PIDNS_UID = "pidns+uid"
PIDNS = "pidns"
NONE = "none"
LEVELS = (PIDNS_UID, PIDNS, NONE)

#: attempts run as a uid of this range when the runner is root (no account needs to exist)
UID_BASE = 1_990_000_000
UID_SPAN = 1_000_000
_PR_SET_PDEATHSIG = 1
_PROBE_TIMEOUT_S = 10


def _pdeathsig() -> None:
    """In the child before exec: die with the runner (a SIGKILLed runner cannot kill its children)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


#: The namespace's first process (argv: the status pipe's fd, then the attempt's argv). It forks the
#: attempt, waits for it, writes its raw wait status to the pipe and exits as a shell would (128+N
#: for a signal). It undoes what Python's start changed before the attempt's exec: the environment
#: is the one the init was given (/proc/self/environ; Python sets LC_CTYPE under a C locale), SIGPIPE
#: and SIGXFSZ are no longer ignored; and it drops Python's SIGINT handler, as init ignores what it
#: has no handler for.
INIT = """\
import os, signal, sys
fd, argv = int(sys.argv[1]), sys.argv[2:]
with open("/proc/self/environ", "rb") as f:
    env = dict(v.split(b"=", 1) for v in f.read().split(b"\\0") if b"=" in v)
signal.signal(signal.SIGINT, signal.SIG_DFL)
pid = os.fork()
if pid == 0:
    os.close(fd)
    for s in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(s, signal.SIG_DFL)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        os.write(2, ("%s: %s\\n" % (argv[0], e.strerror)).encode())
        os._exit(127)
status = os.waitpid(pid, 0)[1]
os.write(fd, str(status).encode())
os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
"""


def _wrapped(level: str, uid: Optional[int], status_fd: int, argv: Sequence[str],
             tracer: Optional[Callable[[List[str]], List[str]]] = None) -> List[str]:
    """``argv`` as the sandbox at ``level`` starts it; ``tracer`` wraps what runs under the init (the
    uid change and the attempt), so it traces the attempt and never the init's own start."""
    inner = list(argv)
    if level == PIDNS_UID and uid is not None:
        setpriv = shutil.which("setpriv") or "setpriv"
        inner = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
                 "--inh-caps=-all", "--bounding-set=-all", "--", *inner]
    if tracer is not None:
        inner = tracer(inner)
    if level not in (PIDNS_UID, PIDNS):
        return inner
    unshare = shutil.which("unshare") or "unshare"
    ns = ["--pid", "--fork", "--mount", "--mount-proc", "--kill-child"]
    # The init stays the runner's uid (root under pidns+uid): a change of uid would clear the
    # parent-death signal --kill-child gives it, and the namespace would outlive the runner. It
    # holds nothing the attempt could use (the attempt's environment, no open file of the runner).
    init = ["--", sys.executable or "python3", "-I", "-S", "-c", INIT, str(status_fd)]
    return [unshare, *(["--user"] if level == PIDNS else []), *ns, *init, *inner]


def _works(level: str) -> bool:
    """Try the level once: a process in it sees a fresh /proc (its own few processes), and with a uid
    of its own, is not root."""
    check = 'set -- /proc/[0-9]*; test "$#" -le 3' + (' && test "$(id -u)" != 0' if level == PIDNS_UID else "")
    try:
        proc = Sandbox(level, UID_BASE + UID_SPAN - 1).popen(
            ["sh", "-c", check], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env={"PATH": os.defpath})
    except OSError:
        return False
    try:
        return proc.wait(timeout=_PROBE_TIMEOUT_S) == 0
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return False


def oom_kills() -> Optional[int]:
    """How many processes the kernel's OOM killer has killed since boot (any memory cgroup too), or
    None where the kernel does not say (not Linux, before 4.13)."""
    try:
        with open("/proc/vmstat", "rb") as f:
            for line in f:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


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

    def traced(self, wrap: Callable[[List[str]], List[str]]) -> "Sandbox":
        """The same sandbox whose every command line goes through ``wrap`` (a tracer): inside the
        namespace, around the attempt, as the runner's uid (its log out of the attempt's reach under
        ``pidns+uid``), never around the sandbox's own init."""
        other = copy.copy(self)
        other._wrap = wrap
        return other

    def popen(self, argv: Sequence[str], **kwargs: Any) -> "Started":
        """Start ``argv`` in the sandbox, in a session of its own (a ``kill(0)`` inside reaches only the
        sandbox) that dies with the runner. ``kwargs`` go to ``subprocess.Popen``."""
        return Started(self, argv, self._wrap, kwargs)

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


class Started(subprocess.Popen[bytes]):
    """A process started in a sandbox: its ``returncode`` is the attempt's own (``-9`` for a SIGKILL
    death, as ``subprocess`` says it), read from the init's status pipe; ``oom_killed`` says whether
    the kernel's OOM killer ran while it did."""

    def __init__(self, box: Sandbox, argv: Sequence[str], tracer: Optional[Callable[[List[str]], List[str]]],
                 kwargs: Dict[str, Any]) -> None:
        self._status: Optional[int] = None  # the read end of the init's status pipe
        self._oom_before = oom_kills()
        self._oom_after: Optional[int] = None
        write_end = None
        if box.level != NONE:
            self._status, write_end = os.pipe()
        full = _wrapped(box.level, box.uid, -1 if write_end is None else write_end, argv, tracer)
        preexec: Optional[Callable[[], None]] = _pdeathsig if os.name == "posix" else None
        try:
            super().__init__(full, start_new_session=True, preexec_fn=preexec,
                             pass_fds=() if write_end is None else (write_end,), **kwargs)
        except BaseException:
            self._close_status()
            raise
        finally:
            if write_end is not None:
                os.close(write_end)  # the init holds the only other copy: its end is the pipe's end

    def _close_status(self) -> None:
        if self._status is not None:
            with contextlib.suppress(OSError):
                os.close(self._status)
            self._status = None

    def _settle(self) -> None:
        """Once it has ended: the attempt's own status instead of the shell-like code of its init."""
        if self.returncode is None:
            return
        if self._oom_after is None:
            self._oom_after = oom_kills()
        if self._status is None:
            return
        try:
            os.set_blocking(self._status, False)
            said = os.read(self._status, 64)
        except OSError:
            said = b""  # the init was killed before it could say (the runner's own kill, a timeout)
        self._close_status()
        with contextlib.suppress(ValueError):
            status = int(said)
            if os.WIFSIGNALED(status) and self.returncode == 128 + os.WTERMSIG(status):
                self.returncode = -os.WTERMSIG(status)

    def poll(self) -> Optional[int]:
        super().poll()
        self._settle()
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        super().wait(timeout)
        self._settle()
        return self.returncode

    def oom_killed(self) -> Optional[bool]:
        """True when the kernel's OOM killer killed something while this ran (on a busy machine it may
        have been another process; with a SIGKILL death, it was almost surely this one); None when
        the kernel does not count OOM kills or it has not ended."""
        if self._oom_before is None or self._oom_after is None:
            return None
        return self._oom_after > self._oom_before
