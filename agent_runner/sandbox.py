"""Where an attempt's processes run: out of sight and reach of the runner and the controller.

Every process an attempt starts (the command agent, a shell tool, the predicate) is started through
``Sandbox.popen``. The level is decided once per runner, by trying it:

- ``pidns+uid`` (the runner is root): a new PID and mount namespace (what ``unshare --pid --fork
  --mount --mount-proc --kill-child`` makes, made by the runner's own forks) whose processes run as an
  unprivileged uid of their own (``setpriv``, no new privileges, no capabilities). It sees only its
  own processes in ``/proc``, cannot read any other user's environment, and cannot write the runner's
  files or the bundle cache.
- ``pidns`` (not root, unprivileged user namespaces allowed; or root whose attempt paths another
  user cannot reach): the same namespaces through a user namespace. Ancestors are invisible, so their
  environment cannot be read; files of the runner's uid are still writable (the runner re-checks what
  each attempt is run from, and the controller the bundle before each run).
- ``none``: neither works; the fingerprint carries a ``burn`` finding.

The namespace is also the process tracker: when its first process ends (or the holder outside it is
killed, or the runner dies: parent-death signals), the kernel kills every process in it, even those
that started their own session. No program is started for that: a fork of the runner enters the
namespaces and a fork of that is the namespace's init (``_Enter``), so an attempt costs its own
programs and three forks, not an interpreter's start. The attempt is the init's child, because a
namespace's init ignores every signal it has no handler for, and the init tells the runner how the
attempt ended on a pipe of its own, because its exit code alone could not (a signal death is 128+N
there, the same as ``exit 137``). Standard library only, Python 3.9.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import os
import secrets
import select
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

#: attempts run as a uid of this range when the runner is root (no account needs to exist)
UID_BASE = 1_990_000_000
UID_SPAN = 1_000_000
_PR_SET_PDEATHSIG = 1
_PROBE_TIMEOUT_S = 10


_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
_PR_SET_DUMPABLE = 4
_libc_handle: Optional[ctypes.CDLL] = None


def _libc() -> ctypes.CDLL:
    """libc, loaded by the runner before it forks (a child must not be the first to load it)."""
    global _libc_handle
    if _libc_handle is None:
        _libc_handle = ctypes.CDLL(None, use_errno=True)
    return _libc_handle


def _pdeathsig() -> None:
    """In the child before exec: die with the runner (a SIGKILLed runner cannot kill its children)."""
    with contextlib.suppress(Exception):
        _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


class _Enter:
    """The ``preexec_fn`` of a start in a namespace: what ``unshare --pid --fork --mount --mount-proc
    --kill-child`` and a small init did as programs, done by forks of the runner, with no program or
    interpreter started for them.

    The child ``subprocess`` forked (the holder: outside the namespaces, the process the runner waits
    for and kills) enters new PID and mount namespaces (through a user namespace at ``pidns``), forks
    the namespace's first process (the init) and exits as it does, or dies of the same signal. The
    init mounts a fresh /proc, forks the attempt, reaps every process of the namespace until the
    attempt has ended, writes the attempt's raw wait status to the status pipe and exits as a shell
    would (128+N for a signal): its exit code alone could not say a signal death from ``exit 137``.
    The attempt is the init's child, because an init ignores every signal it has no handler for (an
    attempt that was init could not be killed, not even by its own ``kill -KILL $$``). Only the attempt
    returns from here; ``subprocess`` then execs it with the environment, directory and descriptors it
    was given. The holder and the init stay the runner's uid (root under ``pidns+uid``: a change of
    uid would clear the parent-death signals that end the namespace with the runner), close every
    descriptor but the status pipe (the attempt's pipes, the runner's files, ``subprocess``'s error
    pipe), are not dumpable (they are copies of the runner: nothing in the namespace may read their
    memory or ``/proc`` entries) and drop the runner's signal handlers."""

    def __init__(self, level: str, status_fd: int) -> None:
        self.flags = _CLONE_NEWPID | _CLONE_NEWNS | (_CLONE_NEWUSER if level == PIDNS else 0)
        self.status_fd = status_fd
        self.libc = _libc()

    def __call__(self) -> None:
        libc = self.libc
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        _check(libc.unshare(self.flags), "unshare")  # raised here: Popen raises, nothing was started
        _default_handlers()
        # listed now: once the init has mounted the namespace's /proc, the holder (not in it) has no
        # /proc/self
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
        init = os.fork()
        if init != 0:
            _hold(init, fds)
        try:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the init dies with the holder
            _check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
            _check(libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None), "mount /proc")
            attempt = os.fork()
        except BaseException as exc:
            with contextlib.suppress(BaseException):
                os.write(2, f"crosshost sandbox: {exc}\n".encode())
            os._exit(126)
        if attempt == 0:
            os.close(self.status_fd)
            return
        _init(attempt, self.status_fd, fds)


def _default_handlers() -> None:
    """Every signal the runner handles in Python back to its default (an init ignores it)."""
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError, TypeError):
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)


def _close_all_but(fds: List[int], keep: int) -> None:
    for fd in fds:
        if fd != keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _hold(init: int, fds: List[int]) -> None:
    """The holder: close ``fds`` (every descriptor it had), wait for the init, end as it did. Never
    returns."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        _close_all_but(fds, -1)
        while True:
            try:
                status = os.waitpid(init, 0)[1]
                break
            except InterruptedError:
                continue
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
            os.kill(os.getpid(), sig)
            os._exit(128 + sig)
        os._exit(os.WEXITSTATUS(status))
    finally:
        os._exit(1)


def _init(attempt: int, status_fd: int, fds: List[int]) -> None:
    """The namespace's init: close ``fds`` but the status pipe, reap until the attempt has ended, then
    say how. Never returns."""
    try:
        _close_all_but(fds, status_fd)
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except InterruptedError:
                continue
            if pid == attempt:
                break
        os.write(status_fd, str(status).encode())
        os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
    finally:
        os._exit(1)


def _wrapped(level: str, uid: Optional[int], argv: Sequence[str],
             tracer: Optional[Callable[[List[str]], List[str]]] = None) -> List[str]:
    """What the attempt's process execs at ``level``: ``argv`` under the change to the attempt's uid;
    ``tracer`` wraps both (it runs as the runner's uid, its log out of the attempt's reach) and never
    the namespace's own processes."""
    inner = list(argv)
    if level == PIDNS_UID and uid is not None:
        setpriv = shutil.which("setpriv") or "setpriv"
        inner = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
                 "--inh-caps=-all", "--bounding-set=-all", "--", *inner]
    return tracer(inner) if tracer is not None else inner


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
        if sys.platform.startswith("linux"):
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


def _until_exit(pid: int, timeout: float, args: Any) -> None:
    """Block until ``pid`` (a child) has ended, or raise ``TimeoutExpired`` after ``timeout`` seconds:
    one wait on a pidfd, where ``Popen.wait(timeout)`` sleeps and polls (up to 50 ms late). Where
    pidfds are missing (Linux before 5.3) it returns and the caller's own wait decides."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return
    try:
        if not select.select([fd], [], [], max(timeout, 0.0))[0]:
            raise subprocess.TimeoutExpired(args, timeout)
    finally:
        os.close(fd)


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
        full = _wrapped(box.level, box.uid, argv, tracer)
        preexec: Optional[Callable[[], None]] = None
        if os.name == "posix":
            _libc()  # loaded here, never first in the child
            preexec = _pdeathsig
        if write_end is not None:
            preexec = _Enter(box.level, write_end)
        try:
            super().__init__(full, start_new_session=True, preexec_fn=preexec,
                             pass_fds=() if write_end is None else (write_end,), **kwargs)
        except subprocess.SubprocessError as exc:  # the namespaces could not be entered: nothing started
            self._close_status()
            raise OSError(f"cannot enter the sandbox: {exc}") from exc
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
        if timeout is not None and self.returncode is None:
            _until_exit(self.pid, timeout, self.args)
        super().wait(timeout)  # at once after _until_exit, unless it could not tell
        self._settle()
        return self.returncode

    def oom_killed(self) -> Optional[bool]:
        """True when the kernel's OOM killer killed something while this ran (on a busy machine it may
        have been another process; with a SIGKILL death, it was almost surely this one); None when
        the kernel does not count OOM kills or it has not ended."""
        if self._oom_before is None or self._oom_after is None:
            return None
        return self._oom_after > self._oom_before
