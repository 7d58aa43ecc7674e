"""The few system calls the sandbox makes that Python's ``os`` lacks (namespaces, mounts,
capabilities), through libc: shared by the runner's forks (``sandbox``) and the slot's namespace
init (``zygote_init``), which imports nothing else of the runner. Standard library only, Python 3.9.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

# A slot's zygote imports this module and nothing else of the runner: only what it calls is imported
# here (its start is paid once per run on every host). What only the runner calls imports the rest
# where it is called (the runner has imported it before any fork that calls it).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import Dict, List, Optional, Sequence, Tuple

_PR_SET_PDEATHSIG = 1
_SYS_CLOSE_RANGE = 436  # the same number on every Linux architecture (5.9+)
_CLONE_NEWNS = 0x00020000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
_MS_SLAVE = 0x80000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_NOATIME, _MS_NODIRATIME, _MS_STRICTATIME = 0x1, 0x20, 0x1000, 0x400, 0x800, 1 << 24
_MNT_DETACH = 2
_PR_SET_DUMPABLE = 4
_libc_handle: Optional[ctypes.CDLL] = None
_pylibc: Optional[ctypes.PyDLL] = None


_PR_SET_CHILD_SUBREAPER = 36
_subreaper = False


def make_subreaper() -> bool:
    """Make this process its descendants' reaper: one whose parent ends becomes this process's child,
    not init's (Linux 3.4+), so a process that has no child left has no descendant left. False where
    the kernel refuses (``is_subreaper`` then says so)."""
    global _subreaper
    if not _subreaper and sys.platform.startswith("linux"):
        _subreaper = libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return _subreaper


def is_subreaper() -> bool:
    """Whether ``make_subreaper`` made this process its descendants' reaper."""
    return _subreaper


def libc() -> ctypes.CDLL:
    """libc, loaded by the runner before it forks (a child must not be the first to load it)."""
    global _libc_handle, _pylibc
    if _libc_handle is None:
        _libc_handle = ctypes.CDLL(None, use_errno=True)
        # the same library, called with the interpreter's lock held (``_fork``: a child whose lock
        # another thread held could never run Python)
        _pylibc = ctypes.PyDLL(None, use_errno=True)
    return _libc_handle


def pylibc() -> Optional[ctypes.PyDLL]:
    """libc called with the interpreter's lock held (loaded with ``libc``; None before)."""
    return _pylibc


#: ``keyctl``'s system call number by machine (glibc has no wrapper; libkeyutils may be absent)
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "armv7l": 311, "armv6l": 311, "i686": 288,
               "i386": 288, "ppc64le": 271, "ppc64": 271, "s390x": 280}
_KEYCTL_JOIN_SESSION_KEYRING = 1


def new_session_keyring() -> None:
    """Join a new anonymous session keyring, which the processes started next inherit (and possess:
    a process may add keys to its session keyring and read them, whatever its uid). Without it they
    would share the runner's (sshd's ``pam_keyinit`` gives every login one): a key one attempt put
    there, or the runner's own, would be the next attempt's to read. A kernel without keys (ENOSYS)
    has no keyring to share; a machine whose call number is not known here is refused (raised)."""
    machine = os.uname().machine
    number = _SYS_KEYCTL.get(machine)
    if number is None:
        raise OSError(0, f"keyctl: the system call's number on {machine} is not known")
    if libc().syscall(number, _KEYCTL_JOIN_SESSION_KEYRING, None) < 0 and ctypes.get_errno() != 38:  # ENOSYS
        err = ctypes.get_errno()
        raise OSError(err, f"keyctl join session keyring: {os.strerror(err)}")


#: the key system calls (add_key, request_key, keyctl) by machine: (its audit arch, their numbers),
#: and those of the 32-bit calls the same kernel may take from it (x86_64's i386, aarch64's arm,
#: riscv64's rv32, ppc64le's ppc32); x86_64's x32 calls are its own numbers with bit 30 set. A call of
#: any other architecture is refused whatever it is: the filter cannot tell what its numbers mean.
_KEY_CALLS = {
    "x86_64": ((0xC000003E, (248, 249, 250)), (0x40000003, (286, 287, 288))),
    "aarch64": ((0xC00000B7, (217, 218, 219)), (0x40000028, (309, 310, 311))),
    "riscv64": ((0xC00000F3, (217, 218, 219)), (0x400000F3, (217, 218, 219))),
    "ppc64le": ((0xC0000015, (269, 270, 271)), (0x00000014, (269, 270, 271))),
}
_X32 = 0x40000000
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_RET_ALLOW, _RET_EPERM = 0x7FFF0000, 0x00050000 | 1
_LD_ABS, _JEQ, _RET = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


_built: Dict[str, Optional[_SockFprog]] = {}


def key_filter() -> Optional[_SockFprog]:
    """``key_program`` for this machine, built once per process (every start installs the same one)."""
    machine = os.uname().machine
    if machine not in _built:
        _built[machine] = key_program(machine)
    return _built[machine]


def key_program(machine: str) -> Optional[_SockFprog]:
    """A seccomp filter that refuses the key system calls (EPERM, as Docker's default profile does)
    but ``keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)``: an attempt's uid is drawn again by later
    attempts, and a key in its user keyrings (``@u``, ``@us``, its persistent one) would outlive it
    for them to read; joining a new anonymous session keyring (the zygote does, before each process)
    shares nothing. None on a machine not listed (little-endian ones only: the argument checks read
    the low word first)."""
    calls = _KEY_CALLS.get(machine)
    if calls is None:
        return None
    (arch, (add_key, request_key, keyctl)), (compat_arch, compat_calls) = calls
    # (label, code, k, jump to if equal, if not): a jump names a label (None: the next instruction)
    prog: List[Tuple[Optional[str], int, int, Optional[str], Optional[str]]] = [
        (None, _LD_ABS, 4, None, None),  # seccomp_data.arch
        (None, _JEQ, arch, "native", None),
        (None, _JEQ, compat_arch, "compat", "deny"),
        ("native", _LD_ABS, 0, None, None),  # seccomp_data.nr
        (None, _JEQ, keyctl, "keyctl", None),
    ]
    refused = [add_key, request_key] + ([_X32 | n for n in (add_key, request_key, keyctl)] if arch == 0xC000003E else [])
    prog += [(None, _JEQ, n, "deny", None) for n in refused]
    prog += [
        (None, _RET, _RET_ALLOW, None, None),
        ("keyctl", _LD_ABS, 16, None, None),  # args[0], an int: its low word
        (None, _JEQ, _KEYCTL_JOIN_SESSION_KEYRING, None, "deny"),
        (None, _LD_ABS, 24, None, None),  # args[1]: NULL, both words
        (None, _JEQ, 0, None, "deny"),
        (None, _LD_ABS, 28, None, None),
        (None, _JEQ, 0, "allow", "deny"),
        ("compat", _LD_ABS, 0, None, None),
    ]
    prog += [(None, _JEQ, n, "deny", None) for n in compat_calls]
    prog += [("allow", _RET, _RET_ALLOW, None, None), ("deny", _RET, _RET_EPERM, None, None)]
    at = {label: i for i, (label, *_rest) in enumerate(prog) if label is not None}

    def jump(i: int, to: Optional[str]) -> int:
        return 0 if to is None else at[to] - i - 1

    built = (_SockFilter * len(prog))(*(_SockFilter(code, jump(i, jt), jump(i, jf), k)
                                        for i, (_label, code, k, jt, jf) in enumerate(prog)))
    fprog = _SockFprog(len(prog), ctypes.cast(built, ctypes.POINTER(_SockFilter)))
    _FILTERS.append(built)  # the array lives as long as the program
    return fprog


_FILTERS: List[ctypes.Array] = []


def refuse_keys(libc: ctypes.CDLL, fprog: Optional[_SockFprog]) -> None:
    """Install ``key_filter`` in this process (before its exec; kept by every child and exec after)."""
    if fprog is not None:
        _check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp: refuse the key calls")


_POSIX_SPAWN_SETSIGDEF = 0x04
_POSIX_SPAWN_SETSID = 0x80
#: glibc's own signals (thread cancellation, set*id across threads): its ``posix_spawn`` ignores them
#: in the child, and they stay ignored after the exec, unless they are in the child's default set
LIBC_SIGNALS = (32, 33)
_spawn_ok: Optional[bool] = None


def _spawn_attr(attr: ctypes.Array) -> bool:
    """Whether this libc's ``posix_spawn`` starts a session (glibc 2.26, musl 1.1.24 on)."""
    c = libc()
    c.posix_spawnattr_init(attr)
    return c.posix_spawnattr_setflags(attr, ctypes.c_short(_POSIX_SPAWN_SETSIGDEF | _POSIX_SPAWN_SETSID)) == 0


def can_spawn() -> bool:
    """Whether ``spawn`` works here (tried once)."""
    global _spawn_ok
    if _spawn_ok is None:
        attr = ctypes.create_string_buffer(1024)
        try:
            _spawn_ok = _spawn_attr(attr)
            libc().posix_spawnattr_destroy(attr)
        except AttributeError:  # no posix_spawn in this libc
            _spawn_ok = False
    return _spawn_ok


def spawn(path: str, argv: Sequence[str], env: Dict[str, str], stdio: Sequence[int], defaults: Sequence[int]) -> int:
    """``posix_spawn`` (a vfork: nothing of the caller is copied) of ``path`` with ``argv`` and ``env``,
    in a session of its own, ``stdio`` as its 0, 1, 2, the signals ``defaults`` (by number: libc's own
    too, which ``os.posix_spawn`` cannot name) back to their default; its pid. Every other descriptor
    of the caller must be close-on-exec. Raises the exec's error (``OSError``); ``ValueError`` for a
    NUL byte in an argument. Only where ``can_spawn``."""
    args = [os.fsencode(a) for a in argv]
    environ = [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()]
    if any(b"\0" in a for a in (*args, *environ)):
        raise ValueError("embedded null byte")
    c = libc()
    attr, actions = ctypes.create_string_buffer(1024), ctypes.create_string_buffer(1024)  # glibc: 336 and 80 bytes
    if not _spawn_attr(attr):
        raise OSError(22, "posix_spawn: no session of its own in this libc")
    try:
        word = 8 * ctypes.sizeof(ctypes.c_ulong)
        mask = (ctypes.c_ulong * (1024 // word))()  # a sigset_t, set by bit as libc reads it
        for sig in defaults:
            mask[(sig - 1) // word] |= 1 << ((sig - 1) % word)
        c.posix_spawnattr_setsigdefault(attr, mask)
        c.posix_spawn_file_actions_init(actions)
        try:
            for target, fd in enumerate(stdio):
                err = c.posix_spawn_file_actions_adddup2(actions, fd, target)
                if err:
                    raise OSError(err, os.strerror(err))
            pid = ctypes.c_int()
            err = c.posix_spawn(ctypes.byref(pid), os.fsencode(path), actions, attr,
                                (ctypes.c_char_p * (len(args) + 1))(*args, None),
                                (ctypes.c_char_p * (len(environ) + 1))(*environ, None))
            if err:
                raise OSError(err, os.strerror(err))
            return pid.value
        finally:
            c.posix_spawn_file_actions_destroy(actions)
    finally:
        c.posix_spawnattr_destroy(attr)


#: (setresuid, setresgid) by machine: the system calls themselves, which change the calling thread's
#: ids only (libc's wrappers change every thread's)
_SYS_SETRESID = {"x86_64": (117, 119), "aarch64": (147, 149), "riscv64": (147, 149)}


def can_take_thread_ids() -> bool:
    return os.uname().machine in _SYS_SETRESID


def take_thread_ids(uid: int, saved: int) -> None:
    """This thread's real and effective uid and gid ``uid``, the saved ones ``saved``; the process's
    other threads keep theirs. Only where ``can_take_thread_ids``."""
    set_uid, set_gid = _SYS_SETRESID[os.uname().machine]
    c = libc()
    for number in (set_gid, set_uid):  # the gid while still root
        if c.syscall(number, uid, uid, saved) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setres{'u' if number == set_uid else 'g'}id: {os.strerror(err)}")


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_CAP_V3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63


def _become(libc: ctypes.CDLL, uid: int, last_cap: int) -> None:
    """What ``setpriv --reuid=U --regid=U --clear-groups --no-new-privs --inh-caps=-all
    --bounding-set=-all`` does, in the attempt's process before its exec (no program started for it)."""
    for cap in range(last_cap + 1):
        _check(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), "drop the bounding set")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # from root to another uid: the permitted, effective and ambient sets empty
    header, data = _CapHeader(_CAP_V3, 0), (_CapData * 2)()
    _check(libc.capset(ctypes.byref(header), data), "clear the inheritable set")
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no new privileges")


def _for_children(libc: ctypes.CDLL, last_cap: int) -> None:
    """In a process that never execs and whose children take another uid before their exec (a
    slot's zygote): what ``_become`` takes from each child, taken from it once, for every child to
    inherit: the bounding and inheritable sets emptied (the ambient set with it), no new privileges.
    Its own effective and permitted sets stay (it changes uids, kills, writes sysctls); a child loses
    them when it changes its uid."""
    for cap in range(last_cap + 1):
        _check(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), "drop the bounding set")
    header, data = _CapHeader(_CAP_V3, 0), (_CapData * 2)()
    _check(libc.capget(ctypes.byref(header), data), "read the capabilities")
    for half in data:
        half.inheritable = 0
    _check(libc.capset(ctypes.byref(header), data), "clear the inheritable set")
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no new privileges")


def _loopback(port: Optional[int]) -> Optional[socket.socket]:
    """In the init, inside its new network namespace: bring the loopback up (nothing else is there)
    and, for a forwarder, listen on 127.0.0.1:``port`` before the attempt exists (it never finds the
    port closed)."""
    import fcntl
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        got = fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack("16sH14x", b"lo", 0))
        flags = struct.unpack("16sH14x", got)[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))
    if port is None:
        return None
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    return listener


def _handled_signals() -> List[int]:
    """The signals this process handles in Python (the runner's), to be set back to their default in
    its forks: an init ignores every signal it has no handler for, and a copy of the runner's handler
    would run the runner's code. Read by number (``valid_signals`` builds an enum per signal)."""
    import signal

    handled = []
    for sig in range(1, signal.NSIG):
        try:
            if callable(signal.getsignal(sig)):
                handled.append(sig)
        except (OSError, ValueError):
            continue
    return handled


class _NoNamespace(Exception):
    """The PID namespace could not be made (the kernel refused it); ``errno`` says why."""

    def __init__(self, message: str, errno: Optional[int] = None) -> None:
        super().__init__(message)
        self.errno = errno


class _PidNamespace:
    """The calling thread's next child forked as the first process (the init) of a new PID namespace:
    what the holder's fork after its ``unshare`` did, without the holder. Root only (no user namespace
    is needed, and one could not be made in a process with threads), and only where the runner may
    come back to its own PID namespace (``usable``: root of a user namespace of its own may not, and
    a thread whose children's namespace has lost its init could fork nothing any more)."""

    _own: Optional[int] = None  # the runner's own PID namespace, kept open to come back to
    _usable: Optional[bool] = None

    @classmethod
    def usable(cls) -> bool:
        if cls._usable is None:
            try:
                cls._own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
                cls._usable = libc().setns(cls._own, _CLONE_NEWPID) == 0  # to where it is: nothing changes
            except OSError:
                cls._usable = False
        return cls._usable

    @classmethod
    def for_children(cls) -> "_ChildrenInNewPidNamespace":
        return _ChildrenInNewPidNamespace()


class _ChildrenInNewPidNamespace:
    """``_PidNamespace.for_children``: while entered, this thread's children fork into a new PID
    namespace (a class, not ``contextlib``: the zygote imports this module)."""

    def __enter__(self) -> None:
        if libc().unshare(_CLONE_NEWPID) != 0:  # this thread's children only (the namespaces are per thread)
            err = ctypes.get_errno()
            raise _NoNamespace(f"unshare: {os.strerror(err)}", err)

    def __exit__(self, *exc: object) -> None:
        # back to its own: every later child of this thread (another attempt's, a tool's) forks
        # where the runner is
        _check(libc().setns(_PidNamespace._own or -1, _CLONE_NEWPID), "setns back to the runner's PID namespace")


if TYPE_CHECKING:
    #: (path, the flags its remount keeps, read-only): the steps of ``shield_home``
    ShieldStep = Tuple[bytes, int, bool]


def _kept_flags(path: str) -> int:
    """The flags a remount of ``path``'s mount must keep: in a user namespace the kernel refuses to
    clear those its mount had (nosuid, nodev, noexec, the atime mode), as ``bwrap`` keeps them."""
    f = os.statvfs(path).f_flag
    flags = (_MS_NOSUID if f & os.ST_NOSUID else 0) | (_MS_NODEV if f & os.ST_NODEV else 0) | (
        _MS_NOEXEC if f & os.ST_NOEXEC else 0)
    if f & os.ST_NOATIME:
        flags |= _MS_NOATIME
    elif not f & getattr(os, "ST_RELATIME", 4096):
        flags |= _MS_STRICTATIME
    return flags | (_MS_NODIRATIME if f & os.ST_NODIRATIME else 0)


def home_shield(home: Optional[str], writable: Sequence[str]) -> List[ShieldStep]:
    """The steps that make ``home`` (the runner's) read-only in an attempt's mount namespace, with
    each of ``writable`` (the runner's workspace root) below it writable again: an attempt that runs
    as the runner's uid (``pidns``) could otherwise plant what the runner's user runs at its next
    login (``~/.ssh/rc``, ``authorized_keys``, a shell's start-up file). None for a home that is ``/``
    or missing. Worked out by the runner, never in the fork that takes them."""
    if not home:
        return []
    home = os.path.realpath(home)
    if home == "/" or not os.path.isdir(home):
        return []
    reals = [os.path.realpath(path) for path in writable]
    if any(home == real or home.startswith(real.rstrip("/") + "/") for real in reals):
        return []  # the workspace is the home, or holds it: nothing of it can be read-only
    steps: List[ShieldStep] = [(os.fsencode(home), _kept_flags(home), True)]
    steps += [(os.fsencode(real), _kept_flags(real), False) for real in reals
              if real.startswith(home + "/") and os.path.isdir(real)]
    return steps


def shield_home(c: ctypes.CDLL, steps: Sequence[ShieldStep]) -> bool:
    """Take ``home_shield``'s steps in this mount namespace; on any failure undo them (the attempt
    then meets the runner's home as before) and say False."""
    done: List[bytes] = []
    for path, flags, read_only in steps:
        if c.mount(path, path, None, _MS_BIND | _MS_REC, None) != 0:
            break
        done.append(path)
        if c.mount(None, path, None, _MS_BIND | _MS_REMOUNT | flags | (_MS_RDONLY if read_only else 0), None) != 0:
            break
    else:
        return True
    for path in reversed(done):
        c.umount2(path, _MNT_DETACH)
    return False
