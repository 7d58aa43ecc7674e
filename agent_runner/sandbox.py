"""Where an attempt's processes run: out of sight and reach of the runner and the controller.

Every process an attempt starts (the command agent, a shell tool, the predicate) is started through
``Sandbox.popen``. The level is decided once per runner, by trying it (``isolation_probe``):

- ``pidns+uid`` (the runner is root): a new PID and mount namespace (what ``unshare --pid --fork
  --mount --mount-proc --kill-child`` makes, made by the runner's own forks) whose processes run as an
  unprivileged uid of their own (as ``setpriv`` would set it: no new privileges, no capabilities). It sees only its
  own processes in ``/proc``, cannot read any other user's environment, and cannot write the runner's
  files or the bundle cache.
- ``pidns`` (not root, unprivileged user namespaces allowed; or root whose attempt paths another
  user cannot reach): the same namespaces through a user namespace. Ancestors are invisible, so their
  environment cannot be read; files of the runner's uid are still writable (the runner re-checks what
  each attempt is run from, and the controller the bundle before each run).
- ``none``: neither works; the fingerprint carries a ``burn`` finding.

The namespace is also the process tracker: when its first process ends (or is killed, or the runner
dies: parent-death signals), the kernel kills every process in it, even those that started their own
session. No program is started for that: as root the runner's own fork is the namespace's init
(``_PidNamespace``, ``launch._Enter``); at ``pidns`` a fork of the runner enters the namespaces (through a
user namespace, which a process with threads cannot make) and a fork of that is the init. So an
attempt costs its own programs and two forks (three at ``pidns``), not an interpreter's start. The
attempt is the init's child, because a
namespace's init ignores every signal it has no handler for, and the init tells the runner how the
attempt ended on a pipe of its own, because its exit code alone could not (a signal death is 128+N
there, the same as ``exit 137``). At ``pidns+uid`` an attempt's processes are started by its slot's
zygote instead where it can (``zygote``): the same namespaces made once per slot, cleared by their
init after each process. Every process also has an IPC namespace of its own. Standard library only, Python 3.9.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import os
import select
import shutil
import signal
import stat
import subprocess
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from . import privs, zygote
from .launch import NONE, PIDNS, PIDNS_UID, ModelRelay, _Enter, _pdeathsig, failed_entry
from .privs import (
    _NoNamespace,
    _PidNamespace,
)
from .privs import libc as _libc

#: the prefix of a level whose attempts have a network namespace of their own (``netns+pidns+uid``)
NETNS = "netns"

#: each attempt runs as a uid of this range when the runner is root (no account needs to exist)
UID_BASE = 1_990_000_000
UID_SPAN = 1_000_000
#: what a start may meet under load and find gone a moment later: no process to spare (EAGAIN,
#: ENOMEM), the count of namespaces (ENOSPC) or the key quota (EDQUOT) still held by ended attempts'
#: namespaces and keyrings, which the kernel frees a little after they end
_TRANSIENT = (errno.EAGAIN, errno.ENOMEM, errno.EINTR, errno.ENOSPC, errno.EDQUOT)
_TRANSIENT_PAUSES = (0.05, 0.25, 1.0)




def _wrapped(level: str, uid: Optional[int], argv: Sequence[str],
             tracer: Optional[Callable[[List[str]], List[str]]] = None) -> List[str]:
    """What the attempt's process execs at ``level`` when a ``tracer`` wraps it: ``argv`` under
    ``setpriv`` (the change to the attempt's uid), both under the tracer, which runs as the runner's
    uid (its log out of the attempt's reach) and never around the namespace's own processes. Untraced,
    the uid is changed before the exec (``_become``) and this is ``argv``."""
    inner = list(argv)
    if tracer is None:
        return inner
    if level == PIDNS_UID and uid is not None:
        setpriv = system_tool("setpriv") or "setpriv"
        inner = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
                 "--inh-caps=-all", "--bounding-set=-all", "--", *inner]
    return tracer(inner)


def oom_kills() -> Optional[int]:
    """How many processes the kernel's OOM killer has killed since boot (any memory cgroup too), or
    None where the kernel does not say (not Linux, before 4.13)."""
    try:
        fd = os.open("/proc/vmstat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = b"\n" + os.read(fd, 1 << 16)  # the whole file (about 5 KiB) in one read
        finally:
            os.close(fd)
        at = data.find(b"\noom_kill ")
        if at < 0:
            return None
        end = data.find(b"\n", at + 1)
        return int(data[at + 10:end if end >= 0 else len(data)])
    except (OSError, ValueError):
        return None


def level_name(level: str, net: bool) -> str:
    """The ``isolation`` a fingerprint records: ``level``, prefixed ``netns+`` when the network is the
    attempt's own."""
    return NETNS + "+" + level if net and level != NONE else level


def split_level(isolation: str) -> Tuple[str, bool]:
    """(the process level, whether the network is isolated) of a fingerprint's ``isolation``."""
    if isolation.startswith(NETNS + "+"):
        return isolation[len(NETNS) + 1:], True
    return isolation, False


def trusted(path: str) -> bool:
    """``path`` and the directories holding it (as named and as resolved) belong to root or the runner
    and no one else may write them: nothing an attempt planted (in /tmp, as its own uid) qualifies."""
    me = os.geteuid()
    try:
        for target in (path, os.path.dirname(path), os.path.realpath(path), os.path.dirname(os.path.realpath(path))):
            st = os.stat(target)
            if st.st_uid not in (0, me) or st.st_mode & 0o022:
                return False
    except OSError:
        return False
    return True


def system_tool(name: str) -> Optional[str]:
    """The absolute path of a program the runner runs as itself (setpriv, strace): the first on its
    PATH that ``trusted`` accepts. Its PATH is the attempts' (explain may set it to another host's),
    so a program an attempt could have written is never taken."""
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        if not directory or not os.path.isabs(directory):
            continue
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK) and trusted(candidate):
            return candidate
    return None


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


def attempt_uid(taken: Set[int]) -> int:
    """The uid a root runner's attempt runs as: one per attempt (attempts running at once can neither
    read nor write each other's files), unlikely to be any other run's, never one in ``taken`` (the
    uids of this run's attempts still running); added to ``taken``."""
    while True:
        # the kernel's randomness as secrets' (whose import is a few ms of every runner's start); 64 bits
        # modulo the span: a bias below 1e-12
        uid = UID_BASE + int.from_bytes(os.urandom(8), "big") % UID_SPAN
        if uid not in taken:
            taken.add(uid)
            return uid


_user_homes: Dict[int, Optional[str]] = {}


def user_home() -> Optional[str]:
    """The runner's user's home as the password database has it (where sshd looks for ``~/.ssh`` and
    a login shell starts), looked up once per uid; None without one."""
    uid = os.geteuid()
    if uid not in _user_homes:
        try:
            import pwd

            _user_homes[uid] = pwd.getpwuid(uid).pw_dir or None
        except (ImportError, KeyError):
            _user_homes[uid] = None
    return _user_homes[uid]


class Sandbox:
    """The isolation of one attempt: how its processes are started, and what it left behind."""

    def __init__(self, level: str, uid: Optional[int] = None, net: bool = False,
                 writable: Sequence[str] = ()) -> None:
        self.level = level
        #: what stays writable to it below the runner's home, read-only to it at ``pidns`` (the runner's workspace)
        self.writable = tuple(writable)
        self.uid = uid if level == PIDNS_UID else None
        self.net = net and level != NONE
        self.started = time.time()
        self._wrap: Optional[Callable[[List[str]], List[str]]] = None
        self._relay: Optional[Tuple[int, str]] = None  # (port inside, the runner's Unix socket)
        #: an attempt's: its processes may be started by its slot's zygote (``zygote``)
        self.reuse = False

    @contextlib.contextmanager
    def reaching(self, url: str, directory: str) -> Iterator["Sandbox"]:
        """This sandbox whose processes reach the model proxy at ``url`` (``http://127.0.0.1:<port>``)
        and nothing else of the host: inside the attempt's network namespace its init forwards
        127.0.0.1:<port> to a Unix socket in ``directory`` (the runner's own, closed to the attempt's
        uid), which this process relays to ``url``. Without a network namespace, this sandbox."""
        if not self.net:
            yield self
            return
        import urllib.parse  # here: a run whose attempts reach no model does without it (and ipaddress)

        parsed = urllib.parse.urlsplit(url)
        port = parsed.port or 80
        with ModelRelay(os.path.join(directory, "model.sock"), (parsed.hostname or "127.0.0.1", port)) as relay:
            other = copy.copy(self)
            other._relay = (port, relay.path)
            yield other

    def traced(self, wrap: Callable[[List[str]], List[str]]) -> "Sandbox":
        """The same sandbox whose every command line goes through ``wrap`` (a tracer): inside the
        namespace, around the attempt, as the runner's uid (its log out of the attempt's reach under
        ``pidns+uid``), never around the sandbox's own init."""
        other = copy.copy(self)
        other._wrap = wrap
        return other

    def popen(self, argv: Sequence[str], *, again: bool = True, **kwargs: Any) -> "Started":
        """Start ``argv`` in the sandbox, in a session of its own (a ``kill(0)`` inside reaches only the
        sandbox) that dies with the runner. ``kwargs`` go to ``subprocess.Popen``. ``again``: a start
        the kernel refused before any process of it ran, for want of a resource another process may
        free (a fork, a namespace under load), is tried again, three times at most."""
        for pause in _TRANSIENT_PAUSES if again else ():
            try:
                return Started(self, argv, self._wrap, kwargs)
            except StartRefused as exc:
                if exc.errno not in _TRANSIENT:
                    raise
            time.sleep(pause)
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


#: every process started here that may still run (``kill_every_started``)
_live: "weakref.WeakSet[Started]" = weakref.WeakSet()
_live_lock = threading.Lock()


def kill_every_started() -> None:
    """SIGKILL to every process started here that has not ended, and what it started (the runner's
    Ctrl-C): each through its own ``kill_group``, never by a pid another thread may have reaped."""
    with _live_lock:
        started = list(_live)
    for proc in started:
        proc.kill_group()


class StartRefused(OSError):
    """A start refused before any process of it ran (the namespaces, the fork): safe to try again."""


class Started(subprocess.Popen[bytes]):
    """A process started in a sandbox: its ``returncode`` is the attempt's own (``-9`` for a SIGKILL
    death, as ``subprocess`` says it), read from the init's status pipe; ``oom_killed`` says whether
    the kernel's OOM killer ran while it did."""

    def __init__(self, box: Sandbox, argv: Sequence[str], tracer: Optional[Callable[[List[str]], List[str]]],
                 kwargs: Dict[str, Any]) -> None:
        self._status: Optional[int] = None  # the read end of the init's status pipe
        self._oom_before = oom_kills()
        self._oom_after: Optional[int] = None
        # a pidfd of the process (from its zygote, or opened while it is the runner's unreaped child):
        # it names that process only, never another that takes its pid once it is reaped
        self._pidfd: Optional[int] = None
        self._pidfd_lock = threading.Lock()
        # started by its slot's zygote (its namespaces made once, cleared after each process)
        self._zygote: Optional[zygote.Zygote] = None
        self._uid = box.uid if box.uid is not None else -1
        if box.reuse and tracer is None and box._relay is None and box.uid is not None and _PidNamespace.usable():
            self._zygote = zygote.take(box.net)
        if self._zygote is not None:
            try:
                super().__init__(list(argv), start_new_session=True, **kwargs)
                with _live_lock:
                    _live.add(self)
                return
            except zygote.ZygoteLost:
                self._zygote = None  # gone before it started anything: the per-process way
                # Popen closed the /dev/null it opened but keeps its number, which the start below
                # would take for its own again (and close, whatever then has that number)
                self.__dict__.pop("_devnull", None)
        write_end = None
        if box.level != NONE:
            self._status, write_end = os.pipe()
        full = _wrapped(box.level, box.uid, argv, tracer)
        preexec: Optional[Callable[[], None]] = None
        if os.name == "posix":
            _libc()  # loaded here, never first in the child
            preexec = _pdeathsig
        direct = write_end is not None and box.level == PIDNS_UID and _PidNamespace.usable()
        if write_end is not None:
            shield = privs.home_shield(user_home(), box.writable) if box.level == PIDNS else []
            preexec = _Enter(box.level, write_end, box.net, box._relay, box.uid if tracer is None else None,
                             direct=direct, shield=shield)
        try:
            with _PidNamespace.for_children() if direct else contextlib.nullcontext():
                super().__init__(full, start_new_session=True, preexec_fn=preexec,
                                 pass_fds=() if write_end is None else (write_end,), **kwargs)
        except (subprocess.SubprocessError, _NoNamespace) as exc:  # the namespaces could not be entered: nothing started
            said = failed_entry(self._status) if self._status is not None else None
            self._close_status()
            refused = StartRefused(f"cannot enter the sandbox: {exc if said is None else said[1]}")
            refused.errno = said[0] if said else getattr(exc, "errno", None)
            raise refused from exc
        except BaseException as exc:
            self._close_status()
            if isinstance(exc, OSError) and self.pid is None:  # the fork itself was refused: nothing started
                raise StartRefused(exc.errno, exc.strerror) from exc
            self._end_what_started()
            raise
        finally:
            if write_end is not None:
                os.close(write_end)  # the init holds the only other copy: its end is the pipe's end
        with contextlib.suppress(AttributeError, OSError):  # none before Linux 5.3: see kill_group
            self._pidfd = os.pidfd_open(self.pid)  # not reaped yet: the pid is this process's
        with _live_lock:
            _live.add(self)

    def _end_what_started(self) -> None:
        """A start that failed once its process ran (the runner could not come back to its own PID
        namespace after the fork): that process is killed and reaped, never left running unwatched."""
        if self.pid is not None and self.returncode is None:
            with contextlib.suppress(OSError):
                os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(self.pid, 0)
                self.returncode = -signal.SIGKILL

    def _execute_child(self, args: Any, executable: Any, preexec_fn: Any, close_fds: Any, pass_fds: Any, cwd: Any,
                       env: Any, startupinfo: Any, creationflags: Any, shell: Any, p2cread: int, p2cwrite: int,
                       c2pread: int, c2pwrite: int, errread: int, errwrite: int, *rest: Any) -> None:
        if self._zygote is None:
            super()._execute_child(args, executable, preexec_fn, close_fds,  # type: ignore[misc]
                                   pass_fds, cwd, env, startupinfo, creationflags, shell, p2cread, p2cwrite,
                                   c2pread, c2pwrite, errread, errwrite, *rest)
            return
        try:  # what Popen would give its child: the pipes it made, else the runner's own stdio
            stdio = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
                     errwrite if errwrite != -1 else 2]
            environ = dict(os.environ) if env is None else {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
            self.pid, self._pidfd = self._zygote.start(args, environ, os.getcwd() if cwd is None else os.fsdecode(cwd),
                                                       self._uid, stdio)
            self._child_created = True
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)  # type: ignore[attr-defined]

    def kill_group(self) -> None:
        """SIGKILL to this process and what it started, only while its pid is surely still its own:
        never once its end is known (a reaped pid is free, and another process's group may have it).
        Started by a zygote: the process, through the pidfd the zygote sent (the zygote kills the rest
        of its namespace once it has ended, before it says how). The runner's own child: its process
        group while this object has not reaped it (even ended, the zombie holds its pid and its
        group's); while another thread waits for it, the process through its pidfd, and that wait
        kills what its group left (``_kill_left``)."""
        if self._zygote is None and self._waitpid_lock.acquire(False):  # type: ignore[attr-defined]
            try:
                if self.returncode is None:
                    with contextlib.suppress(OSError):
                        os.killpg(self.pid, signal.SIGKILL)
            finally:
                self._waitpid_lock.release()  # type: ignore[attr-defined]
            return
        with self._pidfd_lock:
            if self._pidfd is not None and self.returncode is None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def _kill_left(self, block: bool) -> bool:
        """The runner's own child, once it has ended and before it is reaped: SIGKILL to what its process
        group still holds (the zombie holds the group's id, so it is still this process's group). Only
        with ``_waitpid_lock`` held, as every reap is; ``block``: wait for its end. False while it runs
        (then it must not be reaped: it may end between this look and the reap)."""
        if self.returncode is not None:
            return True
        try:
            ended = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT | (0 if block else os.WNOHANG))
        except (AttributeError, ChildProcessError):
            return True  # Popen's own wait says what it can
        if ended is None:
            return False
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)
        return True

    def _try_wait(self, wait_flags: int) -> Tuple[int, int]:
        # every reap of Popen's wait is here, under its _waitpid_lock
        if not self._kill_left(block=not wait_flags & os.WNOHANG):
            return 0, 0  # still running, as waitpid(WNOHANG) says it
        return super()._try_wait(wait_flags)  # type: ignore[misc]

    def _internal_poll(self, _deadstate: Optional[int] = None, *args: Any, **kwargs: Any) -> Optional[int]:
        if self._zygote is None:
            if self.returncode is None:
                if not self._waitpid_lock.acquire(False):  # type: ignore[attr-defined]
                    return None  # another thread is waiting for it
                try:
                    if not self._kill_left(block=False):
                        return None
                finally:
                    self._waitpid_lock.release()  # type: ignore[attr-defined]
            return super()._internal_poll(_deadstate, *args, **kwargs)  # type: ignore[misc]
        if self.returncode is None:
            status = self._zygote.status(0)
            if status is not None:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def _wait(self, timeout: Optional[float]) -> int:
        if self._zygote is None:
            return super()._wait(timeout)  # type: ignore[misc]
        if self.returncode is None:
            status = self._zygote.status(timeout)
            if status is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def _close_status(self) -> None:
        if self._status is not None:
            with contextlib.suppress(OSError):
                os.close(self._status)
            self._status = None

    def _settle(self) -> None:
        """Once it has ended: the attempt's own status instead of the shell-like code of its init."""
        if self.returncode is None:
            return
        with self._pidfd_lock:
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
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
        if timeout is not None and self.returncode is None and self._zygote is None:
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
