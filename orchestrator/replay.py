"""``crosshost replay``: one suite, every host of the inventory, every trace brought home.

Per host, in a bounded pool (``fanout``): connect (transient failures retried by the transport and
each retry recorded here), create the workspace and push the bundle (skipped when cached; one exec),
run the runner under ``timeout -s KILL`` with a clean environment (it fingerprints the host before its
first task) and pack its ``out/`` as one tar in the same exec, pull that tar (size checked first, read
by ``archive``), and — always, in ``finally`` — remove the run's workspace and verify it is gone. One host failing is
that host's result; the run directory is complete without the analysis, which runs last.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import json
import math
import os
import posixpath
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator import __version__, remote
from orchestrator.analysis import analyse_run
from orchestrator.analysis.models import RunReport
from orchestrator.archive import ArchiveLimits, max_archive_bytes, read_archive
from orchestrator.bundle import Bundle, build_bundle
from orchestrator.errors import (
    ArchiveRejected,
    AuthenticationFailed,
    HostError,
    HostKeyRejected,
    HostUnreachable,
    RunnerCrashed,
    SuiteError,
    TraceError,
    WorkspaceLeft,
    one_line,
)
from orchestrator.exit_policy import COMPARE_LAST_REASON, replay_exit
from orchestrator.fanout import FanoutResult, Interrupted, default_jobs, fan_out
from orchestrator.history import after_replay
from orchestrator.host_fingerprint import (
    fingerprint_script,
    run_workspace,
    tail,
    work_dir,
)
from orchestrator.proxy import model_route, openai_agent_config, require_api_key
from orchestrator.report import write_reports
from orchestrator.rundir import HostRecord, Manifest, ResultRow, RunDir, SuiteRef, iter_results, utc_now
from orchestrator.transport import Opener, default_opener
from orchestrator.transport.base import ExecResult, Host

#: on top of timeout_s x attempts: start-up, fingerprint, writing out/ and packing it
RUN_MARGIN_S = 60
SHORT_TIMEOUT_S = 120.0
#: connection-level failures: the host is unreachable, not merely failing
_UNREACHABLE = (HostUnreachable, HostKeyRejected, AuthenticationFailed)
#: what a host's out.tar may hold; its size is checked on the host before anything is transferred
PULL_LIMITS = ArchiveLimits()


class HostConfigLike(Protocol):
    name: str
    transport: str
    env_allowlist: list[str]
    env: dict[str, str]
    workspace_root: str
    timeout_s: float
    python: str


#: (host, stage, detail): stage is one of STAGES, or "retry", "done", "failed"
EventSink = Callable[[str, str, str], None]


@dataclass
class ReplayRequest:
    suite_dir: Path
    inventory_path: Path = Path("hosts.toml")
    hosts: list[str] | None = None
    tasks: list[str] | None = None
    repeat: int | None = None
    out: Path = Path("runs")
    jobs: int | None = None
    gate: float | None = None
    accept_new: bool = False
    cache_dir: Path | None = None
    compare_last: bool = False  # exit 1 when a task newly flips against the previous run (history)
    kind: str = "replay"  # what the manifest (and the history index) calls this run: "replay", "repro"
    #: keep a copy of the suite in the run directory under this name; the manifest points at it (a
    #: suite built for this one run, as ``repro``'s, lives nowhere else)
    keep_suite: str | None = None


@dataclass
class ReplayOutcome:
    run_dir: RunDir
    manifest: Manifest
    exit_code: int
    report: RunReport | None = None
    results: list[ResultRow] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    exit_reason: str = ""  # why exit_code, one line (the summary line says it)
    notes: list[str] = field(default_factory=list)  # said after the summary (the history index's)


# --------------------------------------------------------------------------------------------- suite


def _contract_bytes(bundle: Bundle) -> bytes:
    """The run's contract.json: the suite's contract as the runner checks it."""
    return (json.dumps(bundle.suite.contract, indent=2, sort_keys=True) + "\n").encode()


# ----------------------------------------------------------------------------------------- per host


class _Shared:
    """State the host workers share: the retry log and the runs in flight (for Ctrl-C)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.retries: list[dict[str, Any]] = []
        self.running: dict[str, tuple[Host, str]] = {}  # host -> (connection, workspace)
        self.cancel = threading.Event()


@dataclass
class _Plan:
    run_dir: RunDir
    bundle: Bundle
    tasks: list[str]
    all_tasks: bool
    repeat: int
    shared: _Shared
    opener: Opener
    accept_new: bool
    emit: EventSink
    #: the model proxy's settings when a task uses agent.kind = "openai" (orchestrator/proxy.py)
    model: dict[str, Any] | None = None


class HostJob:
    """Everything one host does in one replay; ``__call__`` never leaves the run's workspace behind."""

    def __init__(self, cfg: Any, plan: _Plan) -> None:
        self.cfg = cfg
        self.plan = plan
        self.record = HostRecord()
        self.cleanup_error: str | None = None
        self.created = False  # the run's workspace exists on the host: clean it up
        self.workspace = run_workspace(cfg.workspace_root, plan.run_dir.run_id)
        self.host_dir = plan.run_dir.host_dir(cfg.name)

    # The stages -------------------------------------------------------------------------------

    def __call__(self, _name: str) -> HostRecord:
        host: Host | None = None
        run_started = run_finished = False
        error: BaseException | None = None
        try:
            host = self._stage("connect", self._connect)
            self.record.reachable = True
            self._check_cancel()
            self.record.bundle_pushed = self._stage("push", lambda: self._prepare(host))
            self._check_cancel()
            run_started = True
            # The runner writes out/fingerprint.json before its first task; the run's exec packs out/.
            result = self._stage("run", lambda: self._run(host))
            run_finished = True
            self.record.runner_exit = result.exit_code
            result, size = _split_archive_size(result)
            pulled = self._stage("pull", lambda: self._pull(host, size))
            self._check_cancel()  # a runner stopped by Ctrl-C is interrupted, not crashed
            self._judge(result, pulled)
        except BaseException as exc:
            error = exc
            if self.created and run_started and not run_finished and host is not None:
                # Partial results: whatever the runner wrote before it was stopped.
                with contextlib.suppress(Exception):  # the host may be gone; the first error counts
                    self._pull(host)
            raise
        finally:
            self._record_fingerprint()
            if host is not None:
                self._clean(host, self.created, run_started and not run_finished, error)
                host.close()
        self.plan.emit(self.cfg.name, "done", self._done_detail())
        return self.record

    def _stage(self, stage: str, fn: Callable[[], Any]) -> Any:
        self.plan.emit(self.cfg.name, stage, "")
        t0 = time.monotonic()
        try:
            return fn()
        finally:
            self.record.stages[stage] = round(time.monotonic() - t0, 3)

    def _check_cancel(self) -> None:
        if self.plan.shared.cancel.is_set():
            raise Interrupted("interrupted")

    def _connect(self) -> Host:
        name = self.cfg.name

        def on_retry(info: dict[str, Any]) -> None:
            entry = {"host": name, "at": utc_now(), **info}
            with self.plan.shared.lock:
                self.plan.shared.retries.append(entry)
            self.plan.emit(name, "retry", str(info.get("error") or info))

        host: Host = self.plan.opener(self.cfg, accept_new=self.plan.accept_new, on_retry=on_retry)
        return host

    def _exec(self, host: Host, script: str, timeout: float = SHORT_TIMEOUT_S) -> ExecResult:
        return host.exec(["sh", "-c", script], timeout)

    def _prepare(self, host: Host) -> bool:
        """Create the run's workspace and look for the bundle in one exec; push it only when it is
        missing. True when it was pushed."""
        from orchestrator.bundle import bundle_present_test, ensure_bundle

        ws = remote.q(self.workspace)
        runs = remote.q(posixpath.dirname(self.workspace))
        work = remote.q(work_dir(self.workspace))
        present = bundle_present_test(self.plan.bundle, self.cfg.workspace_root)
        made = self._exec(
            host,
            f"{{ {present}; }} && echo bundle-cached; mkdir -p {runs} && mkdir -m 700 {ws} && mkdir {ws}/out {work}",
        )
        if not made.ok:
            raise RunnerCrashed(self.cfg.name, f"cannot create {self.workspace}: {tail(made.stderr)}")
        self.created = True
        if "bundle-cached" in made.stdout.split():
            return False
        return ensure_bundle(host, self.plan.bundle, self.cfg.workspace_root, look=False)

    def _runner_argv(self, *args: str) -> list[str]:
        return [self.cfg.python, self.plan.bundle.remote_runner(self.cfg.workspace_root), *args]

    def _fingerprint_script(self) -> str:
        """``runner fingerprint`` exactly as ``crosshost hosts --suite`` takes it (same digest)."""
        return fingerprint_script(
            self.cfg,
            self.plan.bundle.remote_runner(self.cfg.workspace_root),
            self.plan.run_dir.run_id,
            suite=self.plan.bundle.remote_suite(self.cfg.workspace_root),
        )

    def kill_after_s(self) -> int:
        attempts = max(1, len(self.plan.tasks)) * max(1, self.plan.repeat)
        return int(math.ceil(self.cfg.timeout_s * attempts)) + RUN_MARGIN_S

    def _run(self, host: Host) -> ExecResult:
        suite = self.plan.bundle.remote_suite(self.cfg.workspace_root)
        args = [
            "run", "--suite", suite, "--out", posixpath.join(self.workspace, "out"),
            "--host", self.cfg.name, "--run-id", self.plan.run_dir.run_id,
            "--workspace-root", posixpath.join(self.workspace, "work"),
            "--env-allow", ",".join(self.cfg.env_allowlist),
        ]  # fmt: skip
        if not self.plan.all_tasks:
            args += ["--tasks", ",".join(self.plan.tasks)]
        args += ["--repeat", str(self.plan.repeat)]
        # A live model: the controller's proxy (key added there), reached through a reverse forward on
        # an SSH host; the runner itself gets CROSSHOST_MODEL_URL only (not in --env-allow: tools never see it).
        with model_route(host, self.plan.model, self.host_dir) as model_env:
            script = remote.run_script(
                self.workspace,
                [*self.cfg.env_allowlist, *model_env],
                {**self.cfg.env, **model_env},
                self._runner_argv(*args),
                self.kill_after_s(),
                fingerprint=self._fingerprint_script(),
            )
            with self.plan.shared.lock:
                # Checked under the lock Ctrl-C's snapshot takes: a run is either seen and killed, or
                # never started.
                self._check_cancel()
                self.plan.shared.running[self.cfg.name] = (host, self.workspace)
            try:
                return self._exec(host, script, self.kill_after_s() + 30)
            finally:
                with self.plan.shared.lock:
                    self.plan.shared.running.pop(self.cfg.name, None)

    def _pull(self, host: Host, size: str | None = None) -> int:
        """Bring ``out/`` home as one tar; return the number of files accepted. ``size`` is what the
        run's own exec said of ``out.tar`` (``remote.split_out_tar``); without it (the exec was cut
        off) the archive is made and measured here, in one exec."""
        if size is None:
            ws = remote.q(self.workspace)
            made = self._exec(
                host, f"test -d {ws}/out && tar -C {ws}/out -cf {ws}/out.tar . && wc -c < {ws}/out.tar"
            )
            size = made.stdout if made.ok else "none"
        if size.strip() == "none":
            return 0
        self._check_archive_size(size)
        with tempfile.TemporaryDirectory(prefix=".pull-", dir=self.plan.run_dir.path) as tmp:
            local = Path(tmp) / f"{self.cfg.name}.out.tar"
            host.get(posixpath.join(self.workspace, "out.tar"), local)
            written = read_archive(local, self.host_dir, host=self.cfg.name, limits=PULL_LIMITS)
        return len(written)

    def _check_archive_size(self, reported: str) -> None:
        """Refuse, before transferring it, an out.tar larger than read_archive would accept: a host
        must not be able to fill the controller's disk. ``reported`` is ``wc -c`` of it on the host."""
        where = posixpath.join(self.workspace, "out.tar")
        words = reported.split()
        if not words or not words[-1].isdigit():
            raise ArchiveRejected(self.cfg.name, f"{where}: cannot tell its size ({tail(reported) or 'no answer'})")
        size, cap = int(words[-1]), max_archive_bytes(PULL_LIMITS)
        if size > cap:
            raise ArchiveRejected(
                self.cfg.name,
                f"{where} is {size} bytes, more than the {cap} bytes an archive may have; not transferred "
                "(look for what fills the run's out/)",
            )

    def _judge(self, result: ExecResult, pulled: int) -> None:
        name = self.cfg.name
        if result.timed_out or result.exit_code in (137, -9):  # 128+KILL via a shell, -KILL directly
            raise RunnerCrashed(name, f"runner killed after {self.kill_after_s()} s (timeout_s x attempts + margin)")
        if result.exit_code == 2:
            raise RunnerCrashed(name, f"runner refused its input: {tail(result.stderr or result.stdout)}")
        if result.exit_code != 0:
            raise RunnerCrashed(
                name, f"runner exited {result.exit_code}: {tail(result.stderr or result.stdout) or 'no output'}"
            )
        if not (self.host_dir / "results.jsonl").is_file():
            raise RunnerCrashed(name, f"runner exited 0 but sent no results.jsonl ({pulled} files pulled)")

    def _record_fingerprint(self) -> None:
        """The host's digest and Python, from the fingerprint.json its run sent (none: not reached)."""
        fingerprint, _ = self.plan.run_dir.read_fingerprint(self.cfg.name)
        if fingerprint is not None:
            self.record.fingerprint = fingerprint.fingerprint
            self.record.python = fingerprint.python

    def _clean(self, host: Host, created: bool, kill_first: bool, error: BaseException | None) -> None:
        """Remove the run's workspace and verify it is gone; record the answer, never hide a failure."""
        with contextlib.suppress(BaseException):  # a progress hook must never stop the cleanup
            self.plan.emit(self.cfg.name, "clean", "")
        t0 = time.monotonic()
        try:
            script = remote.remove_script(self.workspace)
            if kill_first:
                script = f"{remote.kill_script(self.workspace)}; {script}"
            res = self._exec(host, script)
            self.record.workspace_removed = res.ok
            if not res.ok:
                left = WorkspaceLeft(
                    self.cfg.name, f"{self.workspace} is still there after rm -rf: {tail(res.stderr)}"
                )
                if error is None:
                    raise left
                self.cleanup_error = left.one_line()  # said beside the first error, never instead of it
        except HostError as exc:
            self.record.workspace_removed = False
            if error is None:
                raise
            if not isinstance(error, _UNREACHABLE):
                self.cleanup_error = exc.one_line()
        finally:
            self.record.stages["clean"] = round(time.monotonic() - t0, 3)
        if not created and self.record.workspace_removed is None:
            self.record.workspace_removed = True

    def _done_detail(self) -> str:
        fp = self.record.fingerprint or "?"
        return f"fingerprint {fp}, bundle {'pushed' if self.record.bundle_pushed else 'cached'}"


# ------------------------------------------------------------------------------------------- the run


def _split_archive_size(result: ExecResult) -> tuple[ExecResult, str | None]:
    """The run's result with the archive marker taken off its stdout, and what the marker said."""
    stdout, size = remote.split_out_tar(result.stdout)
    return dataclasses.replace(result, stdout=stdout), size


def _stop_running(shared: _Shared) -> None:
    """Ctrl-C: kill every runner in flight (its process group); the workers then clean up."""
    with shared.lock:
        shared.cancel.set()
        running = list(shared.running.values())

    def kill(host: Host, ws: str) -> None:
        with contextlib.suppress(Exception):  # a dead host cannot be helped; its worker records it
            host.exec(["sh", "-c", remote.kill_script(ws)], 30)

    threads = [threading.Thread(target=kill, args=item, daemon=True) for item in running]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=35)


def _error_line(exc: BaseException) -> str:
    return "interrupted" if isinstance(exc, Interrupted) else one_line(exc)


def _host_rows(run_dir: RunDir, name: str) -> list[ResultRow]:
    """The rows a host sent (none when it sent no file). A file that is not the runner's JSONL of
    this host's rows is the host's fault: RunnerCrashed naming file:line, the file kept aside."""
    path = run_dir.host_dir(name) / "results.jsonl"
    if not path.is_file():
        return []
    try:
        got: list[ResultRow] = []
        for where, row in iter_results(path):
            if row.env != name:
                raise TraceError(f"{where}: a row of env {row.env!r}, not {name!r}")
            got.append(row)
    except TraceError as exc:
        kept = path.with_name("results.rejected.jsonl")
        with contextlib.suppress(OSError):
            path.replace(kept)
        raise RunnerCrashed(name, f"sent a bad results.jsonl: {exc} (kept as {kept.name})") from exc
    path.unlink(missing_ok=True)  # the run's results.jsonl is the one place rows live
    return got


def _merge_results(
    run_dir: RunDir, hosts: list[str], tasks: list[str], repeat: int, records: dict[str, HostRecord]
) -> tuple[list[ResultRow], dict[str, str]]:
    """results.jsonl: every host's rows in inventory order, plus an ``error`` row for each
    task x attempt a host did not deliver (unreachable, crashed, interrupted): an error is never
    silently a missing row, and never the agent's failure.

    Also returns the errors found here (host -> line): a host whose results.jsonl is unreadable gets
    ``error`` rows only and the error on its record; the other hosts' rows are kept."""
    rows: list[ResultRow] = []
    found: dict[str, str] = {}
    for name in hosts:
        rec = records[name]
        try:
            got = _host_rows(run_dir, name)
        except RunnerCrashed as exc:
            got = []
            found[name] = exc.one_line()
            rec.error = f"{rec.error} (also: {found[name]})" if rec.error else found[name]
        rows.extend(got)
        have = {(r.task, r.attempt) for r in got}
        reason = rec.error or "no result"
        for task in tasks:
            for attempt in range(repeat):
                if (task, attempt) not in have:
                    rows.append(
                        ResultRow(task=task, env=name, attempt=attempt, verdict="error", reason=reason,
                                  run_id=run_dir.run_id, fingerprint=rec.fingerprint)
                    )  # fmt: skip
    return rows, found


def _resolve_hosts(request: ReplayRequest) -> tuple[Any, list[Any]]:
    from orchestrator.inventory import load_inventory

    inventory = load_inventory(request.inventory_path)
    selected = inventory.select(request.hosts) if request.hosts else list(inventory.hosts)
    return inventory, selected


def _resolve_tasks(bundle: Bundle, wanted: list[str] | None) -> tuple[list[str], bool]:
    every = bundle.suite.task_ids
    if not wanted:
        return every, True
    unknown = [t for t in wanted if t not in every]
    if unknown:
        raise SuiteError(
            f"{bundle.suite_dir}: --tasks names unknown task(s) {', '.join(unknown)} (tasks: {', '.join(every)})"
        )
    return [t for t in every if t in wanted], False


def user_bundle_cache() -> Path:
    """``$XDG_CACHE_HOME/crosshost/bundles`` (default ``~/.cache/...``): shared by every ``--out``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "crosshost" / "bundles"


def _cache_dir(request: ReplayRequest) -> Path:
    if request.cache_dir is not None:
        return request.cache_dir
    # One cache per user, so a new --out does not rebuild an unchanged bundle; where it cannot be
    # made (no home, read-only), the run's own directory serves as before.
    try:
        cache = user_bundle_cache()
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        if os.access(cache, os.W_OK | os.X_OK):
            return cache
    except (OSError, RuntimeError):  # RuntimeError: Path.home() without a home
        pass
    return request.out / ".bundles"


def replay(
    request: ReplayRequest,
    *,
    opener: Opener | None = None,
    on_event: EventSink | None = None,
    bundle: Bundle | None = None,
    with_analysis: bool = True,
) -> ReplayOutcome:
    """Run the replay and write ``runs/<run_id>/``; the exit code is ``exit_policy.replay_exit``'s."""
    if request.repeat is not None and request.repeat < 1:
        raise SuiteError("--repeat must be at least 1")
    if request.jobs is not None and request.jobs < 1:
        raise SuiteError("--jobs must be at least 1")
    inventory, selected = _resolve_hosts(request)
    bundle = bundle or build_bundle(request.suite_dir, _cache_dir(request))
    tasks, all_tasks = _resolve_tasks(bundle, request.tasks)
    model = openai_agent_config(bundle.suite, tasks)
    if model is not None:  # an unset api_key_env stops the run here, before any host is touched
        require_api_key(str(model.get("api_key_env", "")), where=str(bundle.suite_dir / "suite.toml"))
    repeat = request.repeat or bundle.suite.repeat
    gate = request.gate if request.gate is not None else bundle.suite.gate.flip_rate
    names = [h.name for h in selected]
    emit = on_event or (lambda host, stage, detail: None)

    run_dir = RunDir.create(request.out)
    run_dir.write_contract(_contract_bytes(bundle))
    suite_path = bundle.suite_dir
    if request.keep_suite:
        suite_path = run_dir.path / request.keep_suite
        shutil.copytree(bundle.suite_dir, suite_path, symlinks=True)
    shared = _Shared()
    manifest = Manifest(
        run_id=run_dir.run_id,
        kind=request.kind,
        started=utc_now(),
        suite=SuiteRef(name=bundle.suite_name, sha=bundle.suite_sha, path=str(suite_path)),
        bundle_sha=bundle.sha,
        zipapp_sha=bundle.zipapp_sha,
        gate=gate,
        alpha=bundle.suite.gate.alpha,
        sampled=[t for t in bundle.suite.sampled_task_ids() if t in tasks],
        tasks=tasks,
        repeat=repeat,
        inventory={"path": str(Path(request.inventory_path).resolve()), "hosts": [h.public_dict() for h in selected]},
        reference=names[0],
        crosshost_version=__version__,
        hosts={n: HostRecord() for n in names},
    )
    run_dir.write_manifest(manifest)  # a crash from here on still leaves a readable record

    plan = _Plan(run_dir, bundle, tasks, all_tasks, repeat, shared, opener or default_opener, request.accept_new, emit)
    plan.model = model
    jobs = {h.name: HostJob(h, plan) for h in selected}
    fan: FanoutResult[HostRecord] = FanoutResult()
    try:
        fan = fan_out(
            names,
            lambda n: jobs[n](n),
            jobs=request.jobs or default_jobs(len(names)),
            cancel=shared.cancel,
            on_interrupt=lambda: _stop_running(shared),
            on_waiting=lambda: emit("*", "waiting", "cleaning remote workspaces; please wait"),
        )
    finally:
        errors: dict[str, str] = {}
        for name, job in jobs.items():
            rec = job.record
            host_outcome = fan.outcomes.get(name)
            exc = host_outcome.error if host_outcome is not None else None
            if exc is not None:
                rec.error = _error_line(exc)
                if job.cleanup_error:
                    rec.error += f" (cleanup: {job.cleanup_error})"
                if isinstance(exc, _UNREACHABLE):
                    rec.reachable = False
                errors[name] = rec.error
                emit(name, "failed", rec.error)
            manifest.hosts[name] = rec
        manifest.retries = list(shared.retries)
        manifest.interrupted = fan.interrupted or outcome_interrupted(fan)
        rows, bad_results = _merge_results(run_dir, names, tasks, repeat, manifest.hosts)
        for name, line in bad_results.items():
            errors[name] = manifest.hosts[name].error or line
            emit(name, "failed", line)
        run_dir.write_results(rows)
        manifest.pins = run_dir.trace_pins(names)
        manifest.finished = utc_now()
        run_dir.write_manifest(manifest)

    outcome = ReplayOutcome(run_dir, manifest, 0, results=rows, errors=errors)
    if not manifest.interrupted:
        outcome.report = analyse(run_dir, gate) if with_analysis else None
    outcome.exit_code, outcome.exit_reason = replay_exit(manifest, outcome.report, gate, rows)
    return outcome


def outcome_interrupted(fan: FanoutResult[HostRecord]) -> bool:
    return any(isinstance(o.error, Interrupted) for o in fan.outcomes.values())


def analyse(run_dir: RunDir, gate: float | None) -> RunReport:
    """Analyse the run and write its reports (report.json, report.md, junit.xml)."""
    report = analyse_run(run_dir.path, gate=gate)
    write_reports(run_dir.path, report)
    return report


def _quick_exit_gc() -> None:
    """At interpreter exit: collect the garbage there is, then freeze what is left, so that the
    interpreter's shutdown does not walk every object paramiko, pydantic and rich created once more
    (measured: 0.10-0.13 s of a replay's wall time here -> 0.04-0.05 s). Objects still alive are
    freed by reference counting as before; only the cyclic collector skips them."""
    gc.collect()
    gc.freeze()


def planned_hosts(request: ReplayRequest) -> list[str]:
    """The names of the hosts ``request`` replays on, in inventory order (for the progress view)."""
    return [h.name for h in _resolve_hosts(request)[1]]


def replay_command(request: ReplayRequest, **kwargs: Any) -> ReplayOutcome:
    """What ``crosshost replay`` does: the replay, then (unless interrupted) the run recorded in the
    history index; with ``--compare-last``, a task that newly flips makes a passing run exit 1."""
    atexit.unregister(_quick_exit_gc)  # once per process, however often this is called
    atexit.register(_quick_exit_gc)
    outcome = replay(request, **kwargs)
    if outcome.manifest.interrupted:
        return outcome
    after = after_replay(outcome.run_dir.path, compare=request.compare_last)
    outcome.notes += [n for n in (after.warning, after.message(outcome.manifest.suite_name or "?")) if n]
    code = after.exit_code(outcome.exit_code) if request.compare_last else outcome.exit_code
    if code != outcome.exit_code:
        outcome.exit_code, outcome.exit_reason = code, COMPARE_LAST_REASON
    return outcome
