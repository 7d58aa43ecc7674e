"""A slot's namespace init (the zygote): the first process of a PID, mount and network namespace
made once per slot, which starts every process of that slot's attempts in turn and clears the
namespaces after each.

Started by the runner (``zygote.Zygote``) as ``python -I -S`` in namespaces the runner's fork made
(a fresh /proc; at ``netns+`` only a loopback, up), root, pid 1, not dumpable, dying with the runner
(parent-death signal: the kernel then kills every process of the namespace). It reads one request
at a time from its control socket (a Unix socket pair, descriptors passed with ``SCM_RIGHTS``): the
command line, environment, working directory and uid of one process, and its stdin, stdout and
stderr. It forks it (pid 2, as a fresh namespace's first child would be), which starts a session
of its own, takes its uid (``privs._become``: no capability, no new privilege) and execs; the reply
is a pidfd of it (the runner reads its pid there) or the error that stopped it before its exec.
When that process has ended the zygote kills every other process of the namespace (``kill(-1)``
from a PID namespace's init reaches all of it but the init), reaps them all, waits until the
network namespace holds no socket, and only then says how the process ended: the next request
never shares the namespaces with anything the previous one left. A namespace it cannot clear is
not reused: it says so and exits (the kernel ends the namespaces with it).

Imports nothing of the runner but ``privs``: its start is paid once per slot. Python 3.9.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import json
import os
import signal
import socket
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


def recv_fds(sock: socket.socket, size: int = 1 << 20) -> Tuple[bytes, List[int]]:
    """One message and the descriptors that came with it."""
    fds = array.array("i")
    msg, ancillary, _flags, _addr = sock.recvmsg(size, socket.CMSG_LEN(_MAX_FDS * fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return msg, list(fds)


def send_fds(sock: socket.socket, msg: bytes, fds: List[int]) -> None:
    sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else [])


def _sysctl(path: str, value: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return  # not in this kernel: the socket check after each process still holds
    try:
        os.write(fd, value)
    finally:
        os.close(fd)


def _close_above(low: int, keep: int) -> None:
    """Close every descriptor above ``low`` but ``keep``: by range (``close_range``, Linux 5.9; a
    loop over every possible number would take a million calls), else those ``/proc/self/fd`` lists."""
    libc = privs.libc()
    for first, last in ((low + 1, keep - 1), (keep + 1, 0xFFFFFFFF)):
        if first <= last and libc.syscall(privs._SYS_CLOSE_RANGE, ctypes.c_uint(first), ctypes.c_uint(last),
                                           ctypes.c_uint(0)) != 0:
            for name in os.listdir("/proc/self/fd"):
                if first <= int(name) <= last:
                    with contextlib.suppress(OSError):
                        os.close(int(name))


def _child(req: Dict[str, Any], fds: List[int], err: int, last_cap: int) -> None:
    """The requested process, before its exec. Never returns."""
    where = "start"
    try:
        os.setsid()
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)  # dup2 leaves the copy inheritable
        _close_above(2, keep=err)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # ignored by Python; a program expects them default
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        os.umask(req["umask"])
        # SysV IPC objects and POSIX queues outlive their processes: each process has its own
        privs._check(privs.libc().unshare(privs._CLONE_NEWIPC), "unshare --ipc")
        where = "chdir"
        os.chdir(req["cwd"])
        where = "uid"
        privs._become(privs.libc(), req["uid"], last_cap)
        where = "exec"
        os.execvpe(req["argv"][0], req["argv"], req["env"])
    except OSError as exc:
        with_name = req["cwd"] if where == "chdir" else req["argv"][0] if where == "exec" else None
        os.write(err, json.dumps({"errno": exc.errno, "where": where, "filename": with_name}).encode())
    except BaseException as exc:  # never back into the zygote's loop
        os.write(err, json.dumps({"errno": 0, "where": f"{where}: {exc}", "filename": None}).encode())
    finally:
        os._exit(127)


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


def _run(ctl: socket.socket, req: Dict[str, Any], fds: List[int], net: bool, last_cap: int,
         last_pid: Optional[int]) -> bool:
    """One request: start, report, wait, clear, report. False when the namespace is not reusable."""
    if last_pid is not None:
        os.pwrite(last_pid, b"1", 0)  # its first process is pid 2, as in a namespace of its own
    err_read, err_write = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        _child(req, fds, err_write, last_cap)
    os.close(err_write)
    for fd in fds:
        os.close(fd)
    failed = b""
    while True:
        chunk = os.read(err_read, 4096)
        if not chunk:
            break
        failed += chunk
    os.close(err_read)
    if failed:
        os.waitpid(pid, 0)
        clean = clear(net)
        ctl.send(failed)
        return clean
    pidfd = os.pidfd_open(pid)
    try:
        send_fds(ctl, b"{}", [pidfd])
    finally:
        os.close(pidfd)
    while True:
        got, status = os.waitpid(-1, 0)  # orphans the init inherits are reaped as they end
        if got == pid:
            break
    clean = clear(net)
    ctl.send(json.dumps({"status": status, "clean": clean}).encode())
    return clean


def serve(fd: int, net: bool) -> None:
    """The zygote's loop on its control socket ``fd``. Never returns."""
    try:
        if os.getpid() != 1:  # kill(-1) anywhere but in a namespace of its own would reach the host
            raise RuntimeError("not the first process of a PID namespace")
        libc = privs.libc()
        privs._check(libc.prctl(privs._PR_SET_DUMPABLE, 0, 0, 0, 0), "not dumpable")
        ctl = socket.socket(fileno=fd)
        last_cap = privs._last_cap()
        # what ``os.execvpe`` imports on first use (``warnings``), imported now: a process of another
        # uid may not read the interpreter's library
        os.get_exec_path({"PATH": os.defpath})
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
            if not _run(ctl, json.loads(msg), fds, net, last_cap, last_pid):
                os._exit(3)
    except BaseException as exc:
        with_msg = f"crosshost zygote: {exc}\n"
        try:
            os.write(2, with_msg.encode())
        finally:
            os._exit(1)


if __name__ == "__main__":  # pragma: no cover - started by ``zygote.Zygote`` through -c
    serve(int(sys.argv[1]), sys.argv[2] == "net")
