"""The runner's side of a slot's zygote (``zygote_init``): namespaces made once per slot, reused by
each process of its attempts in turn, cleared by their init after each.

Only where the per-process path would give the same: the runner is root and comes back to its own
PID namespace (``pidns+uid``), the process runs as an attempt's uid of its own (no capability: it
can neither mount, configure the network namespace, signal or trace the init, nor enter another
namespace of the slot), untraced, with no model forward. Anything else, and a process started while
its thread's zygote is busy (a command agent's tool), goes through the per-process path
(``sandbox.Started``). Each thread has its own zygotes (one with a network namespace, one without):
a slot's attempts run on one thread, and a zygote dies with the thread that started it (its
parent-death signal), or with ``close_all``. Standard library only, Python 3.9.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import privs
from .zygote_init import decode, encode, recv_fds, send_fds

#: off: every process takes the per-process path (the reference the zygote is tested against)
ENABLED = True
_local = threading.local()
_all: List["Zygote"] = []
_all_lock = threading.Lock()


def _read_umask() -> int:
    """This process's umask, read without changing it (a change would race with other threads)."""
    with contextlib.suppress(OSError, ValueError, StopIteration), open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)
    return 0o022


#: the runner's umask, read when it starts (before any thread could change it for a moment)
_UMASK = _read_umask()


class _Prepare:
    """The ``preexec_fn`` of a zygote's start, in the runner's fork that is already the first process
    of a new PID namespace (``sandbox._PidNamespace``): a mount namespace of its own with a fresh
    /proc and, with ``net``, a network namespace whose loopback is up; it dies with the runner's
    thread. Then it execs the zygote."""

    def __init__(self, net: bool) -> None:
        self.net = net  # made by ``Zygote``, which has checked the PID namespace can be left
        self.libc = privs.libc()
        self.handled = privs._handled_signals()

    def __call__(self) -> None:
        libc = self.libc
        libc.prctl(privs._PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        privs._check(libc.unshare(privs._CLONE_NEWNS | (privs._CLONE_NEWNET if self.net else 0)), "unshare")
        for sig in self.handled:
            signal.signal(sig, signal.SIG_DFL)
        privs._check(libc.mount(None, b"/", None, privs._MS_REC | privs._MS_PRIVATE, None), "mount --make-rprivate /")
        privs._check(libc.mount(b"proc", b"/proc", b"proc", privs._MS_NOSUID | privs._MS_NODEV | privs._MS_NOEXEC,
                                None), "mount /proc")
        if self.net:
            privs._loopback(None)


class Zygote:
    """One zygote: its process (a child of the runner) and the runner's end of its control socket."""

    def __init__(self, net: bool) -> None:
        if not privs._PidNamespace.usable():  # also opens the runner's own, which the start comes back to
            raise OSError("no PID namespace of its own can be made and left here")
        self.net = net
        self.busy = False
        self.broken = False
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        from . import pins  # here: the sandbox (and its isolation probe) loads without the suite's modules

        root = pins.import_root()
        # the checked start's sealed zipapp: the zygote imports the same bytes, through its descriptor
        sealed = [int(root[len(pins.SEALED_PREFIX):])] if root.startswith(pins.SEALED_PREFIX) else []
        code = (f"import sys; sys.path[:0] = [{root!r}]; from agent_runner.zygote_init import serve; "
                f"serve({theirs.fileno()}, {net!r})")
        try:
            with privs._PidNamespace.for_children():
                self.proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", code], preexec_fn=_Prepare(net),
                    pass_fds=(theirs.fileno(), *sealed), env={}, cwd="/", stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, start_new_session=True, umask=_UMASK)
        except BaseException:
            ours.close()
            started = self.__dict__.get("proc")
            if started is not None:  # the thread could not come back to its own PID namespace after it
                started.kill()
                started.wait()
            raise
        finally:
            theirs.close()
        self.ctl = ours
        with _all_lock:
            _all.append(self)

    def start(self, argv: Sequence[str], env: Dict[str, str], cwd: str, uid: int,
              stdio: List[int]) -> Tuple[int, int]:
        """Start ``argv`` as ``uid`` with ``stdio`` (its stdin, stdout, stderr); its pid, as this
        process sees it, and a pidfd of it (the caller's to close: the only safe handle to signal it,
        the zygote reaps it). Raises what its exec (or chdir) raised; ``ZygoteLost`` when the zygote
        is gone."""
        req = {"argv": [os.fsdecode(a) for a in argv], "env": env, "cwd": cwd, "uid": uid,
               "umask": _UMASK}
        try:
            send_fds(self.ctl, encode(req), stdio)
            msg, fds = recv_fds(self.ctl)
        except OSError as exc:
            self.discard()
            raise ZygoteLost(str(exc)) from exc
        if not msg:
            self.discard()
            raise ZygoteLost("the zygote ended")
        said = decode(msg)
        if not fds:
            if said.get("clean") is False:
                self.discard()
            self.release()
            err = said.get("errno") or 0
            if not err:
                raise OSError(f"cannot enter the sandbox: {said.get('where')}")
            if said.get("filename") is not None:
                raise OSError(err, os.strerror(err), said["filename"])
            raise OSError(err, os.strerror(err))
        for fd in fds[1:]:
            os.close(fd)
        try:
            with open(f"/proc/self/fdinfo/{fds[0]}") as f:
                return int(next(line for line in f if line.startswith("Pid:")).split()[1]), fds[0]
        except BaseException:
            os.close(fds[0])
            raise

    def status(self, timeout: Optional[float]) -> Optional[int]:
        """The wait status of the started process once its namespace is clear; None when ``timeout``
        (seconds; 0: do not wait) passed first. -1 (as a SIGKILL) when the zygote died meanwhile."""
        with self._lock:
            if not self.busy:
                return None
            try:
                if timeout is not None and not select.select([self.ctl], [], [], max(timeout, 0.0))[0]:
                    return None
                msg = self.ctl.recv(65536)
            except OSError:
                msg = b""
            if not msg:  # gone: so is everything of its namespace (the kernel killed it with its init)
                self.discard()
                self.busy = False
                return 9  # the wait status of a SIGKILL death
            said = decode(msg)
            if not said.get("clean", True):
                self.discard()
            self.busy = False
            return int(said["status"])

    def release(self) -> None:
        self.busy = False

    def discard(self) -> None:
        """Never used again: its process is killed (its namespaces with it) and reaped."""
        self.broken = True
        with contextlib.suppress(OSError):
            self.ctl.close()
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait()
        with _all_lock:
            if self in _all:
                _all.remove(self)


class ZygoteLost(OSError):
    """The zygote ended before it could start a process."""


def take(net: bool) -> Optional[Zygote]:
    """This thread's idle zygote (with a network namespace or not), started on first use; None when it
    is busy or none can be started (the caller starts the process the per-process way)."""
    if not ENABLED:
        return None
    mine: Dict[bool, Any] = _local.__dict__.setdefault("zygotes", {})
    got = mine.get(net)
    if got is False:
        return None  # could not be started in this thread: not tried again
    if got is None or got.broken or got.proc.poll() is not None:
        if got is not None and not got.broken:
            got.discard()
        try:
            got = mine[net] = Zygote(net)
        except (OSError, subprocess.SubprocessError, privs._NoNamespace):  # the per-process way, then
            mine[net] = False
            return None
    if got.busy:
        return None
    got.busy = True
    return got


def prestart(net: bool) -> None:
    """Start this thread's zygote now: its interpreter starts while the run gets ready, not when the
    first process waits for it."""
    got = take(net)
    if got is not None:
        got.release()


def close_all() -> None:
    """End every zygote of this process (a run's end): each kills its namespace's processes with it."""
    with _all_lock:
        every = list(_all)
    for z in every:
        z.discard()
