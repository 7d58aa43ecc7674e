"""A slot's namespace init (the zygote): the first process of a PID, mount and network namespace
made once per slot, which starts every process of that slot's attempts in turn and clears the
namespaces after each.

Started by the runner (``zygote.Zygote``) as ``python -I -S`` in namespaces the runner's fork made
(a fresh /proc; at ``netns+`` only a loopback, up), root, pid 1, not dumpable, dying with the runner
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

Imports nothing of the runner but ``privs``: its start is paid once per slot. Python 3.9.
"""

from __future__ import annotations

import marshal
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from . import privs

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


def recv_fds(sock: socket.socket, size: int = 1 << 20) -> Tuple[bytes, List[int]]:
    """One message and the descriptors that came with it."""
    msg, ancillary, _flags, _addr = sock.recvmsg(size, socket.CMSG_LEN(_MAX_FDS * _FD.size))
    fds: List[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += [fd for (fd,) in _FD.iter_unpack(data[:len(data) - len(data) % _FD.size])]
    return msg, fds


def send_fds(sock: socket.socket, msg: bytes, fds: List[int]) -> None:
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, b"".join(_FD.pack(fd) for fd in fds))] if fds else []
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
            os.kill(-1, signal.SIGKILL)
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


def _spawn(req: Dict[str, Any], fds: List[int], runner: int) -> "subprocess.Popen[bytes]":
    """Start the requested process: a session of its own, its uid without supplementary
    groups, its directory, umask and stdio, every other descriptor closed, the signals Python
    ignores back to their defaults (``subprocess`` does it in C between its fork and the exec, and
    raises what failed there). Not ``subprocess``'s own change of uid: with one it must fork (a copy
    of the zygote's page tables, copy-on-write faults in both processes until the exec: about a
    millisecond per process), without one it uses vfork (Python 3.10 on). So the zygote takes the process's ids
    itself around the start (single-threaded, nothing else runs meanwhile): real and effective uid
    and gid the process's, the saved ones root's (to take root back after), no supplementary group
    (dropped once: ``serve``). The exec makes the saved ids the effective ones: the process has its
    uid in all four, and no capability (none is kept through an exec whose real and effective uids
    are not root; the bounding and inheritable sets are empty, no new privileges). Between the vfork
    and the exec only the interpreter's C code runs, and no process of that uid can reach the zygote
    or the child meanwhile (their namespace holds nothing else, and no other namespace sees them).
    The directory is entered as root, as ``subprocess`` did before its change of uid."""
    os.chdir(req["cwd"])
    try:
        uid = req["uid"]
        os.setresgid(uid, uid, 0)
        os.setresuid(uid, uid, 0)
        try:
            return subprocess.Popen(req["argv"], env=req["env"], stdin=fds[0], stdout=fds[1], stderr=fds[2],
                                    start_new_session=True, umask=req["umask"], close_fds=True,
                                    restore_signals=True)
        finally:
            _root_again(runner)
    finally:
        os.chdir("/")  # no attempt's directory kept busy by the zygote


def _root_again(runner: int) -> None:
    """Root again after a start (the saved ids are root's), not dumpable and dying with the runner's
    thread again: a change of ids makes a process dumpable as the sysctl says and clears its
    parent-death signal. A runner that ended before the signal was set again is not waited for
    (``runner``: a pidfd of it, readable once it has ended). A zygote that could not is ended: the
    kernel ends its namespaces, and the runner sees it gone."""
    try:
        os.setresuid(0, 0, 0)
        os.setresgid(0, 0, 0)
        libc = privs.libc()
        privs._check(libc.prctl(privs._PR_SET_DUMPABLE, 0, 0, 0, 0), "not dumpable")
        privs._check(libc.prctl(privs._PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "dies with the runner")
        if select.select([runner], [], [], 0)[0]:
            raise RuntimeError("the runner has ended")
    except BaseException:  # noqa: B036 (nothing may go on as another uid, or without the runner)
        os._exit(3)


def _start(req: Dict[str, Any], fds: List[int], runner: int) -> "subprocess.Popen[bytes]":
    """Start the requested process (``_spawn``) in an IPC namespace of its own (SysV IPC objects and
    POSIX queues outlive their processes: the zygote moves to a new one first, which its child
    inherits and the previous one's processes were the last to hold) and a session keyring of its
    own."""
    privs._check(privs.libc().unshare(privs._CLONE_NEWIPC), "unshare --ipc")
    privs.new_session_keyring()  # the same for keys: a session keyring the previous process never had
    return _spawn(req, fds, runner)


def _run(ctl: socket.socket, req: Dict[str, Any], fds: List[int], net: bool, last_pid: Optional[int],
         runner: int) -> bool:
    """One request: start, report, wait, clear, report. False when the namespace is not reusable."""
    if last_pid is not None:
        os.pwrite(last_pid, b"1", 0)  # its first process is pid 2, as in a namespace of its own
    try:
        proc = _start(req, fds, runner)
    except (OSError, subprocess.SubprocessError) as exc:
        errno = getattr(exc, "errno", None) or 0
        failed = {"errno": errno, "where": str(exc), "filename": getattr(exc, "filename", None)}
        clean = clear(net)
        ctl.send(encode(failed))
        return clean
    finally:
        for fd in fds:
            os.close(fd)
    pidfd = os.pidfd_open(proc.pid)
    try:
        send_fds(ctl, encode({}), [pidfd])
    finally:
        os.close(pidfd)
    while True:
        got, status = os.waitpid(-1, 0)  # orphans the init inherits are reaped as they end
        if got == proc.pid:
            break
    # reaped here: ``subprocess`` must never look for it again (its pid is the next process's)
    proc.returncode = os.waitstatus_to_exitcode(status)
    clean = clear(net)
    ctl.send(encode({"status": status, "clean": clean}))
    return clean


def serve(fd: int, net: bool, runner: int) -> None:
    """The zygote's loop on its control socket ``fd`` (``runner``: a pidfd of the runner). Never returns."""
    try:
        if os.getpid() != 1:  # kill(-1) anywhere but in a namespace of its own would reach the host
            raise RuntimeError("not the first process of a PID namespace")
        libc = privs.libc()
        privs._check(libc.prctl(privs._PR_SET_DUMPABLE, 0, 0, 0, 0), "not dumpable")
        ctl = socket.socket(fileno=fd)
        privs._for_children(libc, privs._last_cap())
        os.setgroups([])  # its processes have none: they take its groups (``_spawn``)
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
            if not _run(ctl, decode(msg), fds, net, last_pid, runner):
                os._exit(3)
    except BaseException as exc:
        with_msg = f"crosshost zygote: {exc}\n"
        try:
            os.write(2, with_msg.encode())
        finally:
            os._exit(1)


if __name__ == "__main__":  # pragma: no cover - started by ``zygote.Zygote`` through -c
    serve(int(sys.argv[1]), sys.argv[2] == "net", int(sys.argv[3]))
