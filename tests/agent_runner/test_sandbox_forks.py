"""The sandbox's namespaces, entered by forks of the runner, give an attempt exactly what the plain
launcher they replace gave it (``unshare --pid --fork --mount --mount-proc --kill-child`` and an init
run by a fresh ``python3 -I -S``): the same identity, capabilities, signal dispositions, limits,
environment, view of /proc, exit statuses and end of every process it left; and a little more
(the init's memory is a copy of the runner's: nothing in the namespace may read it)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from agent_runner import isolation_probe, launch, privs, sandbox
from agent_runner.sandbox import PIDNS, PIDNS_UID, Sandbox
from tests.support.runner import passable_to_attempts

UID = sandbox.UID_BASE + 777

PLAIN_INIT = """\
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


def plain_run(level: str, argv: list[str], env: dict[str, str], cwd: str) -> tuple[int | None, bytes]:
    """The launcher this replaces, as it was: (the attempt's own return code, its output)."""
    inner = list(argv)
    if level == PIDNS_UID:
        inner = [shutil.which("setpriv") or "setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups",
                 "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--", *inner]
    read, write = os.pipe()
    full = [shutil.which("unshare") or "unshare", *(["--user"] if level == PIDNS else []), "--pid", "--fork",
            "--mount", "--mount-proc", "--kill-child", "--", sys.executable, "-I", "-S", "-c", PLAIN_INIT,
            str(write), *inner]
    proc = subprocess.Popen(full, start_new_session=True, pass_fds=(write,), env=env, cwd=cwd,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    os.close(write)
    out, _ = proc.communicate(timeout=60)
    code: int | None = proc.returncode
    os.set_blocking(read, False)
    with contextlib.suppress(OSError, ValueError):
        status = int(os.read(read, 64))
        if os.WIFSIGNALED(status) and code == 128 + os.WTERMSIG(status):
            code = -os.WTERMSIG(status)
    os.close(read)
    return code, out


def forked_run(level: str, argv: list[str], env: dict[str, str], cwd: str) -> tuple[int | None, bytes]:
    proc = Sandbox(level, UID).popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out


#: what the attempt sees of itself; the lines that name a pid or a time are left out
PROBE = r"""
id; umask; pwd; env | sort
grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp|SigBlk|SigIgn|SigCgt):' /proc/self/status
set -- /proc/[0-9]*; echo "processes: $#"
ulimit -a
ls /proc/self/fd | wc -l
cat /proc/1/environ >/dev/null 2>&1 && echo "init environ: readable" || echo "init environ: not readable"
kill -KILL 1 2>/dev/null; echo "kill init: $?"
mount | grep -c ' /proc ' ; test -w / && echo "root writable" || echo "root not writable"
yes | head -c 3; echo; echo "pipe: ${PIPESTATUS:-done}"
"""

CASES = ["exit 0", "exit 3", "exit 137", "kill -KILL $$", "kill -SEGV $$", "kill -TERM $$", "kill -PIPE $$",
         "exec /nonexistent/program", PROBE]


def _attempt_dir(tmp_path: Path) -> str:
    work = tmp_path / "work"
    work.mkdir()
    os.chown(work, UID, UID)
    passable_to_attempts(tmp_path)
    return str(work)


@pytest.mark.parametrize("level", [PIDNS_UID, PIDNS])
@pytest.mark.parametrize("script", CASES, ids=lambda s: s.split("\n")[1][:20] if "\n" in s else s)
def test_an_attempt_sees_and_ends_as_under_the_plain_launcher(tmp_path: Path, level: str, script: str) -> None:
    cwd = _attempt_dir(tmp_path)
    env = {"PATH": os.defpath, "LANG": "C", "HOME": cwd, "ODD": "a b\tc"}
    plain = plain_run(level, ["sh", "-c", script], env, cwd)
    forked = forked_run(level, ["sh", "-c", script], env, cwd)
    if script == PROBE:
        # the one difference: the plain init (a Python of the runner's uid) was readable at pidns
        assert b"init environ: not readable" in forked[1]
        plain = (plain[0], plain[1].replace(b"init environ: readable", b"init environ: not readable"))
        assert b"processes: 2" in forked[1]  # its own shell and the init
        if level == PIDNS_UID:  # and the filter of the key system calls, which the plain one never had
            assert b"Seccomp:\t2\n" in forked[1]
            plain = (plain[0], plain[1].replace(b"Seccomp:\t0\n", b"Seccomp:\t2\n"))
    assert forked == plain


def _alive(token: str, named: bool = False) -> list[int]:
    """The processes whose command line holds ``token`` (``named``: whose argv[0] is ``token``)."""
    alive = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if (cmdline.split(b"\0", 1)[0] == token.encode()) if named else token.encode() in cmdline:
                    alive.append(int(pid))
    return alive


@pytest.mark.parametrize("level", [PIDNS_UID, PIDNS])
def test_nothing_an_attempt_started_outlives_it(tmp_path: Path, level: str) -> None:
    """Background, new-session and double-forked processes end with the attempt, as before."""
    cwd = _attempt_dir(tmp_path)
    token = f"sleeper-{uuid.uuid4().hex[:8]}"
    script = (f"exec -a {token} sleep 60 & setsid sh -c 'exec -a {token} sleep 60' & "
              f"( ( exec -a {token} sleep 60 & ) & ); sleep 0.2; exit 0")
    for run in (plain_run, forked_run):
        assert run(level, ["bash", "-c", script], {"PATH": os.defpath}, cwd)[0] == 0
        deadline = time.monotonic() + 5
        while _alive(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(token) == [], run.__name__


def assert_killed_with_the_runner(runner: subprocess.Popen[bytes], token: str) -> None:
    """Once the attempt's own process named ``token`` runs (not the runner, whose command line holds
    the token too), SIGKILL the runner: within 5 s nothing holding ``token`` is left."""
    try:
        deadline = time.monotonic() + 10
        while not _alive(token, named=True) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(token, named=True)
        runner.send_signal(signal.SIGKILL)
        runner.wait()
        deadline = time.monotonic() + 5
        while _alive(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(token) == []
    finally:
        if runner.poll() is None:
            runner.kill()


def test_the_namespace_dies_with_the_runner(tmp_path: Path) -> None:
    """A runner killed with SIGKILL (no cleanup of its own) takes every attempt process with it."""
    token = f"orphan-{uuid.uuid4().hex[:8]}"
    runner = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from agent_runner.sandbox import Sandbox\n"
        f"Sandbox(sys.argv[1], {UID}).popen(['bash', '-c', 'setsid bash -c \"exec -a {token} sleep 60\" & wait'])\n"
        "time.sleep(60)\n"), PIDNS_UID], cwd=str(Path(__file__).resolve().parents[2]))
    assert_killed_with_the_runner(runner, token)


def test_nothing_in_the_namespace_can_read_the_inits_memory(tmp_path: Path) -> None:
    """The init is a copy of the runner (its memory holds what the runner read): not dumpable, so even
    an attempt of the runner's own uid (``pidns``) cannot read its memory or environment."""
    cwd = _attempt_dir(tmp_path)
    script = "head -c 1 /proc/1/mem 2>&1; cat /proc/1/environ >/dev/null 2>&1 && echo readable || echo unreadable"
    code, out = forked_run(PIDNS, ["sh", "-c", script], {"PATH": os.defpath}, cwd)
    assert code == 0 and out.strip().endswith(b"unreadable"), out
    assert re.search(rb"Permission denied|Input/output error|No such", out), out


def test_a_namespace_that_cannot_be_made_is_an_oserror_and_leaves_nothing_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # what a first start opens for good (the pid counter), whichever test this process ran first
    assert forked_run(PIDNS_UID, ["true"], {"PATH": os.defpath}, _attempt_dir(tmp_path)) == (0, b"")
    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(launch, "_CLONE_NEWPID", 0x7FFFFFFF)  # flags the kernel refuses
    monkeypatch.setattr(privs, "_CLONE_NEWPID", 0x7FFFFFFF)
    with pytest.raises(OSError, match="cannot enter the sandbox"):
        Sandbox(PIDNS_UID, UID).popen(["true"])
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("level", [PIDNS_UID, PIDNS])
def test_a_refused_start_says_why_and_one_refused_for_want_of_a_resource_is_tried_again(
        tmp_path: Path, level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """subprocess says only "Exception occurred in preexec_fn" of the fork that enters the namespaces:
    the runner's error names the call the kernel refused and its errno. A refusal that load explains
    (EAGAIN: no process or namespace to spare a moment) is tried again; the others are not."""
    cwd = _attempt_dir(tmp_path)
    marker = tmp_path / "refused-once"
    calls = tmp_path / "calls"

    def refuse(errno_: int, once: bool) -> None:
        with open(calls, "a") as f:
            f.write("x")
        if once and marker.exists():
            return
        marker.touch()
        raise OSError(errno_, f"keyctl join session keyring: {os.strerror(errno_)}")

    assert forked_run(level, ["true"], {"PATH": os.defpath}, cwd) == (0, b"")  # what a first start opens for good
    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(privs, "new_session_keyring", lambda: refuse(errno.EPERM, False))
    with pytest.raises(OSError, match="^cannot enter the sandbox: keyctl join session keyring: Operation not permitted$") as refused:
        Sandbox(level, UID if level == PIDNS_UID else None).popen(["true"], cwd=cwd)
    assert refused.value.errno == errno.EPERM and calls.read_text() == "x"  # not tried again
    assert len(os.listdir("/proc/self/fd")) == before

    calls.unlink()
    marker.unlink()
    monkeypatch.setattr(privs, "new_session_keyring", lambda: refuse(errno.EAGAIN, True))
    proc = Sandbox(level, UID if level == PIDNS_UID else None).popen(["true"], cwd=cwd)
    assert proc.wait(timeout=30) == 0 and calls.read_text() == "xx"

    calls.unlink()
    monkeypatch.setattr(privs, "new_session_keyring", lambda: refuse(errno.EAGAIN, False))
    with pytest.raises(OSError, match="Resource temporarily unavailable") as refused:
        Sandbox(level, UID if level == PIDNS_UID else None).popen(["true"], cwd=cwd)
    assert refused.value.errno == errno.EAGAIN and calls.read_text() == "xxxx"  # four tries, then the error
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("script,timeout", [("exit 5", 5.0), ("sleep 0.3; exit 6", 5.0), ("kill -KILL $$", 5.0),
                                            ("sleep 5", 0.3), ("exec sleep 5", 0.0)])
def test_a_timed_wait_ends_as_the_polling_wait_it_replaces(tmp_path: Path, script: str, timeout: float) -> None:
    """``Started.wait(timeout)`` blocks on a pidfd; ``Popen.wait(timeout)`` sleeps and polls: the same
    return codes, the same ``TimeoutExpired``, and the pidfd wait is never later."""
    cwd = _attempt_dir(tmp_path)
    said = []
    for start in (lambda: subprocess.Popen(["sh", "-c", script], cwd=cwd, start_new_session=True),
                  lambda: Sandbox(sandbox.NONE).popen(["sh", "-c", script], cwd=cwd)):
        proc = start()
        began = time.monotonic()
        try:
            said.append(proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            said.append("timeout")
            assert time.monotonic() - began >= timeout
        finally:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert said[0] == said[1]


def test_every_child_after_a_sandboxed_start_is_in_the_runners_pid_namespace(tmp_path: Path) -> None:
    """As root the namespace's init is forked straight from the runner's thread (no holder): that
    thread's children go to a new PID namespace for that one fork only. After a start, a failed start
    and a start from another thread, every child of every thread is where the runner is."""
    cwd = _attempt_dir(tmp_path)
    own = os.readlink("/proc/self/ns/pid")
    assert forked_run(PIDNS_UID, ["true"], {"PATH": os.defpath}, cwd) == (0, b"")
    with pytest.raises(OSError):
        Sandbox(PIDNS_UID, UID).popen(["/nonexistent/program"], cwd=cwd)
    seen: list[str] = []

    def in_a_thread() -> None:
        forked_run(PIDNS_UID, ["true"], {"PATH": os.defpath}, cwd)
        seen.append(os.readlink("/proc/thread-self/ns/pid_for_children"))

    worker = threading.Thread(target=in_a_thread)
    worker.start()
    worker.join()
    assert seen == [own]
    assert os.readlink("/proc/thread-self/ns/pid_for_children") == own
    child = subprocess.Popen(["sleep", "5"])
    try:
        assert os.readlink(f"/proc/{child.pid}/ns/pid") == own
    finally:
        child.kill()
        child.wait()


def test_a_runner_that_cannot_come_back_to_its_pid_namespace_starts_through_the_holder() -> None:
    """Root of a user namespace of its own (as a host's runner in a container may be) may make a PID
    namespace but not set its own again: it starts through the holder, and a start that fails there
    leaves every later child of the runner startable (a thread whose children's PID namespace lost its
    init could fork nothing any more)."""
    code = ("import subprocess\n"
            "from agent_runner.sandbox import PIDNS_UID, Sandbox, _PidNamespace\n"
            "print('direct' if _PidNamespace.usable() else 'holder')\n"
            f"try:\n    Sandbox(PIDNS_UID, {UID}).popen(['true']).wait()\nexcept OSError as exc:\n"
            "    print('refused:', exc)\n"  # its root cannot become another uid: no uid is mapped
            "print(subprocess.run(['echo', 'forked'], capture_output=True, text=True).stdout.strip())\n")
    done = subprocess.run(["unshare", "--user", "--map-root-user", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60, cwd=str(Path(__file__).resolve().parents[2]))
    lines = done.stdout.splitlines()
    assert lines[0] == "holder" and lines[1].startswith("refused: cannot enter the sandbox"), done
    assert lines[-1] == "forked", done


@pytest.mark.parametrize("level", [PIDNS_UID, PIDNS])
def test_descriptors_closed_by_range_or_by_listing_leave_the_attempt_the_same(
        tmp_path: Path, level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The forks close every descriptor they inherited by range (``close_range``); where the kernel
    cannot, by the list of ``/proc/self/fd`` taken before /proc is remounted, as before. The attempt
    sees and ends the same either way."""
    cwd = _attempt_dir(tmp_path)
    env = {"PATH": os.defpath, "LANG": "C", "HOME": cwd}
    cases = [PROBE, "exit 3", "kill -KILL $$"]
    assert launch._close_range_works()  # this machine's kernel: the range is what runs by default
    by_range = [forked_run(level, ["sh", "-c", s], env, cwd) for s in cases]
    monkeypatch.setattr(launch, "_close_range_ok", False)
    listed = [forked_run(level, ["sh", "-c", s], env, cwd) for s in cases]
    assert listed == by_range


@pytest.mark.parametrize("by_range", [True, False])
@pytest.mark.parametrize("level", [PIDNS_UID, PIDNS])
def test_no_process_of_the_sandbox_keeps_a_descriptor_the_runner_left_open(
        tmp_path: Path, level: str, by_range: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder and the init close every descriptor they were forked with (but the status pipe):
    a pipe the runner left open to children reaches its end while the attempt still runs (the
    attempt's own copy is closed before its exec), not only once the namespace is gone."""
    monkeypatch.setattr(launch, "_close_range_ok", None if by_range else False)
    cwd = _attempt_dir(tmp_path)
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    proc = Sandbox(level, UID).popen(["sleep", "30"], cwd=cwd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        os.close(write_end)
        assert select.select([read_end], [], [], 10)[0], "a process of the sandbox still holds the pipe"
        assert os.read(read_end, 1) == b""
        assert proc.poll() is None  # the attempt still runs
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        os.close(read_end)


def test_the_oom_kill_count_is_the_one_a_plain_read_of_vmstat_gives() -> None:
    """Read in one go and found by search, as the line-by-line read it replaces found it."""
    with open("/proc/vmstat", "rb") as f:
        plain = next((int(line.split()[1]) for line in f if line.startswith(b"oom_kill ")), None)
    assert plain is not None  # this machine's kernel counts them
    assert sandbox.oom_kills() == plain


def test_a_start_that_failed_after_its_process_ran_is_never_tried_again_and_leaves_nothing_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root's start forks the init straight into a new PID namespace and then brings the thread back to
    its own; should that last step fail (ENOMEM), the process already runs: it is killed and reaped,
    and the start is not tried again (the attempt would run twice)."""
    cwd = _attempt_dir(tmp_path)
    marker = tmp_path / "runs"
    token = uuid.uuid4().hex
    real_exit = privs._ChildrenInNewPidNamespace.__exit__

    starts: list[int] = []

    def failing_exit(self: object, *exc: object) -> None:
        starts.append(1)
        real_exit(self, *exc)  # type: ignore[arg-type]
        raise OSError(errno.ENOMEM, "setns back to the runner's PID namespace: Cannot allocate memory")

    monkeypatch.setattr(privs._ChildrenInNewPidNamespace, "__exit__", failing_exit)
    script = f"echo started >> {marker}; exec sleep 30 {token}"
    with pytest.raises(OSError, match="Cannot allocate memory") as refused:
        Sandbox(PIDNS_UID, UID).popen(["sh", "-c", script], env={"PATH": os.defpath}, cwd=cwd)
    assert not isinstance(refused.value, sandbox.StartRefused) and starts == [1]  # not tried again
    time.sleep(0.3)
    assert (marker.read_text() if marker.exists() else "") in ("", "started\n")  # killed, at most once begun
    assert _alive(token) == []


def test_the_isolation_probe_takes_a_refusal_as_its_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel that allows no user namespace refuses one with ENOSPC every time: the probe answers at
    once instead of trying again."""
    calls: list[int] = []

    def refuse() -> None:
        calls.append(1)
        raise OSError(errno.ENOSPC, "keyctl join session keyring: No space left on device")

    monkeypatch.setattr(privs, "new_session_keyring", refuse)
    began = time.monotonic()
    assert isolation_probe._works(PIDNS) is False
    assert time.monotonic() - began < 1.0 and len(calls) <= 1
