"""How the runner starts one process of an attempt on its own (the per-process path of
``sandbox.Started``; a slot's zygote starts the others): forks of the runner enter the namespaces
(``_Enter``), the namespace's first process waits for the attempt and tells the runner how it ended
(``_init``; ``_forwarding_init`` also relays the model proxy), and at ``pidns`` a holder outside the
namespaces holds it. No program or interpreter is started for any of it. Standard library only,
Python 3.9.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import socket
import sys
import threading
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from . import privs
from .privs import (
    _CLONE_NEWIPC,
    _CLONE_NEWNET,
    _CLONE_NEWNS,
    _CLONE_NEWPID,
    _CLONE_NEWUSER,
    _MS_NODEV,
    _MS_NOEXEC,
    _MS_NOSUID,
    _MS_PRIVATE,
    _MS_REC,
    _PR_SET_DUMPABLE,
    _PR_SET_PDEATHSIG,
    _SYS_CLOSE_RANGE,
    _become,
    _check,
    _handled_signals,
    _last_cap,
    _loopback,
)
from .privs import libc as _libc

PIDNS_UID = "pidns+uid"
PIDNS = "pidns"
NONE = "none"

#: a Unix socket's path must fit in sun_path (108 bytes with its NUL)
_SUN_PATH_MAX = 100


#: what a fork that could not enter the namespaces writes to the status pipe before its reason
ENTRY_FAILED = "cannot enter: "
PIPE_ATOMIC = 512  # a pipe write of at most this many bytes is never split (POSIX's PIPE_BUF floor)


def failed_entry(status_fd: int) -> Optional[Tuple[int, str]]:
    """Why the fork that was to enter the namespaces could not (its errno, or 0, and its message),
    read from the status pipe's read end once that fork has ended; None if it did not say (it got
    further: its init may still hold the pipe, so the read never waits)."""
    try:
        os.set_blocking(status_fd, False)
        said = os.read(status_fd, PIPE_ATOMIC).decode(errors="replace")
    except OSError:
        return None
    if not said.startswith(ENTRY_FAILED):
        return None
    number, _, message = said[len(ENTRY_FAILED):].partition(" ")
    return (int(number) if number.isdigit() else 0), message


def _pdeathsig() -> None:
    """In the child before exec: die with the runner (a SIGKILLed runner cannot kill its children)."""
    with contextlib.suppress(Exception):
        _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class _Enter:
    """The ``preexec_fn`` of a start in a namespace: what ``unshare --pid --fork --mount --mount-proc
    --kill-child`` and a small init did as programs, done by forks of the runner, with no program or
    interpreter started for them.

    As root (``direct``) the child ``subprocess`` forked is the init itself: it was forked into its new
    PID namespace (``_PidNamespace``), enters its new mount namespace and goes on as the init below.
    Otherwise that child (the holder: outside the namespaces, the process the runner waits for and
    kills) enters new PID and mount namespaces through a user namespace, forks the namespace's first
    process (the init) and exits as it does, or dies of the same signal. The
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

    def __init__(self, level: str, status_fd: int, net: bool = False,
                 relay: Optional[Tuple[int, str]] = None, uid: Optional[int] = None, direct: bool = False,
                 shield: Sequence[privs.ShieldStep] = ()) -> None:
        # direct: forked into its new PID namespace already (``_PidNamespace``), this process is the
        # init: no holder
        self.direct = direct
        self.flags = ((0 if direct else _CLONE_NEWPID) | _CLONE_NEWNS | _CLONE_NEWIPC
                      | (_CLONE_NEWUSER if level == PIDNS else 0) | (_CLONE_NEWNET if net else 0))
        self.status_fd = status_fd
        self.shield = list(shield)  # the runner's home read-only, its workspace writable (privs.home_shield)
        self.net = net
        self.relay = relay  # (port inside, the runner's Unix socket): the init forwards one to the other
        self.libc = _libc()
        self.uid = uid  # the attempt's own, taken in its process before its exec (None: it keeps the runner's)
        self.last_cap = _last_cap() if uid is not None else 0
        # a uid of its own is drawn again by later attempts: no key may outlive it in its keyrings
        self.keys = privs.key_filter() if level == PIDNS_UID else None
        self.handled = _handled_signals()
        _close_range_works()  # found out here, never first in the fork

    def __call__(self) -> None:
        # Only the least Python here: this is a copy of the runner, and every page it touches is
        # copied (what could be prepared was, by the runner in ``__init__``).
        libc = self.libc
        try:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
            _check(libc.unshare(self.flags), "unshare")  # raised here: Popen raises, nothing was started
            privs.new_session_keyring()  # nor the runner's session keyring: one of the attempt's own
            for sig in self.handled:
                signal.signal(sig, signal.SIG_DFL)
            # listed now where descriptors cannot be closed by range: once the init has mounted the
            # namespace's /proc, the holder (not in it) has no /proc/self
            fds = _open_fds()
            init = 0 if self.direct else _fork()
        except BaseException as exc:
            # subprocess says only "Exception occurred in preexec_fn": the runner reads why from
            # the status pipe (``failed_entry``)
            with contextlib.suppress(BaseException):
                os.write(self.status_fd, (ENTRY_FAILED + f"{getattr(exc, 'errno', 0) or 0} {getattr(exc, 'strerror', None) or exc}").encode()[:PIPE_ATOMIC])
            raise
        if init != 0:
            _hold(init, fds)
        try:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the init dies with its parent (the holder, or the runner)
            _check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
            _check(libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None), "mount /proc")
            if self.shield:
                privs.shield_home(libc, self.shield)
            listener = _loopback(self.relay[0] if self.relay else None) if self.net else None
            attempt = _fork()
        except BaseException as exc:
            with contextlib.suppress(BaseException):
                os.write(2, f"crosshost sandbox: {exc}\n".encode())
            os._exit(126)
        if attempt == 0:
            os.close(self.status_fd)
            if listener is not None:
                listener.close()
            if self.uid is not None:
                _become(libc, self.uid, self.last_cap)  # raised here: subprocess reports it, nothing runs
            privs.refuse_keys(libc, self.keys)
            return
        if listener is not None and self.relay is not None:
            _forwarding_init(attempt, self.status_fd, fds, listener, self.relay[1])
        _init(attempt, self.status_fd, fds)


_close_range_ok: Optional[bool] = None


def _close_range_works() -> bool:
    """Whether the kernel closes descriptors by range (``close_range``, Linux 5.9), tried once by the
    runner on a range with nothing in it; where it does not, a fork lists ``/proc/self/fd``."""
    global _close_range_ok
    if _close_range_ok is None:
        _close_range_ok = sys.platform.startswith("linux") and _libc().syscall(
            _SYS_CLOSE_RANGE, ctypes.c_uint(0xFFFFFFFE), ctypes.c_uint(0xFFFFFFFF), ctypes.c_uint(0)) == 0
    return _close_range_ok


def _fork() -> int:
    """``fork`` in a fork of the runner (which has one thread): the raw system call, without the
    Python at-fork callbacks ``os.fork`` runs in both processes (threading's, logging's, random's
    reseed: a copy-on-write fault for every page they touch). The child only sets itself up and
    execs, or waits and exits."""
    pylibc = privs.pylibc()
    pid = pylibc.fork() if pylibc is not None else -1
    if pid < 0:
        raise OSError(ctypes.get_errno(), f"fork: {os.strerror(ctypes.get_errno())}")
    return pid


def _open_fds() -> Optional[List[int]]:
    """What a fork hands ``_close_all_but``: None where the kernel closes descriptors by range, else
    every descriptor this process has now (listed while it has a ``/proc/self`` to list them from)."""
    return None if _close_range_works() else [int(name) for name in os.listdir("/proc/self/fd")]


def _close_all_but(fds: Optional[List[int]], *keep: int) -> None:
    """Close every descriptor but those of ``keep``: by range (``fds`` None), else those of ``fds``
    (every one this process had, listed before)."""
    if fds is None:
        low = 0
        for fd in sorted(k for k in keep if k >= 0):
            if fd > low:
                _libc().syscall(_SYS_CLOSE_RANGE, ctypes.c_uint(low), ctypes.c_uint(fd - 1), ctypes.c_uint(0))
            low = fd + 1
        _libc().syscall(_SYS_CLOSE_RANGE, ctypes.c_uint(low), ctypes.c_uint(0xFFFFFFFF), ctypes.c_uint(0))
        return
    for fd in fds:
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _hold(init: int, fds: Optional[List[int]]) -> None:
    """The holder: close ``fds`` (every descriptor it had), wait for the init, end as it did. Never
    returns."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        _close_all_but(fds)
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


def _init(attempt: int, status_fd: int, fds: Optional[List[int]]) -> None:
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


def _forwarding_init(attempt: int, status_fd: int, fds: Optional[List[int]], listener: socket.socket,
                     path: str) -> None:
    """The init of a namespace whose attempt reaches its model proxy: as ``_init``, and meanwhile every
    connection to ``listener`` is relayed to the Unix socket ``path`` (the runner's relay to the proxy).
    One thread, one ``select``: the attempt's end is a pidfd becoming readable (never a poll). Never
    returns."""
    try:
        # ``fds`` (when listed) was listed before the listener existed: its number may be one listed
        # then (the listing's own descriptor), so it is kept by number
        _close_all_but(fds, status_fd, listener.fileno())
        # after the attempt's fork: a long socket path is reached from its directory, the init's own cwd
        directory, name = os.path.split(path)
        os.chdir(directory)
        try:
            done: Optional[int] = os.pidfd_open(attempt)
        except (AttributeError, OSError):
            done = None  # before Linux 5.3: the attempt's end is looked for every 50 ms
        peers: Dict[socket.socket, socket.socket] = {}
        status: Optional[int] = None
        while status is None:
            watched: List[Any] = [listener, *peers] + ([done] if done is not None else [])
            ready = select.select(watched, [], [], None if done is not None else 0.05)[0]
            with contextlib.suppress(ChildProcessError):
                while True:  # orphans the init inherited, and the attempt once it has ended
                    pid, got = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    if pid == attempt:
                        status = got
            for sock in ready:
                if sock is listener:
                    inside = listener.accept()[0]
                    outside = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    try:
                        outside.connect(name)
                    except OSError:
                        inside.close()
                        outside.close()
                        continue
                    peers[inside], peers[outside] = outside, inside
                elif sock in peers:
                    try:
                        data = sock.recv(65536)
                        if data:
                            peers[sock].sendall(data)
                            continue
                    except OSError:
                        pass
                    other = peers.pop(sock)
                    peers.pop(other, None)
                    sock.close()
                    other.close()
        os.write(status_fd, str(status).encode())
        os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            os.write(2, f"crosshost sandbox: the model forwarder failed: {exc}\n".encode())
    finally:
        os._exit(1)


class ModelRelay:
    """A Unix socket at ``path`` (mode 600, the runner's: only a sandbox's init opens it) whose every
    connection is relayed to the TCP ``target`` (the model proxy, or its forward, on this host's
    loopback). One accepting thread; two pumping threads a connection, ended with it."""

    def __init__(self, path: str, target: Tuple[str, int]) -> None:
        self.path = path
        self.target = target
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._thread: Optional[threading.Thread] = None
        self._open: Set[socket.socket] = set()
        self._lock = threading.Lock()

    def __enter__(self) -> "ModelRelay":
        old = os.umask(0o177)
        try:  # a long path is bound relative to its directory (sun_path holds 108 bytes)
            self._bind()
        finally:
            os.umask(old)
        self._sock.listen(64)
        self._thread = threading.Thread(target=self._serve, name="model-relay", daemon=True)
        self._thread.start()
        return self

    def _bind(self) -> None:
        if len(self.path.encode()) <= _SUN_PATH_MAX:
            self._sock.bind(self.path)
            return
        fd = os.open(os.path.dirname(self.path), os.O_RDONLY)
        try:
            self._sock.bind(f"/proc/self/fd/{fd}/{os.path.basename(self.path)}")
        finally:
            os.close(fd)

    def __exit__(self, *exc: Any) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def _serve(self) -> None:
        while True:
            try:
                inside = self._sock.accept()[0]
            except OSError:
                return  # closed: the attempt is over
            try:
                outside = socket.create_connection(self.target, timeout=10)
                outside.settimeout(None)
            except OSError:
                inside.close()
                continue
            with self._lock:
                self._open.update((inside, outside))
            left = [2]  # pumps of this connection still running; the last one closes both ends
            for a, b in ((inside, outside), (outside, inside)):
                threading.Thread(target=self._pump, args=(a, b, left), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, left: List[int]) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
        with self._lock:
            left[0] -= 1
            if left[0]:
                return
            for end in (source, sink):
                self._open.discard(end)
                end.close()
