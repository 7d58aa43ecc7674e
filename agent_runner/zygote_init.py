"""A slot's namespace init (the zygote): the first process of a PID, mount and network namespace
made once per slot, which starts every process of that slot's attempts in turn and clears the
namespaces after each.

Forked by a fork the runner made at its start (``zygote.start_forks``), or started by the runner
(``zygote.Zygote``) as ``python -I -S``, in namespaces that fork made (a fresh /proc; at ``netns+``
only a loopback, up), root, pid 1, not dumpable, dying with its parent and so with the runner
(parent-death signal: the kernel then kills every process of the namespace). It reads one request
at a time from its control socket (a Unix socket pair, descriptors passed with ``SCM_RIGHTS``): the
command line, environment, working directory and uid of one process, and its stdin, stdout and
stderr. It spawns it (pid 2, as a fresh namespace's first child would be) in an IPC namespace of its
own, taking the process's uid around the spawn (``_spawn``); the process starts a session of its
own and execs, its uid in all four ids (no capability, no new privilege); the reply
is a pidfd of it (the runner reads its pid there) or the error that stopped it before its exec.
When that process has ended the zygote kills every other process of the namespace (``kill(-1)``
from a PID namespace's init reaches all of it but the init), reaps them all, waits until the
network namespace holds no socket, and only then says how the process ended: the next request
never shares the namespaces with anything the previous one left. A namespace it cannot clear is
not reused: it says so and exits (the kernel ends the namespaces with it).

Imports nothing of the runner but ``privs`` (where it is exec'd, its start is paid once per slot).
Python 3.9.
"""

from __future__ import annotations

import _signal
import _socket
import _thread
import marshal
import os
import struct
import sys
import time

from . import privs

# Nothing but what it calls: the zygote's start is paid once per run on every host (``socket``,
# ``signal``, ``subprocess`` and ``typing`` would double it).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import Any, Callable, Dict, List, Optional, Tuple

_SIGKILL = 9  # the same on every Linux machine
_ENOENT, _ENOTDIR = 2, 20
#: the signals a process starts with at their default (the rest as the zygote has them: ignored or
#: default): those Python ignores, as ``subprocess``'s restore_signals does, and libc's own unless the
#: zygote ignores them (``_defaults``)
_DEFAULTS = [13, 25]  # SIGPIPE, SIGXFSZ


def _defaults() -> List[int]:
    """``_DEFAULTS`` and those of libc's own signals this process does not ignore (ignored, as under a
    ``make`` that started its shell with ``posix_spawn``, they stay ignored through a fork and exec:
    libc's ``posix_spawn`` would ignore them in any case)."""
    ignored = 0
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"SigIgn:"):
                ignored = int(line.split()[1], 16)
    return [13, 25, *(sig for sig in privs.LIBC_SIGNALS if not ignored >> (sig - 1) & 1)]
#: processes started by ``subprocess`` where ``privs.spawn`` cannot, by pid: reaped by the zygote's own
#: wait, which tells them so (``subprocess`` must never wait for a pid that is the next process's)
_POPENS: "Dict[int, subprocess.Popen[bytes]]" = {}

#: the sockets of the namespace the kernel may keep once their processes are gone: Unix ones in flight
#: (a descriptor sent and never received) until collected. A TCP socket's closing states on the
#: loopback end within microseconds once both ends are closed, but for TIME_WAIT, which the
#: namespace never keeps (``tcp_max_tw_buckets`` 0); its table is not read (its read walks the host's
#: whole connection table: tens of milliseconds). Others end with their last descriptor.
_SOCKET_TABLES = ("/proc/net/unix",)
#: how long the sockets of a cleared namespace may take to go (loopback closings take microseconds)
_SOCKETS_GONE_S = 2.0
_MAX_FDS = 8
_FD = struct.Struct("i")


def recv_fds(sock: _socket.socket, size: int = 1 << 20) -> Tuple[bytes, List[int]]:
    """One message and the descriptors that came with it, each closed on exec (no process started
    later inherits one: a zygote's control socket, a pidfd)."""
    msg, ancillary, _flags, _addr = sock.recvmsg(size, _socket.CMSG_LEN(_MAX_FDS * _FD.size), _socket.MSG_CMSG_CLOEXEC)
    fds: List[int] = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [fd for (fd,) in _FD.iter_unpack(data[:len(data) - len(data) % _FD.size])]
    return msg, fds


def send_fds(sock: _socket.socket, msg: bytes, fds: List[int]) -> None:
    ancillary = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, b"".join(_FD.pack(fd) for fd in fds))] if fds else []
    sock.sendmsg([msg], ancillary)


def encode(message: Dict[str, Any]) -> bytes:
    """A message on the control socket: between the runner and its own zygote only, both trusted, so
    ``marshal`` (built in: the zygote imports no JSON at its start)."""
    return marshal.dumps(message)


def decode(data: bytes) -> Dict[str, Any]:
    said = marshal.loads(data)
    if not isinstance(said, dict):
        raise ValueError("not a message")
    return said


def _sysctl(path: str, value: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return  # not in this kernel: the socket check after each process still holds
    try:
        os.write(fd, value)
    finally:
        os.close(fd)


def _sockets_left() -> int:
    left = 0
    for table in _SOCKET_TABLES:
        try:
            with open(table, "rb") as f:
                left += max(f.read().count(b"\n") - 1, 0)  # the first line is the header
        except FileNotFoundError:
            continue  # no IPv6 in this kernel
    return left


def clear(net: bool) -> bool:
    """Kill and reap every process of the namespace but this one; at ``net``, wait until no socket is
    left. False when it cannot be cleared (the namespace must not be used again)."""
    strangers = 0
    while True:
        try:
            os.kill(-1, _SIGKILL)
        except ProcessLookupError:
            break  # no process but this one
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            # a process of the namespace that is not a descendant of its init: only one that entered
            # it from outside (setns, which needs privilege) could be
            strangers += 1
            if strangers > 100:
                return False
            time.sleep(0.001)
    if not net:
        return True
    deadline = time.monotonic() + _SOCKETS_GONE_S
    while _sockets_left():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)
    return True


def _spawn(req: Dict[str, Any], fds: List[int], last_pid: Optional[int]) -> int:
    """Start the requested process; its pid: a session of its own, its uid without supplementary
    groups, its directory, umask and stdio, every other descriptor closed, the signals Python
    ignores back to their defaults. Started by ``privs.spawn`` (a vfork: no copy of the zygote's page
    tables, no copy-on-write fault in either process until the exec; about a millisecond less per
    process than ``subprocess``'s fork, which a change of uid in the child needs), which cannot change
    a uid between its vfork and the exec. So a thread of the zygote takes the process's ids (the
    system calls, which change that thread's only: the zygote itself, pid 1, stays root throughout,
    so nothing the process does can reach it) and starts it: real and effective uid and gid the
    process's, the saved ones root's, no supplementary group (dropped once: ``serve``). The exec makes
    the saved ids the effective ones: the process has its uid in all four, and no capability (none is
    kept through an exec whose real and effective uids are not root; the bounding and inheritable sets
    are empty, no new privileges). Between the vfork and the exec only libc runs. The thread ends with
    the start. The directory is entered as root, as ``subprocess`` does before its change of uid; the
    program is looked for as ``subprocess`` does (the process's PATH, as its uid). Where a thread's
    ids cannot be taken on their own (``privs.can_take_thread_ids``) or libc cannot start a session,
    ``subprocess`` (a fork) changes them in the child."""
    argv, env, uid = req["argv"], req["env"], req["uid"]
    if not (privs.can_spawn() and privs.can_take_thread_ids()):
        import subprocess

        if last_pid is not None:
            os.pwrite(last_pid, b"1", 0)  # its first process is pid 2, as in a namespace of its own
        proc = subprocess.Popen(argv, env=env, cwd=req["cwd"], stdin=fds[0], stdout=fds[1], stderr=fds[2],
                                start_new_session=True, user=uid, group=uid, extra_groups=[], umask=req["umask"],
                                close_fds=True, restore_signals=True)
        _POPENS[proc.pid] = proc
        return proc.pid
    for fd in fds:
        os.set_inheritable(fd, False)  # what the child gets is its 0, 1, 2 only
    # looked up before the thread takes the ids: nothing is imported as the process's uid
    paths = [argv[0]] if "/" in argv[0] else [os.path.join(d, argv[0]) for d in env.get("PATH", os.defpath).split(":")]

    def start() -> int:
        if last_pid is not None:
            os.pwrite(last_pid, b"1", 0)  # the process is pid 2 (this thread has another), as in a namespace of its own
        privs.take_thread_ids(uid, 0)
        return _exec_first(paths, argv, env, fds)

    os.chdir(req["cwd"])
    try:
        os.umask(req["umask"])
        if last_pid is not None:
            os.pwrite(last_pid, b"2", 0)  # the thread is pid 3: 2 is left for the process
        return _in_thread(start)
    finally:
        os.chdir("/")  # no attempt's directory kept busy by the zygote
        # a change of ids (the thread's) makes the process dumpable as the sysctl says: not the zygote
        privs._check(privs.libc().prctl(privs._PR_SET_DUMPABLE, 0, 0, 0, 0), "not dumpable")


def _in_thread(call: "Callable[[], int]") -> int:
    """``call()`` on a thread of its own, which ends with it; what it returned or raised."""
    done = _thread.allocate_lock()
    done.acquire()
    said: List[Any] = []

    def run() -> None:
        try:
            said.append(call())
        except BaseException as exc:  # noqa: B036 (raised again by the caller)
            said.append(exc)
        finally:
            done.release()

    _thread.start_new_thread(run, ())
    done.acquire()
    if isinstance(said[0], BaseException):
        raise said[0]
    return int(said[0])


def _exec_first(paths: List[str], argv: List[str], env: Dict[str, str], fds: List[int]) -> int:
    """Start the first of ``paths`` that execs, as ``subprocess`` does: a missing one (looked at first,
    as the process's uid, so no start is spent on it) is passed over, and the first other error is
    raised when none execs."""
    first, last = 0, _ENOENT
    for path in paths:
        try:
            os.stat(path)
            return privs.spawn(path, argv, env, fds[:3], _DEFAULTS)
        except OSError as exc:
            last = exc.errno or 0
            if last not in (_ENOENT, _ENOTDIR) and not first:
                first = last
    err = first or last
    raise OSError(err, os.strerror(err), argv[0])


def _start(req: Dict[str, Any], fds: List[int], last_pid: Optional[int]) -> int:
    """Start the requested process (``_spawn``) in an IPC namespace of its own (SysV IPC objects and
    POSIX queues outlive their processes: the zygote moves to a new one first, which its child
    inherits and the previous one's processes were the last to hold) and a session keyring of its
    own; its pid."""
    privs._check(privs.libc().unshare(privs._CLONE_NEWIPC), "unshare --ipc")
    privs.new_session_keyring()  # the same for keys: a session keyring the previous process never had
    return _spawn(req, fds, last_pid)


def _run(ctl: _socket.socket, req: Dict[str, Any], fds: List[int], net: bool, last_pid: Optional[int]) -> bool:
    """One request: start, report, wait, clear, report. False when the namespace is not reusable."""
    try:
        pid = _start(req, fds, last_pid)
    except OSError as exc:
        errno = getattr(exc, "errno", None) or 0
        failed = {"errno": errno, "where": str(exc), "filename": getattr(exc, "filename", None)}
        clean = clear(net)
        ctl.send(encode(failed))
        return clean
    finally:
        for fd in fds:
            os.close(fd)
    pidfd = os.pidfd_open(pid)
    try:
        send_fds(ctl, encode({}), [pidfd])
    finally:
        os.close(pidfd)
    while True:
        got, status = os.waitpid(-1, 0)  # orphans the init inherits are reaped as they end
        if got == pid:
            break
    if pid in _POPENS:  # reaped here: ``subprocess`` must never look for it again
        _POPENS.pop(pid).returncode = os.waitstatus_to_exitcode(status)
    clean = clear(net)
    ctl.send(encode({"status": status, "clean": clean}))
    return clean


def serve(fd: int, net: bool) -> None:
    """The zygote's loop on its control socket ``fd``. Never returns."""
    try:
        if os.getpid() != 1:  # kill(-1) anywhere but in a namespace of its own would reach the host
            raise RuntimeError("not the first process of a PID namespace")
        libc = privs.libc()
        privs._check(libc.prctl(privs._PR_SET_DUMPABLE, 0, 0, 0, 0), "not dumpable")
        ctl = _socket.socket(fileno=fd)
        privs._for_children(libc, privs._last_cap())
        os.setgroups([])  # its processes have none: they take its groups (``_spawn``)
        # nothing of the namespace may interrupt it: an init gets only the signals it handles
        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        _DEFAULTS[:] = _defaults()
        for name in os.listdir("/proc/self/fd"):  # its control socket, a sealed zipapp: never
            if int(name) > 2:  # a child's (``privs.spawn`` closes only close-on-exec ones)
                try:
                    os.set_inheritable(int(name), False)
                except OSError:
                    continue  # the listing's own descriptor, closed since
        privs.refuse_keys(libc, privs.key_filter())  # its processes' uids are drawn again: no key outlives them
        if net:
            # no TIME_WAIT socket outlives its processes, and no TCP metrics are kept for the next
            _sysctl("/proc/sys/net/ipv4/tcp_max_tw_buckets", b"0")
            _sysctl("/proc/sys/net/ipv4/tcp_no_metrics_save", b"1")
        try:
            last_pid: Optional[int] = os.open("/proc/sys/kernel/ns_last_pid", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            last_pid = None
        while True:
            msg, fds = recv_fds(ctl)
            if not msg:
                os._exit(0)  # the runner closed its end: nothing more to start
            if not _run(ctl, decode(msg), fds, net, last_pid):
                os._exit(3)
    except BaseException as exc:
        with_msg = f"crosshost zygote: {exc}\n"
        try:
            os.write(2, with_msg.encode())
        finally:
            os._exit(1)


if __name__ == "__main__":  # pragma: no cover - started by ``zygote.Zygote`` through -c
    serve(int(sys.argv[1]), sys.argv[2] == "net")
