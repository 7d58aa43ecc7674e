"""The runner's side of a slot's zygote (``zygote_init``): namespaces made once per slot, reused by
each process of its attempts in turn, cleared by their init after each.

Only where the per-process path would give the same: the runner is root and comes back to its own
PID namespace (``pidns+uid``), the process runs as an attempt's uid of its own (no capability: it
can neither mount, configure the network namespace, signal or trace the init, nor enter another
namespace of the slot), untraced, with no model forward. Anything else, and a process started while
its thread's zygote is busy (a command agent's tool), goes through the per-process path
(``sandbox.Started``). Each thread has its own zygotes (one with a network namespace, one without):
a slot's attempts run on one thread, and a zygote dies with the thread that started it (its
parent-death signal), or with ``close_all``.

A root runner forks its zygotes from a fork of its own made at its start, before it has any thread
(``start_forks``): a zygote is then a fork of that small process, not an interpreter started and
its modules imported again (about ten milliseconds of CPU a run on every host), and never the fork
of a process with threads (whose locks another thread may hold). A zygote made so dies with that
fork, which dies with the runner (parent-death signals both). Elsewhere the runner's fork execs
``python -I -S`` and imports ``zygote_init``. Standard library only, Python 3.9.
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
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import collector, privs
from .launch import _close_all_but, _close_range_works, _open_fds
from .zygote_init import decode, encode, recv_fds, send_fds

#: off: every process takes the per-process path (the reference the zygote is tested against)
ENABLED = True
_local = threading.local()
_all: List["Zygote"] = []
_all_lock = threading.Lock()


def _status(field: str, base: int) -> Optional[int]:
    """A number of this process's ``/proc/self/status`` (None where it cannot be read)."""
    with contextlib.suppress(OSError, ValueError, StopIteration), open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(field + ":")).split()[1], base)
    return None


def _read_umask() -> int:
    """This process's umask, read without changing it (a change would race with other threads)."""
    umask = _status("Umask", 8)
    return 0o022 if umask is None else umask


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
        self.proc: Union[subprocess.Popen[bytes], _Forked]
        if _forks is not None and _forks.usable:
            try:
                self.proc, self.ctl = _forks.zygote(net)
            except OSError:
                pass  # the exec'd way, then
            else:
                with _all_lock:
                    _all.append(self)
                return
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


def give_up() -> None:
    """This thread's zygotes are never used: those it has end, and none is started again, with a
    network namespace or without (its processes start the per-process way)."""
    mine: Dict[bool, Any] = _local.__dict__.setdefault("zygotes", {})
    for net in (True, False):
        got = mine.get(net)
        if got:
            got.discard()
        mine[net] = False


def prestart(net: bool) -> None:
    """Start this thread's zygote now: its interpreter starts while the run gets ready, not when the
    first process waits for it."""
    got = take(net)
    if got is not None:
        got.release()


def close_all() -> None:
    """End every zygote of this process (a run's end): each kills its namespace's processes with it;
    then the fork that made them, which is waited for (a runner that has no child left has none)."""
    global _forks
    with _all_lock:
        every = list(_all)
    for z in every:
        z.discard()
    if _forks is not None:
        _forks.close()
        _forks = None


class _Forked:
    """A zygote ``_Forks`` made, as ``Zygote`` uses a ``subprocess.Popen``: not this process's child (the
    fork that made it reaps it), so seen and signalled through its pidfd, never by its pid."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None and select.select([self.pidfd], [], [], 0)[0]:
            self._ended()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def wait(self) -> int:
        if self.returncode is None:
            select.select([self.pidfd], [], [])
            self._ended()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
        assert self.returncode is not None
        return self.returncode

    def _ended(self) -> None:
        """It has ended (how is for its parent to know). Where that fork has ended first, the zygote is
        this process's child (its subreaper's): reaped here."""
        self.returncode = -signal.SIGKILL
        with contextlib.suppress(ChildProcessError, OSError, AttributeError):
            os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG)


class _Forks:
    """The runner's end of the fork that makes its zygotes (``start_forks``): one request at a time."""

    def __init__(self, pid: int, ctl: socket.socket) -> None:
        self.pid = pid
        self.ctl = ctl
        self.usable = True
        self._lock = threading.Lock()

    def zygote(self, net: bool) -> Tuple[_Forked, socket.socket]:
        """A new zygote and the runner's end of its control socket; OSError when none was made."""
        with self._lock:
            try:
                self.ctl.send(encode({"net": net}))
                msg, fds = recv_fds(self.ctl)
            except OSError:
                msg, fds = b"", []
            if not msg:
                self.usable = False  # gone: every later zygote starts the exec'd way
                raise OSError("the zygotes' fork has ended")
            said = decode(msg)
            if len(fds) != 2:
                for fd in fds:
                    os.close(fd)
                raise OSError(f"cannot make a zygote: {said.get('error', 'no reply')}")
            return _Forked(int(said["pid"]), fds[1]), socket.socket(fileno=fds[0])

    def close(self) -> None:
        """Its end: it kills and reaps the zygotes it made, exits, and is waited for."""
        with contextlib.suppress(OSError):
            self.ctl.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


#: the fork that makes this runner's zygotes (``start_forks``), if any
_forks: Optional[_Forks] = None


def start_forks() -> None:
    """Fork the process that makes this runner's zygotes, now: a root runner on Linux, at its start,
    before any thread (none is made where this process has one already, or cannot make a PID namespace
    and come back from it: its zygotes then start the exec'd way). It holds nothing the runner reads
    later (the suite, the attempts' environments and files)."""
    global _forks
    if (_forks is not None or not ENABLED or os.geteuid() != 0 or not hasattr(os, "pidfd_open")
            or _status("Threads", 10) != 1 or not privs._PidNamespace.usable()):
        return
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # never returns into the runner
        collector.resume()  # paused while the runner starts: this process lives as long as the run
        code = 1
        try:
            ours.close()
            _serve_forks(theirs, parent)
            code = 0
        except BaseException as exc:  # noqa: B036
            with contextlib.suppress(OSError):
                os.write(2, f"crosshost zygotes' fork: {exc}\n".encode())
        finally:
            os._exit(code)
    theirs.close()
    _forks = _Forks(pid, ours)


def _serve_forks(ctl: socket.socket, parent: int) -> None:
    """The fork's loop: a zygote for each request, until the runner closes its end (or dies: the
    parent-death signal); then it kills and reaps the zygotes it made."""
    libc = privs.libc()
    privs._check(libc.prctl(privs._PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")
    if os.getppid() != parent:
        return  # the runner is gone already
    privs._check(libc.prctl(privs._PR_SET_DUMPABLE, 0, 0, 0, 0), "not dumpable")
    os.setsid()  # no signal to the run's process group or terminal is its: it ends with the runner
    for sig in privs._handled_signals():
        signal.signal(sig, signal.SIG_DFL)  # a handler of the runner's would run the runner's code
    os.environ.clear()  # the runner's: the processes of a zygote get theirs from each request
    os.chdir("/")  # no workspace kept busy
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # not the run's output, whose reader would wait for this process too
    os.close(null)
    made: List[int] = []
    while True:
        msg = ctl.recv(1024)
        if not msg:
            break
        for pid in list(made):  # the ones the runner has discarded since
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    made.remove(pid)
        try:
            pid, theirs = _fork_zygote(bool(decode(msg).get("net")), ctl)
        except OSError as exc:
            ctl.send(encode({"error": str(exc)}))
            continue
        made.append(pid)
        try:
            pidfd = os.pidfd_open(pid)
            try:
                send_fds(ctl, encode({"pid": pid}), [theirs.fileno(), pidfd])
            finally:
                os.close(pidfd)
        finally:
            theirs.close()
    for pid in made:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in made:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _fork_zygote(net: bool, forks_ctl: socket.socket) -> Tuple[int, socket.socket]:
    """Fork a zygote and set it up as ``_Prepare`` sets up the exec'd one (the first process of a new
    PID namespace, with a mount namespace and at ``net`` a network namespace of its own, dying with this
    fork), in a session of its own; its pid and the runner's end of its control socket, once ready."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ready_r, ready_w = os.pipe()
    prepare = _Prepare(net)
    _close_range_works()  # found out here, once for every zygote this fork makes, never first in one
    try:
        with privs._PidNamespace.for_children():
            pid = os.fork()
            if pid == 0:  # never leaves this block: its exit would take the namespace back
                try:
                    os.close(ready_r)
                    theirs_fd = theirs.detach()
                    ours.close()
                    forks_ctl.close()
                    os.setsid()
                    prepare()
                    os.write(ready_w, b"1")
                    # the runner's (a sealed zipapp, its PID namespace...): none is the zygote's
                    _close_all_but(_open_fds(), 0, 1, 2, theirs_fd)
                    from .zygote_init import serve

                    serve(theirs_fd, net)
                except BaseException as exc:  # noqa: B036
                    with contextlib.suppress(OSError):
                        os.write(2, f"crosshost zygote: {exc}\n".encode())
                finally:
                    os._exit(1)
        os.close(ready_w)
        ready_w = -1
        if os.read(ready_r, 1) != b"1":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            raise OSError("the zygote could not be set up")
        return pid, ours
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
        os.close(ready_r)
        if ready_w >= 0:
            os.close(ready_w)
