"""``run``: replay every task x attempt of a suite on this host.

Per attempt: a fresh workspace (a copy of the task's repo/, or empty) under the workspace root, HOME and
TMPDIR pointed at empty directories of the attempt, only the allowlisted environment, the agent under
the runner's budget, the predicate run from a pristine copy of run_tests.sh, golden scoring and the
contract check, one trace and one results.jsonl row. The attempt's directory is removed afterwards,
whatever happened: beside the next attempts when its files are its own uid's and on a disk (``Removals``),
else before the next attempt starts; every one is gone before the run ends.

Exit: 0 every attempt ran (verdicts are data), 2 bad input or a visible secret-shaped key, 3 the
runner itself failed (an attempt raised, or a workspace could not be removed).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple

from . import agents, golden, paced, zygote
from .capped import capture
from .checker import check_turns
from .digests import HashingWriter, write_announced
from .envkeys import ATTEMPT_ENV_KEYS
from .errors import InputError, RunnerError, SecretVisible, SuiteError
from .fingerprint import collect, commands_of
from .isolation_probe import answer_by_zygote, attempt_sandbox
from .loop import LoopOutcome, drive
from .pins import env_sha, runner_home, task_pins
from .reaped import leave_reaped_mark
from .recordclass import dataclass
from .records import EvidenceCut, Fingerprint, ResultRow
from .redact import redact, redact_text, secret_env_keys
from .removals import IN_MEMORY, Removals, remove_tree
from .sandbox import (
    NONE,
    PIDNS_UID,
    Sandbox,
    attempt_uid,
    reachable_by_others,
    split_level,
)
from .strays import StrayWatch, keep_until_exit, walk_beside
from .suite import Suite, Task, load_suite
from .suite_digest import (
    EMPTY_DIGEST,
    SHARED_PART,
    BundleChanged,
    part_digest,
    part_digests,
    suite_sealed,
    task_part,
)
from .tools import ToolBox
from .trace import TraceWriter
from .trace_stream import STREAM, TraceStream

if TYPE_CHECKING:  # imported where used: only a run under --trace-files needs the tracer (its import
    # and regular expressions, ~2.5 ms); only a run in slots a pool (``slots``, ~7 ms of imports)
    from . import filetrace

DEFAULT_ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "TZ")
PREDICATE = "run_tests.sh"
#: agent kinds whose attempts need no scratch directory (no agent process, nothing of theirs to keep)
_NO_SCRATCH = ("none", "scripted")
#: the predicate's output kept in the trace, pass or fail: its last this many bytes
PREDICATE_OUTPUT_CAP = 2000


def fresh_directory(parent: Path, prefix: str) -> Path:
    """A new directory ``<parent>/<prefix><8 hex digits>`` (700), as ``tempfile.mkdtemp`` makes one,
    without importing ``tempfile`` and ``random`` for it (~4 ms of every runner's start)."""
    while True:
        path = parent / f"{prefix}{os.urandom(4).hex()}"
        try:
            path.mkdir(0o700)
        except FileExistsError:
            continue
        return path


@dataclass
class RunOptions:
    """What ``agent_runner run`` was asked to do."""

    suite: str
    out: str
    host: Optional[str] = None
    run_id: Optional[str] = None
    tasks: Optional[List[str]] = None
    repeat: Optional[int] = None
    #: the number of the first attempt (a later round of ``replay --until-decided`` goes on numbering)
    first_attempt: int = 0
    workspace_root: Optional[str] = None
    env_allow: Optional[List[str]] = None
    #: attempts run at once, each in its own workspace, HOME, TMPDIR and budget (default 1)
    slots: int = 1
    #: run every process of an attempt under strace where it exists; keep the paths touched (filetrace.py)
    trace_files: bool = False
    #: the attempts' traces as frames of one file, ``out/traces.stream`` (trace_stream.py)
    trace_stream: bool = False
    #: a file made when the run ends with no process of any attempt left (``leave_reaped_mark``)
    reaped: Optional[str] = None


@dataclass
class AttemptResult:
    """One attempt's outcome, as the run records it."""

    task: str
    attempt: int
    verdict: str
    reason: str
    why: str
    predicate_exit: Optional[int]
    wall_ms: int
    steps: int
    env_sha: str
    internal_error: bool = False
    strays: Optional[List[str]] = None  # files it wrote outside its workspace (a finding, not a verdict)


class _Terminated(BaseException):
    """SIGTERM, turned into an exception so every workspace is still removed on the way out."""


def _on_sigterm(signum: int, frame: Optional[FrameType]) -> None:
    raise _Terminated()


def refuse_visible_secrets(environ: Dict[str, str]) -> None:
    keys = secret_env_keys(environ)
    if keys:
        raise SecretVisible(f"refusing to start: secret-shaped environment key {keys[0]} is visible to the "
                            f"runner{' (and ' + ', '.join(keys[1:]) + ')' if keys[1:] else ''}; run it through "
                            f"env -i with an allowlist (crosshost does)")


def _owner_writable(top: Path) -> None:
    for root, dirs, files in os.walk(str(top)):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            st = os.lstat(name)
            if not stat.S_ISLNK(st.st_mode) and not st.st_mode & stat.S_IWUSR:
                os.chmod(name, stat.S_IMODE(st.st_mode) | stat.S_IWUSR)


class Runner:
    def __init__(self, suite: Suite, options: RunOptions, out: Path, workspace_root: Path,
                 fingerprint: Fingerprint, host: str, run_id: str, env_allow: List[str],
                 stray_walk: Optional[Callable[[], StrayWatch]] = None,
                 stream: Optional[TraceStream] = None) -> None:
        self.suite = suite
        self.options = options
        self.out = out
        self.stream = stream  # the attempts' traces, when they go into one file (trace_stream.py)
        self.workspace_root = workspace_root
        self.fingerprint = fingerprint
        self.host = host
        self.run_id = run_id
        self.env_allow = env_allow
        self.isolation, self.net = split_level(fingerprint.isolation or NONE)
        if self.isolation == PIDNS_UID and _may_reuse(options, workspace_root, suite):
            zygote.prestart(self.net)  # the attempts run on this thread: its zygote starts meanwhile
        self.fingerprint_json = fingerprint.to_json()  # what every attempt's turns are checked against
        self.home = os.environ.get("HOME")
        self._uids: Set[int] = set()  # the uids of attempts running now (each has its own)
        self._lock = threading.Lock()
        # Read once, when the run starts: the bundle as the controller verified it just before.
        self.predicates = {t.id: t.predicate.read_bytes() for t in suite.tasks if t.predicate is not None}
        # An attempt with a uid of its own and no capability (pidns+uid) cannot write a suite that only
        # root or the runner may write: the check before each attempt is then not needed (it is
        # again from the first attempt run without a uid of its own, see ``run_attempt``), nor are
        # the digests it compares until then. That attempt's check digests the suite first: no
        # attempt could have changed it since the run started, so the digests are what they would
        # have been then (only root or the runner's user could have).
        self.bundle_sealed = self.isolation == PIDNS_UID and suite_sealed(suite.root)
        self._suite_digests: Optional[Dict[str, str]] = None if self.bundle_sealed else part_digests(suite.root)
        self._digests_lock = threading.Lock()
        #: every attempt so far ran as a uid of its own (``attempt_sandbox`` gives a lower level to an
        #: attempt whose paths another uid cannot reach)
        self.every_attempt_own_uid = True
        # Only a uid of its own makes what an attempt left outside its workspace attributable to it.
        self.stray_watch: Optional[StrayWatch] = None
        if self.isolation == PIDNS_UID:
            self.stray_watch = stray_walk() if stray_walk is not None else StrayWatch(self.home)
        self.removals = Removals(beside=fingerprint.cwd_fs not in IN_MEMORY)  # a disk's waits, not memory's
        self._pins: Dict[str, Dict[str, Any]] = {}

    def bundle_check(self, task_id: str) -> float:
        """What an attempt of ``task_id`` is run from is as it was when the run started (an attempt may
        not change the next one's): the suite's shared files and the task's own directory. Only these
        are digested again, so the check costs as much in a suite of 10 tasks as in one of 10,000.
        Returns the seconds spent on the whole suite's digests first (a run that started sealed, see
        ``__init__``: made once, by the first check, or waited for while another slot makes them),
        which are not the attempt's own time."""
        digests, spent = self._suite_digests, 0.0  # read without the lock: once made, they never change
        if digests is None:
            began = time.monotonic()
            with self._digests_lock:
                if self._suite_digests is None:
                    self._suite_digests = part_digests(self.suite.root)
                digests = self._suite_digests
            spent = time.monotonic() - began
        for part in (SHARED_PART, task_part(task_id)):
            if part_digest(self.suite.root, part) != digests.get(part, EMPTY_DIGEST):
                what = "its shared files" if part == SHARED_PART else part + "/"
                raise BundleChanged(f"{self.suite.root}: the bundle changed during the run ({what}); attempts "
                                    f"run from the changed files are not run")
        return spent

    def attempt_env(self, work: Path, home: Path, tmp: Path) -> Dict[str, str]:
        env = {k: os.environ[k] for k in self.env_allow if k in os.environ}
        env.setdefault("PATH", os.defpath)
        env.update(zip(ATTEMPT_ENV_KEYS, (str(home), str(tmp), str(work))))  # noqa: B905 (3.9: no strict=)
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # nothing of a run is written into the bundle cache
        return env

    def run_attempt(self, task: Task, attempt: int) -> AttemptResult:
        started = time.monotonic()
        pins = self._pins.get(task.id)
        if pins is None:  # the same for every attempt of the task: computed from files that cannot change
            pins = self._pins[task.id] = task_pins(self.suite, task)
        digest = self.fingerprint.fingerprint or ""
        this_env_sha = env_sha(digest, pins)
        trace_path = self.out / "traces" / f"{task.id}.{attempt}.jsonl"
        obs_path = self.out / "traces" / f"{task.id}.{attempt}.obs.jsonl"
        attempt_dir = fresh_directory(self.workspace_root, f"{task.id}.{attempt}.")
        writer: Optional[TraceWriter] = None
        # Its uid may pass through the attempt's directory to its own work, home and tmp, no further.
        attempt_dir.chmod(0o711)
        with self._lock:
            uid = attempt_uid(self._uids)
        box = attempt_sandbox(self.isolation, uid, str(attempt_dir / "work"),
                              str(self.suite.root / "suite.json"), net=self.net,
                              writable=(str(self.workspace_root),))
        mark = self.stray_watch.mark() if self.stray_watch is not None and box.uid is not None else None
        try:
            work, home, tmp, scratch = (attempt_dir / n for n in ("work", "home", "tmp", "scratch"))
            if box.uid is None:
                self.bundle_sealed = False  # this attempt could change what the next ones run from
                self.every_attempt_own_uid = False  # nor is its every process sure to end with the run
            if not self.bundle_sealed:
                started += self.bundle_check(task.id)  # its budget and wall time start after the whole suite's digests
            if task.repo_dir is not None:
                shutil.copytree(str(task.repo_dir), str(work), symlinks=True)
                _owner_writable(work)  # the bundle's copy is read-only; the attempt's own is not
            else:
                work.mkdir()
            # the built-in agents that start no agent process write nothing there (the tracer does)
            wanted = (home, tmp) if task.agent.kind in _NO_SCRATCH and not self.options.trace_files else (home, tmp, scratch)
            for directory in wanted:
                directory.mkdir(mode=0o700)
            box.give(str(work), str(home), str(tmp))
            work.chmod(0o700)  # another attempt's uid may neither list, read nor write it
            # The predicate was read when the run started, from the bundle as the controller verified it.
            pristine = self.predicates.get(task.id)
            env = self.attempt_env(work, home, tmp)
            writer = TraceWriter(trace_path, obs_path, announce_under=self.out, stream=self.stream)
            writer.header(run_id=self.run_id, host=self.host, task=task.id, attempt=attempt,
                          fingerprint=digest, pins=pins, env_sha=this_env_sha,
                          agent=task.agent.kind,
                          # the controller's cross-host leak rule recognises these in any form
                          dirs={"attempt": str(attempt_dir), "cwd": str(work), "home": str(home), "tmp": str(tmp)})
            tracer: Optional[filetrace.Tracer] = None
            if self.options.trace_files:
                from . import filetrace

                strace = filetrace.strace_path()
                tracer = filetrace.Tracer(strace, scratch) if strace else None
            outcome = self._run_agent(task, work, env, scratch, writer, started,
                                      box.traced(tracer.wrap("agent")) if tracer else box, attempt)
            predicate_exit, predicate_output, predicate_error = self._run_predicate(
                task, pristine, work, env, box.traced(tracer.wrap("predicate")) if tracer else box)
            if self.options.trace_files:
                own = [str(attempt_dir), str(work), str(home), str(tmp), str(self.suite.root), _runner_home()]
                self._write_file_evidence(self.out / "files" / f"{task.id}.{attempt}.json", tracer, own,
                                          env.get("PATH", ""))
            strays: List[str] = []
            if mark is not None and box.uid is not None:  # its uid is its own: what it owns is its own
                strays = mark.watch.since(mark, box.uid, str(attempt_dir))
            checked = [self.fingerprint_json, {"cwd": str(attempt_dir), "home": str(home)}]
            # No turns, no findings: skip compiling this attempt's path patterns (a predicate-only task)
            findings = check_turns(self.suite.contract, outcome.turns, checked) if outcome.turns else []
            reasons = golden.score(task, outcome.turns, outcome.reason)
            # a negative golden task's declared findings are its pass, not its failure; missing one fails it
            reasons += [f"contract: {f.line()}" for f in findings
                        if not f.weak and not golden.expected(f.kind, f.tool, task)]  # weak: the controller decides
            reasons += golden.missed_findings(task, findings)
            if outcome.infra_error is not None or predicate_error is not None:
                verdict, why = "error", outcome.infra_error or predicate_error or ""
            else:
                if predicate_exit not in (None, 0):
                    last = predicate_output.splitlines()[-1][:200] if predicate_output else ""
                    said = f" ({last})" if last else ""
                    reasons.insert(0, f"predicate {PREDICATE} exited {predicate_exit}{said}")
                verdict, why = ("fail", "; ".join(reasons)) if reasons else ("pass", "ok")
            wall_ms = int((time.monotonic() - started) * 1000)
            writer.finish(reason=outcome.reason, final=outcome.final, predicate_exit=predicate_exit,
                          verdict=verdict, why=why, wall_ms=wall_ms, steps=len(outcome.turns),
                          findings=[f.to_dict() for f in findings],
                          predicate_output=predicate_output if task.predicate is not None else None,
                          **outcome.agent_record, **({"outside_workspace": strays} if strays else {}))
            return AttemptResult(task.id, attempt, verdict, outcome.reason, why, predicate_exit, wall_ms,
                                 len(outcome.turns), this_env_sha, strays=strays)
        except Exception as exc:  # a runner bug in one attempt is recorded; the others still run
            wall_ms = int((time.monotonic() - started) * 1000)
            why = f"runner internal error: {type(exc).__name__}: {exc}"
            if writer is not None:
                with contextlib.suppress(OSError):
                    writer.finish(reason="agent_error", final="", predicate_exit=None, verdict="error",
                                  why=why, wall_ms=wall_ms, steps=writer.steps, findings=[])
            return AttemptResult(task.id, attempt, "error", "agent_error", why, None, wall_ms,
                                 writer.steps if writer else 0, this_env_sha, internal_error=True)
        finally:
            if writer is not None:
                writer.close()

            def release() -> None:
                with self._lock:
                    self._uids.discard(uid)

            if box.uid is not None:  # out of every other attempt's reach until gone: removed beside the next
                self.removals.remove(attempt_dir, release)
            else:  # a uid shared with the next attempt: gone before it starts
                try:
                    remove_tree(attempt_dir)
                finally:
                    release()

    def _run_agent(self, task: Task, work: Path, env: Dict[str, str], scratch: Path, writer: TraceWriter,
                   started: float, box: Sandbox, attempt: int = 0) -> LoopOutcome:
        deadline = started + task.budget.timeout_s
        if task.agent.kind == "exec":  # its own program runs its tools; the proxy saw its turns
            from .exec_agent import run_exec  # its urllib costs a start that runs no exec agent ~15 ms

            return run_exec(task, attempt, work, env, scratch, self.suite.root, writer, deadline, box)
        agent = agents.make_agent(task.agent)
        toolbox = ToolBox(self.suite.contract, self.suite.tools, task.fixtures, work, env, box)
        ctx = agents.AgentContext(task=task, prompt=task.prompt, tools=list(self.suite.contract.get("tools", [])),
                                  workspace=work, env=env, suite_dir=self.suite.root, scratch=scratch,
                                  attempt=attempt, sandbox=box)
        try:
            try:
                agent.start(ctx)
            except agents.AgentInfraError as exc:
                return LoopOutcome(reason="agent_error", final=str(exc), infra_error=str(exc))
            except agents.AgentFailed as exc:
                return LoopOutcome(reason="agent_error", final=str(exc))
            outcome = drive(agent, toolbox, task.budget, writer, deadline)
            outcome.agent_record = agent.finish_record()
            return outcome
        finally:
            agent.close()

    def _write_file_evidence(self, target: Path, tracer: Optional[filetrace.Tracer], own: List[str],
                             env_path: str) -> None:
        from . import filetrace

        shown = filetrace.shown_path(env_path)
        if tracer is None:
            filetrace.write_evidence(target, traced=False, why="strace is not in this host's system directories", env_path=shown)
            return
        cut = {"predicate": EvidenceCut(), "agent": EvidenceCut()}
        try:
            paths = tracer.paths("predicate", own, cut["predicate"])
            agent_paths = tracer.paths("agent", own, cut["agent"])
        except OSError as exc:
            filetrace.write_evidence(target, traced=False, why=f"strace wrote no log: {exc.strerror or exc}",
                                     env_path=shown)
            return
        filetrace.write_evidence(target, traced=True, paths=paths, agent_paths=agent_paths, env_path=shown,
                                 cut={side: c for side, c in cut.items() if c.dropped})

    def _run_predicate(self, task: Task, pristine: Optional[bytes], work: Path, env: Dict[str, str],
                       box: Sandbox) -> Tuple[Optional[int], str, Optional[str]]:
        """(exit code, its output's last ``PREDICATE_OUTPUT_CAP`` bytes, harness error). An agent that
        rewrote run_tests.sh gets the pristine one back before it runs."""
        if pristine is None:
            return None, "", None
        target = work / PREDICATE
        try:
            if not _made_pristine(target, pristine):
                if target.is_dir() and not target.is_symlink():
                    remove_tree(target)
                elif target.exists() or target.is_symlink():
                    target.unlink()
                target.write_bytes(pristine)
                target.chmod(0o755)
        except OSError as exc:
            return None, "", f"could not restore the pristine {PREDICATE}: {exc}"
        try:
            proc = box.popen(["sh", PREDICATE], cwd=str(work), env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as exc:
            return None, "", f"the predicate could not start: {exc.strerror or exc}"
        try:
            # read as it comes, the last bytes kept: a predicate printing without end costs no memory
            got = capture(proc, task.budget.timeout_s, PREDICATE_OUTPUT_CAP, keep="tail",
                          on_timeout=proc.kill_group)
        finally:
            proc.kill_group()  # not ended (an error): it and what it started die; ended: its wait killed them
        if got.timed_out:
            return 124, "timed out", None  # like timeout(1): a predicate that hangs fails
        kept = got.kept.decode("utf-8", "replace").strip()
        shown = "…" + kept if got.dropped else kept
        if got.death is not None:  # what it was, never a timeout
            shown = f"{got.death}\n{shown}".rstrip()
        return (got.returncode if got.returncode is not None else 137), shown, None


def _made_pristine(target: Path, pristine: bytes) -> bool:
    """The workspace's own copy of the predicate made what a fresh write of ``pristine`` makes, without a
    new file (a new inode per attempt is the dearest step of an attempt on some file systems): only
    when it is a regular file of one link (not one the attempt shares with a file elsewhere) holding
    exactly ``pristine``. Then its owner and mode become the runner's and 755 (set-id bits cleared),
    as a file the runner wrote; its group the one a new file there would get. Nothing of the attempt
    runs any more (its processes end with their namespaces before the predicate starts), so what is
    read here is what the predicate runs. False: the caller writes it afresh."""
    try:
        fd = os.open(str(target), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size != len(pristine):
            return False
        if os.read(fd, len(pristine) + 1) != pristine:
            return False
        parent = os.stat(str(target.parent))
        os.fchown(fd, os.geteuid(), parent.st_gid if parent.st_mode & stat.S_ISGID else os.getegid())
        os.fchmod(fd, 0o755)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _runner_home() -> str:
    """Where the runner's own code is (its zipapp, or its package): its own reads are not evidence."""
    home = runner_home()
    return home if os.path.isfile(home) else os.path.join(home, "agent_runner")


def _select_tasks(suite: Suite, wanted: Optional[List[str]]) -> List[Task]:
    if not wanted:
        return list(suite.tasks)
    return [suite.task(task_id) for task_id in wanted]


def _may_reuse(options: RunOptions, workspace_root: Path, suite: Suite) -> bool:
    """Whether this run's attempts may start through a zygote, as far as it is known before the
    isolation probe has said its level (which must also be ``pidns+uid``): as root, one slot, and the
    attempts' uids can reach their work and the suite."""
    return os.geteuid() == 0 and options.slots <= 1 and all(
        reachable_by_others(p) for p in (str(workspace_root / "work"), str(suite.root / "suite.json")))


def run_suite(options: RunOptions) -> int:
    refuse_visible_secrets(dict(os.environ))
    suite = load_suite(options.suite)
    tasks = _select_tasks(suite, options.tasks)
    repeat = suite.repeat if options.repeat is None else options.repeat
    if repeat < 1:
        raise InputError(f"--repeat must be at least 1, got {repeat}")
    if options.first_attempt < 0:
        raise InputError(f"--first-attempt must be 0 or more, got {options.first_attempt}")
    for task in tasks:
        agents.check_available(task.agent.kind, where=f"{suite.root}: task {task.id}")
        if task.agent.kind == "command" and not (suite.root / "agent").exists() and any(
                "{suite}/agent" in a for a in task.agent.command or []):
            raise SuiteError(f"{suite.root / 'agent'}: missing (the command agent of task {task.id} lives there)")
    env_allow = list(DEFAULT_ENV_ALLOW if options.env_allow is None else options.env_allow)
    out = Path(options.out)
    try:
        (out / "traces").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{out}: cannot create the output directory: {exc.strerror or exc}") from exc
    own_root = options.workspace_root is None
    if own_root:
        import tempfile  # only here: a replay names the root (its import and random's: ~4 ms of a start)

        workspace_root = Path(tempfile.mkdtemp(prefix="crosshost-ws-"))
    else:
        workspace_root = Path(options.workspace_root or "")
        try:
            workspace_root.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):  # one it makes: passable, not listable by attempts
                workspace_root.mkdir(mode=0o711)
                workspace_root.chmod(0o711)  # whatever the umask
        except OSError as exc:
            raise InputError(f"{workspace_root}: cannot create the workspace root: {exc.strerror or exc}") from exc
    workspace_root = workspace_root.resolve()
    stream: Optional[TraceStream] = None
    if options.trace_stream:
        try:
            stream = TraceStream(out / STREAM)
        except OSError as exc:
            raise InputError(f"{out / STREAM}: cannot create it: {exc.strerror or exc}") from exc
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    runner: Optional[Runner] = None
    try:
        # The fingerprint describes where agents work: the configured workspace root (stable across runs).
        run_id = options.run_id or time.strftime("%Y%m%dT%H%M%S") + "-" + os.urandom(3).hex()  # as uuid4().hex[:6]
        # only where its attempts may get uids of their own (root); on a thread, while the fingerprint is taken
        stray_walk = walk_beside(os.environ.get("HOME")) if os.geteuid() == 0 else None
        if _may_reuse(options, workspace_root, suite):
            # before the fingerprint: the probe's sh runs in the sandbox the attempts will get (where it
            # fails, the zygote is given up and the fingerprint probes the per-process way)
            net = suite.network != "open"
            if not answer_by_zygote(net):
                zygote.prestart(net)  # started meanwhile where a probe runs already; none where given up
        fingerprint = collect(cwd=str(workspace_root) if not own_root else os.getcwd(),
                              allowed_commands=commands_of(suite.tools), open_network=suite.network == "open")
        write_announced(out, out / "fingerprint.json",
                        json.dumps(redact(fingerprint.to_json()), indent=2, sort_keys=True) + "\n")
        host = options.host or fingerprint.hostname or default_host()
        runner = Runner(suite, options, out, workspace_root, fingerprint, host, run_id, env_allow, stray_walk,
                        stream)
        failed = False
        first = options.first_attempt
        attempts = [(task, attempt) for task in tasks for attempt in range(first, first + repeat)]
        with HashingWriter(out, out / "results.jsonl") as results:

            def record(result: AttemptResult) -> None:
                nonlocal failed
                failed = failed or result.internal_error
                row = ResultRow(task=result.task, env=host, attempt=result.attempt, verdict=result.verdict,
                                reason=result.reason, run_id=run_id, env_sha=result.env_sha,
                                exit_code=result.predicate_exit, wall_ms=result.wall_ms,
                                fingerprint=fingerprint.fingerprint, why=result.why)
                results.write(json.dumps(redact(row.to_json())) + "\n")
                results.flush()
                # stderr reaches the controller's terminal and manifest: redacted like the files
                paced.STDERR.line(redact_text(
                    f"[{host}] {result.task}.{result.attempt} {result.verdict} ({result.reason}, "
                    f"{result.steps} steps, {result.wall_ms} ms)"
                    f"{'' if result.verdict == 'pass' else ': ' + redact_text(result.why)[:160]}"))
                if result.strays:
                    paced.STDERR.line(redact_text(f"[{host}] {result.task}.{result.attempt} wrote outside its "
                                                  f"workspace: {', '.join(result.strays[:5])}"))

            if options.slots <= 1:
                for task, attempt in attempts:
                    record(runner.run_attempt(task, attempt))
            else:
                from .slots import run_in_slots  # a pool's imports only for a run in slots

                run_in_slots(runner, attempts, options.slots, record)
        if runner.stray_watch is not None:
            runner.stray_watch.close_beside()  # every attempt was looked at: its descriptor closes while the run ends
        runner.removals.wait()
        leftovers = sorted(p.name for p in workspace_root.iterdir()) if workspace_root.exists() else []
        if leftovers and not own_root:
            raise RunnerError(f"{workspace_root}: attempt workspaces left behind: {', '.join(leftovers[:5])}")
        return 3 if failed else 0
    except _Terminated:
        paced.STDERR.line("terminated: workspaces removed")
        return 143
    finally:
        if stream is not None:
            stream.close()
        paced.flush_all()  # the run's last digests and progress lines, before anything else is said
        zygote.close_all()  # every slot's namespaces end with the run
        if runner is not None:
            runner.removals.close()  # also when terminated: every attempt's directory is gone first
            keep_until_exit(runner.stray_watch)  # its descriptor closes with the process
        if options.reaped:
            leave_reaped_mark(options.reaped, runner is not None and runner.isolation == PIDNS_UID
                              and runner.every_attempt_own_uid)
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
        if own_root:
            remove_tree(workspace_root)


def default_host() -> str:
    return socket.gethostname()
