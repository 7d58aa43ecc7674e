"""A slot's zygote (namespaces made once, each process started by their init, everything cleared after
it) gives every process what the per-process path gives it, and nothing a previous process of the
same slot left: no process, no listener, no socket, no pid count, no IPC object. The per-process path
(``sandbox.Started`` with ``zygote.ENABLED`` off) is the reference."""

from __future__ import annotations

import difflib
import errno
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_runner import isolation_probe, sandbox, zygote
from agent_runner.sandbox import PIDNS_UID, Sandbox
from tests.agent_runner.test_sandbox_forks import (
    CASES,
    PROBE,
    _alive,
    _attempt_dir,
    assert_killed_with_the_runner,
)
from tests.support.runner import REPO, TRIAGE, clean_env, records
from tools.testhosts import free_port

UID = sandbox.UID_BASE + 778
NEXT_UID = sandbox.UID_BASE + 779


@pytest.fixture(autouse=True)
def _no_zygote_left() -> Iterator[None]:
    yield
    zygote.close_all()


def _box(net: bool, uid: int = UID, reuse: bool = True) -> Sandbox:
    box = Sandbox(PIDNS_UID, uid, net=net)
    box.reuse = reuse  # what ``isolation_probe.attempt_sandbox`` sets for an attempt whose paths its uid reaches
    return box


def _run(box: Sandbox, script: str, cwd: str, expect_zygote: bool = True) -> tuple[int | None, bytes]:
    proc = box.popen(["bash", "-c", script], env={"PATH": os.defpath, "LANG": "C", "HOME": cwd}, cwd=cwd,
                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert (proc._zygote is not None) == expect_zygote
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out


@pytest.mark.parametrize("net", [False, True], ids=["open", "netns"])
@pytest.mark.parametrize("script", CASES, ids=lambda s: s.split("\n")[1][:20] if "\n" in s else s)
def test_a_process_the_zygote_starts_sees_and_ends_as_one_started_on_its_own(
        tmp_path: Path, net: bool, script: str) -> None:
    cwd = _attempt_dir(tmp_path)
    _run(_box(net), "exit 0", cwd)  # the zygote has served one process already
    own = _run(_box(net, reuse=False), script, cwd, expect_zygote=False)
    shared = _run(_box(net), script, cwd)
    if script == PROBE:
        assert b"processes: 2" in shared[1]  # its own shell and the init
    assert shared == own, "\n".join(difflib.unified_diff(own[1].decode().splitlines(), shared[1].decode().splitlines(),
                                                         "own", "zygote", lineterm=""))


IGNORED = r"""
import os, subprocess, sys
from agent_runner.sandbox import PIDNS_UID, Sandbox
def look(reuse):
    box = Sandbox(PIDNS_UID, int(sys.argv[2]), net=False)
    box.reuse = reuse
    proc = box.popen(["sh", "-c", "grep SigIgn /proc/self/status"], cwd=sys.argv[1], env={"PATH": os.defpath},
                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert (proc._zygote is not None) == reuse
    return proc.communicate(timeout=60)[0].decode().split()[1]
print(look(False), look(True))
"""


def test_libcs_own_signals_ignored_by_the_runner_stay_ignored_on_both_paths(tmp_path: Path) -> None:
    """A runner started by libc's posix_spawn (as GNU make starts its shells) ignores libc's own signals
    (32: glibc's thread cancellation): an attempt's process ignores it too, started on its own (a fork
    and an exec keep it ignored) or by the zygote (whose posix_spawn sets libc's signals by what the
    zygote has)."""
    cwd = _attempt_dir(tmp_path)
    read, write = os.pipe()
    pid = os.posix_spawn(sys.executable, [sys.executable, "-c", IGNORED, cwd, str(UID)],
                         {"PATH": os.defpath, "PYTHONPATH": str(REPO)},
                         file_actions=[(os.POSIX_SPAWN_DUP2, write, 1)])
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read().split()
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    own, shared = said
    assert own == shared and int(own, 16) >> 31 & 1, said


def test_the_zygote_is_reused_and_a_busy_one_is_not_waited_for(tmp_path: Path) -> None:
    """One zygote serves the slot's processes in turn; a process started while another runs (a command
    agent's tool) takes the per-process path."""
    cwd = _attempt_dir(tmp_path)
    first = _box(True).popen(["sleep", "30"], cwd=cwd, stdin=subprocess.DEVNULL)
    try:
        assert first._zygote is not None
        beside = _box(True).popen(["true"], cwd=cwd)
        assert beside._zygote is None and beside.wait(timeout=30) == 0
    finally:
        os.killpg(first.pid, 9)
        assert first.wait(timeout=30) == -9
    again = _box(True).popen(["true"], cwd=cwd)
    assert again._zygote is first._zygote and again.wait(timeout=30) == 0


def test_a_process_whose_zygote_is_lost_before_it_starts_starts_the_per_process_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A zygote gone before it started the process (``ZygoteLost``): the same process starts on its own,
    with its stdin from /dev/null as asked (the first start's /dev/null, closed, is not taken again)."""
    cwd = _attempt_dir(tmp_path)

    def lost(*args: object, **kwargs: object) -> tuple[int, int]:
        raise zygote.ZygoteLost("gone")

    monkeypatch.setattr(zygote.Zygote, "start", lost)
    proc = _box(False).popen(["bash", "-c", "read -r line; echo \"read $?\"; ls -l /proc/self/fd/0"], cwd=cwd,
                             env={"PATH": os.defpath}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=60)
    assert proc._zygote is None and proc.returncode == 0
    assert out.decode().splitlines()[0] == "read 1" and out.decode().rstrip().endswith("/dev/null"), out


@pytest.mark.parametrize("net", [False, True], ids=["open", "netns"])
def test_nothing_a_process_left_runs_beside_the_next_one_of_the_slot(tmp_path: Path, net: bool) -> None:
    """Background, new-session, double-forked and nohup'd processes are gone when the process's wait
    returns (not later), and the next process (another attempt's uid) sees only itself, numbered as in a
    namespace of its own."""
    cwd = _attempt_dir(tmp_path)
    token = f"left-{os.urandom(4).hex()}"
    leave = (f"exec -a {token} sleep 60 & setsid bash -c 'exec -a {token} sleep 60' & "
             f"( ( exec -a {token} sleep 60 & ) & ); nohup bash -c 'exec -a {token} sleep 60' >/dev/null 2>&1 & "
             f"for i in $(seq 50); do true & done; sleep 0.2; exit 0")
    assert _run(_box(net), leave, cwd) == (0, b"")
    assert _alive(token) == []
    code, out = _run(_box(net, NEXT_UID), 'set -- /proc/[0-9]*; echo "$# $$ $(id -u)"', cwd)
    assert (code, out.split()) == (0, [b"2", b"2", str(NEXT_UID).encode()])


TAKE_ROOT = r"""
import os
said = [os.getresuid(), os.getresgid(), os.getgroups()]
for name, call in (("zygote", lambda: os.kill(1, 0)), ("nice", lambda: os.setpriority(os.PRIO_PROCESS, 1, 19)),
                   ("setuid", lambda: os.setuid(0)), ("saved", lambda: os.setresuid(-1, -1, 0)),
                   ("setgid", lambda: os.setgid(0)), ("groups", lambda: os.setgroups([0]))):
    try:
        call()
        said.append(name + " taken")
    except PermissionError:
        said.append(name + " refused")
with open("/proc/self/status") as f:
    said += [line.split()[1] for line in f if line.startswith(("CapPrm", "CapEff", "NoNewPrivs"))]
print(said)
"""


@pytest.mark.parametrize("net", [False, True], ids=["open", "netns"])
def test_a_process_the_zygote_starts_cannot_take_root_back(tmp_path: Path, net: bool) -> None:
    """A thread of the zygote takes a process's ids for its start (the saved ids root's): the process
    execs with its uid in the real, effective and saved ids, no group, no capability, and cannot take
    root back in any of them; the zygote itself never had its ids, so the process can neither signal
    nor renice it, from its first instruction on; the next process of the slot too."""
    cwd = _attempt_dir(tmp_path)
    (tmp_path / "take.py").write_text(TAKE_ROOT)
    (tmp_path / "take.py").chmod(0o644)
    for uid in (UID, NEXT_UID):
        code, out = _run(_box(net, uid), f"/usr/bin/python3 {tmp_path / 'take.py'}", cwd)
        assert code == 0, out
        ids = (uid, uid, uid)
        assert out.decode().strip() == str([ids, ids, [], "zygote refused", "nice refused", "setuid refused",
                                            "saved refused", "setgid refused", "groups refused",
                                            "0000000000000000", "0000000000000000", "1"])


LEAVE_SOCKETS = r"""
import os, socket, sys
port = int(sys.argv[1])
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port)); listener.listen(8)
abstract = socket.socket(socket.AF_UNIX); abstract.bind("\0crosshost-left"); abstract.listen(8)
# a connection closed by this side first: TIME_WAIT here
client = socket.create_connection(("127.0.0.1", port)); server = listener.accept()[0]
client.close(); server.recv(1); server.close()
# a socket whose only reference is in flight on itself, collected only by the kernel's collector
a, b = socket.socketpair()
a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(memoryview(__import__("array").array("i", [b.fileno()]))))])
a.close(); b.close()
if os.fork() == 0:  # the listeners stay open in a process of a new session
    os.setsid()
    import time; time.sleep(60)
os._exit(0)
"""

FIND_SOCKETS = r"""
import errno, socket, sys
port = int(sys.argv[1])
said = []
try:
    socket.create_connection(("127.0.0.1", port), timeout=5); said.append("tcp reached")
except OSError as exc:
    said.append("tcp " + errno.errorcode[exc.errno])
u = socket.socket(socket.AF_UNIX)
try:
    u.connect("\0crosshost-left"); said.append("unix reached")
except OSError as exc:
    said.append("unix " + errno.errorcode[exc.errno])
u.close()
s = socket.socket(); s.bind(("127.0.0.1", port)); s.listen(1); said.append("bound")  # no SO_REUSEADDR
s.close()
for table in ("tcp", "tcp6", "udp", "unix"):
    with open("/proc/net/" + table) as f:
        said.append("%s %d" % (table, len(f.read().splitlines()) - 1))
print(" / ".join(said))
"""


def test_no_socket_a_process_left_is_reachable_or_visible_to_the_next_one_of_the_slot(tmp_path: Path) -> None:
    """A loopback listener and an abstract Unix listener kept open by a process of a new session, a
    TIME_WAIT connection and a socket left in flight: the next process of the slot reaches none of them,
    may bind the same port, and its network namespace's tables list nothing."""
    cwd = _attempt_dir(tmp_path)
    port = free_port()
    python = "/usr/bin/python3"  # its uid reaches the system's interpreter, not the test's
    for name, text in (("leave.py", LEAVE_SOCKETS), ("find.py", FIND_SOCKETS)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o644)
    assert _run(_box(True), f"{python} {tmp_path / 'leave.py'} {port}", cwd) == (0, b"")
    code, out = _run(_box(True, NEXT_UID), f"{python} {tmp_path / 'find.py'} {port}", cwd)
    assert code == 0, out
    assert out.decode().strip() == ("tcp ECONNREFUSED / unix ECONNREFUSED / bound / tcp 0 / tcp6 0 / udp 0 "
                                    "/ unix 0")


@pytest.mark.parametrize("reuse", [True, False], ids=["zygote", "own"])
def test_a_sysv_ipc_object_a_process_left_is_gone_for_the_next_one(tmp_path: Path, reuse: bool) -> None:
    """Each process has an IPC namespace of its own (SysV shared memory, semaphores, message queues,
    POSIX queues): what it made, even readable by all, goes with it, and the host never sees it."""
    cwd = _attempt_dir(tmp_path)
    made = _run(_box(True, reuse=reuse), "ipcmk -M 4096 -p 0666; ipcmk -Q -p 0666; ipcs -m -q | grep -c 0x",
                cwd, expect_zygote=reuse)
    assert made[0] == 0 and made[1].split()[-1] == b"2", made
    host = subprocess.run(["ipcs", "-m", "-q"], capture_output=True, text=True).stdout
    assert not re.search(rf"\b{UID}\b", host)
    assert _run(_box(True, NEXT_UID, reuse=reuse), "ipcs -m -q | grep -c 0x", cwd, expect_zygote=reuse) == (1, b"0\n")


def test_a_run_through_the_zygotes_has_the_verdicts_and_traces_of_a_run_without(tmp_path: Path) -> None:
    """The triage suite (scripted agents, shell tools, predicates that pass and fail) run twice, two
    slots, once with zygotes and once without: the same rows and the same traces, but for the times and
    the attempts' own directories; the first run really started its processes through zygotes."""
    _attempt_dir(tmp_path)  # every directory above passable: the attempts get uids of their own
    triage = tmp_path / "triage"  # so is the suite's (a clone under /root is not: its attempts would be pidns)
    shutil.copytree(TRIAGE, triage)
    said = {}
    ws = tmp_path / "ws"  # the same for both (it is in the fingerprint): empty again after each run
    own_dir = re.compile(re.escape(str(ws)) + r"/([\w-]+\.\d+\.)\w+")  # mkdtemp's random part

    def same(text: str) -> str:  # times; an attempt's directory, and a digest of arguments that hold it
        text = re.sub(r'"(\w+_fp)": "[0-9a-f]+"', r'"\1": "X"', own_dir.sub(r"\1X", text))
        return re.sub(r'"(wall_ms|latency_ms|ms|ts|started|elapsed_ms)": [0-9.]+', r'"\1": 0', text)

    for name, enabled in (("zygote", True), ("own", False)):
        out = tmp_path / name / "out"
        code = ("import sys\nfrom agent_runner import zygote\nfrom agent_runner.__main__ import main\n"
                f"zygote.ENABLED = {enabled}\nstarted = []\nstart = zygote.Zygote.start\n"
                "zygote.Zygote.start = lambda self, *a: started.append(1) or start(self, *a)\n"
                f"code = main(['run', '--suite', {str(triage)!r}, '--out', {str(out)!r}, '--workspace-root', "
                f"{str(ws)!r}, '--host', 'h', '--run-id', 'r', '--slots', '2'])\n"
                "print('started by zygotes:', len(started), file=sys.stderr)\nsys.exit(code)\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(),
                              cwd=REPO, timeout=300)
        assert done.returncode == 0, done.stderr
        fingerprint = json.loads((out / "fingerprint.json").read_text())
        assert fingerprint["isolation"] == "netns+pidns+uid"
        started = int(re.findall(r"started by zygotes: (\d+)", done.stderr)[0])
        assert (started > 10) if enabled else (started == 0), done.stderr
        rows = [same(json.dumps({k: v for k, v in r.items() if k != "wall_ms"})) for r in records(out / "results.jsonl")]
        traces = {path.name: same(path.read_text()) for path in sorted((out / "traces").glob("*.jsonl"))}
        said[name] = (rows, traces)
    assert said["zygote"][0] == said["own"][0]
    assert said["zygote"][1].keys() == said["own"][1].keys()
    for name in said["own"][1]:
        assert said["zygote"][1][name] == said["own"][1][name], name


@pytest.mark.parametrize("forks", [False, True], ids=["execd", "forked"])
def test_a_zygote_and_everything_it_started_die_with_the_runner(tmp_path: Path, forks: bool) -> None:
    """A runner killed with SIGKILL (no cleanup of its own) takes its zygote, the process it started and
    what that left in a new session with it; where its zygotes are forks of the fork it made at its
    start, that fork too (its command line, the runner's, holds the token)."""
    cwd = _attempt_dir(tmp_path)
    token = f"orphan-{os.urandom(4).hex()}"
    runner = subprocess.Popen([sys.executable, "-c", (
        "import time\n"
        "from agent_runner import zygote\n"
        + ("zygote.start_forks()\nassert zygote._forks is not None\n" if forks else "")
        + "from agent_runner.sandbox import PIDNS_UID, Sandbox\n"
        f"box = Sandbox(PIDNS_UID, {UID}, net=True)\nbox.reuse = True\n"
        f"proc = box.popen(['bash', '-c', 'setsid bash -c \"exec -a {token} sleep 60\" & wait'], cwd={cwd!r})\n"
        "assert proc._zygote is not None\n"
        "time.sleep(60)\n")], cwd=str(REPO))
    assert_killed_with_the_runner(runner, token)


#: a runner's attempts, each started by its slot's zygote (argv: how the zygotes start, the attempt's
#: directory, then (uid, script) pairs as JSON); prints what each printed, where each zygote's parent
#: is (the fork made at the start, ``forks``, or this runner) and what its descriptors are
THROUGH_ZYGOTES = r"""
import json, os, subprocess, sys
from agent_runner import zygote
from agent_runner.sandbox import PIDNS_UID, Sandbox
if sys.argv[1] == "forked":
    zygote.start_forks()
    assert zygote._forks is not None
said, parents, held = [], set(), set()
for uid, script in json.loads(sys.argv[3]):
    box = Sandbox(PIDNS_UID, uid, net=True)
    box.reuse = True
    proc = box.popen(["bash", "-c", script], env={"PATH": os.defpath, "LANG": "C", "HOME": sys.argv[2]},
                     cwd=sys.argv[2], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc._zygote is not None
    with open("/proc/%d/stat" % proc._zygote.proc.pid) as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    parents.add("forks" if zygote._forks is not None and ppid == zygote._forks.pid else
                "runner" if ppid == os.getpid() else str(ppid))
    said.append([proc.communicate(timeout=60)[0].decode(), proc.returncode])
    assert not os.get_inheritable(proc._zygote.ctl.fileno())  # no process this runner starts holds it
    fds = "/proc/%d/fd/" % proc._zygote.proc.pid  # what its descriptors are, idle between two processes
    held.add(" ".join(sorted(os.readlink(fds + fd).split(":")[0] for fd in os.listdir(fds))))
zygote.close_all()
print(json.dumps([said, sorted(parents), sorted(held)]))
"""


def test_an_attempt_sees_through_a_forked_zygote_what_it_sees_through_an_execd_one(tmp_path: Path) -> None:
    """A runner's zygotes forked from the fork it made at its start, before any thread (no interpreter
    started, no module imported again), against zygotes that exec ``python -I -S``, in two runners whose
    environment holds a secret: the same ids, capabilities, signals, limits, descriptors and processes;
    the zygote's environment unreadable and unkillable; no way back to root; nothing the previous
    process left. The forked zygotes are children of that fork, not of the runner, and hold no
    descriptor of the runner's."""
    cwd = _attempt_dir(tmp_path)
    (tmp_path / "take.py").write_text(TAKE_ROOT)
    (tmp_path / "take.py").chmod(0o644)
    token = f"left-{os.urandom(4).hex()}"
    leave = (f"exec -a {token} sleep 60 & setsid bash -c 'exec -a {token} sleep 60' & "
             f"( ( exec -a {token} sleep 60 & ) & ); sleep 0.2; exit 0")
    steps = [(UID, PROBE), (UID, f"/usr/bin/python3 {tmp_path / 'take.py'}"), (UID, leave),
             (NEXT_UID, 'set -- /proc/[0-9]*; echo "$# $$ $(id -u)"; ls /proc/self/fd'),
             (NEXT_UID, "cat /proc/1/environ; kill -KILL 1; echo $?")]
    said = {}
    for how in ("execd", "forked"):
        env = {**clean_env(), "CROSSHOST_SECRET_OF_THE_RUNNER": "s3cr3t"}
        done = subprocess.run([sys.executable, "-c", THROUGH_ZYGOTES, how, cwd, json.dumps(steps)],
                              capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
        assert done.returncode == 0, done.stderr
        said[how] = json.loads(done.stdout)
        assert _alive(token) == []
    assert said["execd"][1] == ["runner"] and said["forked"][1] == ["forks"]
    # stdin and stdout, stderr (the runner's, a pipe here), its control socket and the pid counter it
    # sets before each start: nothing of the runner's
    assert said["forked"][2] == ["/dev/null /dev/null /proc/sys/kernel/ns_last_pid pipe socket"]
    assert said["forked"][0] == said["execd"][0]
    look = said["forked"][0]
    assert "init environ: not readable" in look[0][0] and "s3cr3t" not in json.dumps(look)
    ids = (UID, UID, UID)
    assert look[1] == [str([ids, ids, [], "zygote refused", "nice refused", "setuid refused", "saved refused",
                            "setgid refused", "groups refused", "0000000000000000", "0000000000000000", "1"]) + "\n", 0]
    assert look[3][0].split()[:3] == ["2", "2", str(NEXT_UID)] and look[3][0].split()[3:] == ["0", "1", "2", "3"]
    assert look[4][1] == 0 and look[4][0].rstrip().endswith("1"), look[4]


#: the fork that makes the zygotes killed during a run: the zygote it made dies with it and is reaped by
#: the runner (its subreaper), the next process of the slot starts through an exec'd zygote, and the
#: runner has no child left once its zygotes are closed
FORKS_KILLED = r"""
import os, signal, subprocess, sys, time
from agent_runner import privs, reaped, zygote
from agent_runner.sandbox import PIDNS_UID, Sandbox
privs.make_subreaper()
zygote.start_forks()
forks = zygote._forks
def run(script):
    box = Sandbox(PIDNS_UID, int(sys.argv[2]), net=False)
    box.reuse = True
    proc = box.popen(["sh", "-c", script], env={"PATH": os.defpath}, cwd=sys.argv[1], stdin=subprocess.DEVNULL,
                     stdout=subprocess.PIPE)
    return proc, proc.communicate(timeout=60)[0].decode().strip()
first, said = run("echo one")
os.kill(forks.pid, signal.SIGKILL)
os.waitpid(forks.pid, 0)
deadline = time.monotonic() + 10
while first._zygote.proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.01)
second, said2 = run("echo two")
parent = int(open("/proc/%d/stat" % second._zygote.proc.pid).read().rsplit(")", 1)[1].split()[1])
zygote.close_all()
print(said, said2, first._zygote is not second._zygote, parent == os.getpid(), reaped.no_child_left())
"""


def test_a_run_whose_zygotes_fork_is_killed_goes_on_with_execd_zygotes_and_leaves_no_child(tmp_path: Path) -> None:
    """The fork that makes a runner's zygotes killed during the run: its zygote dies with it and the
    runner (their subreaper) reaps it; the slot's next process starts through an exec'd zygote; at the
    run's end the runner has no child left, so the workspace's removal may trust its mark."""
    cwd = _attempt_dir(tmp_path)
    done = subprocess.run([sys.executable, "-c", FORKS_KILLED, cwd, str(UID)], capture_output=True, text=True,
                          env=clean_env(), cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["one", "two", "True", "True", "True"], done.stdout


KEYCTL, ADD_KEY, KEY_SPEC_SESSION_KEYRING, KEYCTL_DESCRIBE, KEYCTL_SEARCH = 250, 248, -3, 6, 10
#: an attempt's look at its session keyring: its description, and whether a key "left" is in it; then it
#: leaves one (x86_64 system call numbers; the test is skipped nowhere else: see the guard below)
KEYRING_LOOK = (
    "import ctypes\n"
    "c = ctypes.CDLL(None, use_errno=True)\n"
    "buf = ctypes.create_string_buffer(256)\n"
    f"described = c.syscall({KEYCTL}, {KEYCTL_DESCRIBE}, {KEY_SPEC_SESSION_KEYRING}, buf, 256)\n"
    "print('ring', buf.value.decode().rsplit(';', 1)[-1] if described > 0 else 'refused')\n"
    f"found = c.syscall({KEYCTL}, {KEYCTL_SEARCH}, {KEY_SPEC_SESSION_KEYRING}, b'user', b'left', 0)\n"
    "print('left', found > 0)\n"
    f"c.syscall({ADD_KEY}, b'user', b'left', b'from the previous attempt', 25, {KEY_SPEC_SESSION_KEYRING})\n"
)


@pytest.mark.parametrize("reuse", [True, False], ids=["zygote", "own"])
def test_no_attempt_possesses_the_runners_session_keyring_or_the_previous_ones(tmp_path: Path, reuse: bool) -> None:
    """The runner has a session keyring (as over sshd, whose pam_keyinit gives every login one) with
    a key in it: an attempt's session keyring is a new anonymous one, and a key one attempt adds to
    its own is not there for the next attempt of the slot."""
    assert os.uname().machine == "x86_64", "the system call numbers above are x86_64's"
    cwd = _attempt_dir(tmp_path)
    # a runner of its own (a process that joins a named session keyring and puts a key in it)
    code = (
        "import ctypes, subprocess, sys\n"
        "from tests.agent_runner.test_zygote import KEYRING_LOOK, _box\n"
        "c = ctypes.CDLL(None, use_errno=True)\n"
        f"assert c.syscall({KEYCTL}, 1, b'crosshost-runner-ring') > 0, 'no keyrings in this kernel'\n"
        f"assert c.syscall({ADD_KEY}, b'user', b'left', b'the runner', 10, {KEY_SPEC_SESSION_KEYRING}) > 0\n"
        "for _ in range(2):\n"
        f"    proc = _box(False, reuse={reuse}).popen(['python3', '-c', KEYRING_LOOK], env={{'PATH': '/usr/bin:/bin'}},\n"
        f"        cwd={cwd!r}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)\n"
        f"    assert (proc._zygote is not None) == {reuse}\n"
        "    sys.stdout.write(proc.communicate(timeout=60)[0].decode())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    # the key calls are refused outright (below); where they were not, the ring was a new anonymous one
    assert done.stdout.splitlines() == ["ring refused", "left False", "ring refused", "left False"], done.stdout


USER_KEYRINGS = (
    "import ctypes, os\n"
    "c = ctypes.CDLL(None, use_errno=True)\n"
    "for name, ring in (('u', -4), ('us', -5)):\n"
    f"    found = c.syscall({KEYCTL}, {KEYCTL_SEARCH}, ring, b'user', b'left-' + name.encode(), 0)\n"
    "    print(name, 'found' if found > 0 else 'none')\n"
    f"    added = c.syscall({ADD_KEY}, b'user', b'left-' + name.encode(), b'secret', 6, ring)\n"
    "    print(name, 'added' if added > 0 else os.strerror(ctypes.get_errno()))\n"
)


@pytest.mark.parametrize("reuse", [True, False], ids=["zygote", "own"])
def test_a_key_an_attempt_leaves_in_its_uids_keyrings_is_never_the_next_attempts_of_that_uid(
    tmp_path: Path, reuse: bool
) -> None:
    """An attempt's uid is drawn again by later attempts (once its directory is gone), and its user
    keyrings (``@u``, ``@us``) live on with the uid: the key system calls are refused to every
    process of an attempt, so nothing can be left there, nor read."""
    assert os.uname().machine == "x86_64", "the system call numbers above are x86_64's"
    cwd = _attempt_dir(tmp_path)
    said = []
    for _ in range(2):  # two attempts of the same uid, one after the other
        proc = _box(False, uid=UID + 1, reuse=reuse).popen(
            ["python3", "-c", USER_KEYRINGS], env={"PATH": "/usr/bin:/bin"}, cwd=cwd,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert (proc._zygote is not None) == reuse
        said.append(proc.communicate(timeout=60)[0].decode().splitlines())
    refused = ["u none", "u Operation not permitted", "us none", "us Operation not permitted"]
    assert said == [refused, refused], said


@pytest.fixture
def reachable(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path`` with every directory above it passable by another uid (as a host's workspace root),
    put back as it was afterwards."""
    dirs = [d for d in (tmp_path, *tmp_path.parents) if d != Path("/")]
    modes = {d: d.stat().st_mode & 0o7777 for d in dirs}
    for d in dirs:
        d.chmod(modes[d] | 0o001)
    try:
        yield tmp_path
    finally:
        for d, mode in modes.items():
            d.chmod(mode)


@pytest.mark.parametrize("level", [sandbox.PIDNS, sandbox.NONE])
def test_a_zygote_started_before_the_probe_said_another_level_is_never_used_and_ends_with_the_run(
        reachable: Path, monkeypatch: pytest.MonkeyPatch, level: str) -> None:
    """A one-slot root run starts its zygote before its level is known and runs the probe's sh in it;
    where that fails (a host whose attempts get no uid of their own) and the per-process probe then
    says another level, the attempts run at that level, nothing but the probe ever started through the
    zygote, and it ends with the run (no process of it is left)."""
    from agent_runner.runner import RunOptions, run_suite
    from tests.support.runner import write_suite

    tmp_path = reachable
    suite = write_suite(tmp_path / "suite", {"t": {"script": [{"content": "x", "finish": "stop"}],
                                                   "repo": {"run_tests.sh": "exit 0\n"}}})
    monkeypatch.setattr(isolation_probe, "_detected", None)
    monkeypatch.setattr(isolation_probe, "_detecting", None)
    monkeypatch.setattr(isolation_probe, "_net_works", {})  # what the failing probe finds stays in this test
    monkeypatch.setattr(isolation_probe, "probe_script", lambda level, net, proc="/proc": "exit 1")
    monkeypatch.setattr(isolation_probe, "detect", lambda network=True: level)
    monkeypatch.setattr(zygote, "_local", type(zygote._local)())  # this thread's zygotes: none yet, none given up
    made: list[bool] = []
    used: list[object] = []
    real_init, real_start = zygote.Zygote.__init__, zygote.Zygote.start

    def counted(self: zygote.Zygote, net: bool) -> None:
        made.append(net)
        real_init(self, net)

    def start(self: zygote.Zygote, *args: object, **kwargs: object) -> object:
        used.append(args)
        return real_start(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(zygote.Zygote, "__init__", counted)
    monkeypatch.setattr(zygote.Zygote, "start", start)
    code = run_suite(RunOptions(suite=str(suite), out=str(tmp_path / "out"), workspace_root=str(tmp_path / "ws"),
                                run_id="r", host="h"))
    assert code == 0
    assert [r["verdict"] for r in records(tmp_path / "out" / "results.jsonl")] == ["pass"]
    assert made == [True] and [a[0] for a in used] == [["sh", "-c", "exit 1"]]  # started early: the probe only
    assert zygote._all == []
    children = [p for p in os.listdir("/proc") if p.isdigit() and _parent(p) == os.getpid()]
    assert children == [], children


def _parent(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def test_a_zygote_whose_pid_namespace_is_refused_is_none_and_the_start_goes_the_per_process_way(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A root runner may be refused a PID namespace (a count reached): ``take`` says none, never raises."""
    from agent_runner import privs

    def refused(self: object) -> None:
        raise privs._NoNamespace("unshare: No space left on device", errno.ENOSPC)

    monkeypatch.setattr(privs._ChildrenInNewPidNamespace, "__enter__", refused)
    monkeypatch.setattr(zygote, "_local", type(zygote._local)())  # this thread's zygotes: none yet
    assert zygote.take(True) is None


def test_a_zygote_started_when_the_thread_cannot_come_back_to_its_pid_namespace_is_ended(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Should bringing the thread back to its own PID namespace fail after the zygote's process ran,
    that process is killed and reaped, and the start goes the per-process way."""
    from agent_runner import privs

    made: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def recorded(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        proc = real_popen(*args, **kwargs)  # type: ignore[call-overload]
        made.append(proc)
        return proc

    real_exit = privs._ChildrenInNewPidNamespace.__exit__

    def failing_exit(self: object, *exc: object) -> None:
        real_exit(self, *exc)  # type: ignore[arg-type]
        raise OSError(errno.ENOMEM, "setns back to the runner's PID namespace: Cannot allocate memory")

    monkeypatch.setattr(zygote.subprocess, "Popen", recorded)
    monkeypatch.setattr(privs._ChildrenInNewPidNamespace, "__exit__", failing_exit)
    monkeypatch.setattr(zygote, "_local", type(zygote._local)())
    assert zygote.take(True) is None
    assert len(made) == 1 and made[0].returncode is not None  # killed and reaped
