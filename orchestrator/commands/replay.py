"""``crosshost replay``: one suite, every host of the inventory, every trace brought home.

The run: resolve hosts and tasks, build the bundle, write the manifest, then per host, in a bounded
pool (``fanout``), a ``host_job.HostJob``: connect (transient failures retried by the transport and
each retry recorded here), create the workspace and push the bundle (skipped when cached; one exec),
run the runner under ``timeout -s KILL`` with a clean environment (it fingerprints the host before its
first task) and pack its ``out/`` as one tar in the same exec, pull that tar (size checked first), and
— always — remove the run's workspace and verify it is gone (``workspace.Workspace``). One host
failing is that host's result; every host's rows are merged into ``results.jsonl``; the run
directory is complete without the analysis, which runs last. The exit code is ``exit_policy``'s.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import shutil
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_runner import collector
from orchestrator import __version__
from orchestrator.commands.shards import Shard, shard_tasks
from orchestrator.errors import (
    InputError,
    InventoryError,
    RunnerCrashed,
    SuiteError,
    TraceError,
)
from orchestrator.exit_policy import COMPARE_LAST_REASON, replay_exit
from orchestrator.hosts.bundle import Bundle, bundle_cache_dir, replay_bundle
from orchestrator.hosts.fanout import FanoutResult, Interrupted, default_jobs, fan_out, sigint_calls
from orchestrator.hosts.host_job import UNREACHABLE, EventSink, HostJob, HostPlan
from orchestrator.hosts.inventory import HostConfig, load_inventory
from orchestrator.hosts.transport import Opener, default_opener
from orchestrator.model.settings import openai_agent_config, require_api_key
from orchestrator.selection import TaskSelection
from orchestrator.store.jsonl import iter_results
from orchestrator.store.records import HostRecord, Manifest, SuiteRef
from orchestrator.store.rundir import ResultRow, RunDir, utc_now, write_bytes_atomic

if TYPE_CHECKING:
    from agent_runner.suite import Suite
    from orchestrator.analysis.models import RunReport


@dataclass
class ReplayRequest:
    suite_dir: Path
    inventory_path: Path = Path("hosts.toml")
    hosts: list[str] | None = None
    tasks: list[str] | None = None  # names or globs (selection.py)
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
    reference: str | None = None  # the host the others are compared with (default: the first selected)
    slots: int | None = None  # attempts at once on every host (default: each host's inventory slots)
    #: --hold-model / --no-hold-model over the suite's [agent] hold_model (None: the suite's)
    hold_model: bool | None = None
    #: the user's command (without ``crosshost``) when it was not ``replay`` itself (``repro``): hints
    #: such as the one for an unknown host key repeat it
    rerun: list[str] | None = None
    exclude: list[str] | None = None  # names or globs taken away (--exclude)
    tags: list[str] | None = None  # only tasks with one of these tags (--tags)
    #: applied to each selected host's inventory entry before the run (``explain``'s counterfactual:
    #: the reference with one environment fact of another host); the manifest records the result
    adjust_host: Callable[[HostConfig], HostConfig] | None = None
    trace_files: bool = False  # attempts under strace where a host has it (explain's file evidence)
    #: --until-decided: rounds of attempts for the tasks still undecided, up to this many attempts per
    #: host (None: one fixed --repeat)
    until_decided: int | None = None
    first_attempt: int = 0  # a round of --until-decided goes on numbering the attempts
    #: --shard: replay this shard's part of the tasks only, into ``<out>/<run_id>.shard-K-of-N/``
    shard: Shard | None = None

    @property
    def selection(self) -> TaskSelection:
        return TaskSelection.of(self.tasks, self.exclude, self.tags)

    def command_words(self) -> list[str]:
        """The command that ran this replay, complete (``-i`` always), for hints to repeat."""
        from orchestrator.hints import inventory_words, out_words

        if self.rerun is not None:
            return list(self.rerun)
        words = ["replay", str(self.suite_dir), *inventory_words(self.inventory_path)]
        if self.hosts:
            words += ["--hosts", ",".join(self.hosts)]
        words += self.selection.words()
        if self.repeat is not None:
            words += ["--repeat", str(self.repeat)]
        if self.gate is not None:
            words += ["--gate", f"{self.gate:g}"]
        if self.reference is not None:
            words += ["--reference", self.reference]
        if self.slots is not None:
            words += ["--slots", str(self.slots)]
        if self.hold_model is not None:
            words.append("--hold-model" if self.hold_model else "--no-hold-model")
        if self.until_decided is not None:
            words += ["--until-decided", "--max-repeat", str(self.until_decided)]
        if self.shard is not None:
            words += ["--shard", f"{self.shard.index}/{self.shard.count}", "--run-id", self.shard.run_id]
        return [*words, *out_words(self.out), *(["--compare-last"] if self.compare_last else [])]


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


# ------------------------------------------------------------------------------------------- the run


def _error_line(exc: BaseException, request: ReplayRequest) -> str:
    from orchestrator.hints import host_error_line

    return "interrupted" if isinstance(exc, Interrupted) else host_error_line(exc, request.command_words())


def _host_rows(run_dir: RunDir, name: str) -> list[ResultRow]:
    """The rows a host sent (none when it sent no file). A file that is not the runner's JSONL of
    this host's rows is the host's fault: RunnerCrashed naming file:line, the file kept aside."""
    path = run_dir.host_results_path(name)
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
    run_dir: RunDir, hosts: list[str], tasks: list[str], repeat: int, records: dict[str, HostRecord], first: int = 0
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
            for attempt in range(first, first + repeat):
                if (task, attempt) not in have:
                    rows.append(
                        ResultRow(task=task, env=name, attempt=attempt, verdict="error", reason=reason,
                                  run_id=run_dir.run_id, fingerprint=rec.fingerprint)
                    )  # fmt: skip
    return rows, found


def _resolve_hosts(request: ReplayRequest) -> list[HostConfig]:
    inventory = load_inventory(request.inventory_path)
    selected = inventory.select(request.hosts) if request.hosts else list(inventory.hosts)
    if request.adjust_host is not None:
        selected = [request.adjust_host(h) for h in selected]
    if request.reference is not None:
        inventory.get(request.reference)  # an unknown name: the inventory's one-line error
        if request.reference not in {h.name for h in selected}:
            raise InventoryError(
                f"{inventory.path}: --reference {request.reference!r} is not among the selected hosts "
                f"({', '.join(h.name for h in selected)}); add it to --hosts"
            )
    return selected


def suite_task_tags(bundle: Bundle) -> dict[str, list[str]]:
    """Each task's ``tags`` (task.toml), for ``--tags`` and the manifest."""
    return {t.id: list(t.tags) for t in bundle.suite.tasks}


def _resolve_tasks(bundle: Bundle, selection: TaskSelection) -> tuple[list[str], bool]:
    every = bundle.suite.task_ids
    if selection.everything:
        return every, True
    return selection.select(every, suite_task_tags(bundle), str(bundle.suite_dir)), False


def replay(
    request: ReplayRequest,
    *,
    opener: Opener | None = None,
    on_event: EventSink | None = None,
    bundle: Bundle | None = None,
    suite: Suite | None = None,
    with_analysis: bool = True,
) -> ReplayOutcome:
    """Run the replay and write ``runs/<run_id>/``; the exit code is ``exit_policy.replay_exit``'s.
    ``suite``: the suite already read from ``request.suite_dir`` (the bundle is built from it)."""
    from orchestrator.hosts.inventory import override_notes

    if request.repeat is not None and request.repeat < 1:
        raise SuiteError("--repeat must be at least 1")
    if request.jobs is not None and request.jobs < 1:
        raise SuiteError("--jobs must be at least 1")
    if request.slots is not None and request.slots < 1:
        raise SuiteError("--slots must be at least 1")
    selected = _resolve_hosts(request)
    if bundle is None:
        cache = request.cache_dir or bundle_cache_dir(request.out)
        bundle = replay_bundle(request.suite_dir, cache, suite)
    tasks, all_tasks = _resolve_tasks(bundle, request.selection)
    shard = request.shard.record(tasks) if request.shard is not None else None
    if request.shard is not None:
        tasks, all_tasks = shard_tasks(request.shard, tasks, request.out), False
    model = openai_agent_config(bundle.suite, tasks)
    if model is not None:  # an unset api_key_env stops the run here, before any host is touched
        require_api_key(model.api_key_env, where=str(bundle.suite_dir / "suite.toml"))
    repeat = request.repeat or bundle.suite.repeat
    gate = request.gate if request.gate is not None else bundle.suite.gate.flip_rate
    names = [h.name for h in selected]
    emit = on_event or (lambda host, stage, detail: None)

    run_dir = RunDir.create(request.out, request.shard.dir_name if request.shard is not None else None)
    run_dir.write_contract(_contract_bytes(bundle))
    suite_path = bundle.suite_dir
    if request.keep_suite:
        suite_path = run_dir.path / request.keep_suite
        shutil.copytree(bundle.suite_dir, suite_path, symlinks=True)
    manifest = Manifest(
        run_id=run_dir.run_id,
        kind=request.kind,
        started=utc_now(),
        suite=SuiteRef(name=bundle.suite_name, sha=bundle.suite_sha, path=str(suite_path)),
        bundle_sha=bundle.sha,
        zipapp_sha=bundle.zipapp_sha,
        gate=gate,
        alpha=bundle.suite.gate.alpha,
        burn_invalidates=bundle.suite.gate.burn_invalidates,
        correction=bundle.suite.gate.correction,
        allow_undecided=bundle.suite.gate.undecided,
        sampled=[t for t in bundle.suite.sampled_task_ids() if t in tasks],
        task_tags={t: tags for t, tags in suite_task_tags(bundle).items() if t in tasks and tags},
        expect_findings={t.id: list(t.expect_findings) for t in bundle.suite.tasks if t.id in tasks and t.expect_findings},
        tasks=tasks,
        repeat=repeat,
        first_attempt=request.first_attempt,
        inventory={"path": str(Path(request.inventory_path).resolve()), "hosts": [h.public_dict() for h in selected]},
        reference=request.reference or names[0],
        crosshost_version=__version__,
        hosts={n: HostRecord() for n in names},
        notes=override_notes(selected),
        shard=shard,
    )
    run_dir.write_manifest(manifest)  # a crash from here on still leaves a readable record

    load_after_the_hosts = _loader(with_analysis)

    def emit_and_load(host: str, stage: str, detail: str) -> None:
        if stage == "run":
            load_after_the_hosts()
        emit(host, stage, detail)

    plan = HostPlan(
        run_dir, bundle, tasks, all_tasks, repeat, opener or default_opener, request.accept_new, emit_and_load, model
    )
    plan.slots = request.slots
    plan.trace_files = request.trace_files
    plan.first_attempt = request.first_attempt
    plan.defer_removal = with_analysis  # the workspaces go while the results are merged and analysed
    reference = manifest.reference or names[0]
    if model is not None:  # a live model: the held model's module (and the proxy's) load only then
        from orchestrator.model.hold import ModelHold, hold_mode

        mode = hold_mode(model, request.hold_model)
        plan.hold = ModelHold(reference, mode) if mode is not None and len(names) > 1 else None
    manifest.hold_model = plan.hold.mode if plan.hold is not None else None
    jobs = {h.name: HostJob(h, plan) for h in selected}
    fan: FanoutResult[HostRecord] = FanoutResult()
    errors: dict[str, str] = {}

    def host_failed(name: str, job: HostJob, exc: BaseException) -> None:
        rec = job.record
        line = _error_line(exc, request)
        if job.cleanup_error:
            line += f" (cleanup: {job.cleanup_error})"
        rec.error = f"{rec.error} (also: {line})" if rec.error else line
        if isinstance(exc, UNREACHABLE):
            rec.reachable = False
        errors[name] = rec.error
        emit(name, "failed", rec.error)

    cut_short = True  # until the work after the hosts is done: what the last step writes is best effort
    try:
        try:
            # a held model: the reference starts first (the others wait for its record, never it for theirs)
            order = [reference, *(n for n in names if n != reference)] if plan.hold else names
            fan = fan_out(
                order,
                lambda n: jobs[n](n),
                jobs=request.jobs or default_jobs(len(names)),
                cancel=plan.running.cancel,
                on_interrupt=plan.running.stop_all,
                on_waiting=lambda: emit("*", "waiting", WAITING_FOR_CLEANUP),
            )
        finally:
            for name, job in jobs.items():
                host_outcome = fan.outcomes.get(name)
                if host_outcome is not None and host_outcome.error is not None:
                    host_failed(name, job, host_outcome.error)
                manifest.hosts[name] = job.record
            manifest.retries = list(plan.retries)
            manifest.interrupted = fan.interrupted or outcome_interrupted(fan)
            rows, bad_results = _merge_results(run_dir, names, tasks, repeat, manifest.hosts, request.first_attempt)
            for name, line in bad_results.items():
                errors[name] = manifest.hosts[name].error or line
                emit(name, "failed", line)
            run_dir.write_results(rows)
            if plan.hold is not None:
                plan.hold.write(run_dir, write_bytes_atomic)
            manifest.pins = run_dir.trace_pins(names)
            manifest.finished = utc_now()
            run_dir.write_manifest(manifest)

        outcome = ReplayOutcome(run_dir, manifest, 0, results=rows, errors=errors)
        if not manifest.interrupted and with_analysis:
            outcome.report = _analyse(run_dir, manifest, gate)
        cut_short = False
    finally:
        # Every workspace's removal is answered and its answer recorded, whatever happened above (a
        # failure there still propagates: the record is then written as well as it can be).
        deferred = [name for name, job in jobs.items() if job.removing]
        late = _finish_removals(jobs, plan, emit)
        plan.running.over()
        for name, exc in late.items():
            host_failed(name, jobs[name], exc)
        if deferred:
            with contextlib.suppress(Exception) if cut_short else contextlib.nullcontext():
                run_dir.write_manifest(manifest)  # what the removals answered
        for name in deferred:
            if name not in late and jobs[name].record.error is None:  # a host the merge failed stays failed
                emit(name, "done", jobs[name].done_detail())
    if late and outcome.report is not None:  # a host failed after the analysis read the run: again
        outcome.report = _analyse(run_dir, manifest, gate)
    outcome.exit_code, outcome.exit_reason = replay_exit(manifest, outcome.report, gate, rows)
    return outcome


#: what Ctrl-C says while the replay waits for its hosts' workspaces to go (during the fan-out or after)
WAITING_FOR_CLEANUP = "cleaning remote workspaces; please wait"


def _analyse(run_dir: RunDir, manifest: Manifest, gate: float) -> RunReport | None:
    """The run's analysis and reports; None when Ctrl-C cut it short (the run is kept, and says so)."""
    from orchestrator.report import analyse_and_write

    try:
        return analyse_and_write(run_dir.path, gate)
    except KeyboardInterrupt:  # the hosts are done; the run is kept, and says it was cut short
        manifest.interrupted = True
        manifest.notes.append("interrupted during the analysis: reports not written (crosshost report RUN_DIR)")
        run_dir.write_manifest(manifest)
        return None


def _finish_removals(jobs: dict[str, HostJob], plan: HostPlan, emit: EventSink) -> dict[str, BaseException]:
    """Take the answer of every removal a host left running (``HostPlan.defer_removal``); the hosts
    whose removal failed, with what it raised. Ctrl-C meanwhile stops nothing: it says so, and (as
    during the fan-out) hosts that no longer answer are abandoned. Nothing else is said from here:
    Ctrl-C's message is said by the main thread, and must not meet another of its own."""
    failed: dict[str, BaseException] = {}
    stopping = False

    def pressed() -> None:
        nonlocal stopping
        emit("*", "waiting", WAITING_FOR_CLEANUP)
        if not stopping:  # the first press: silent hosts are abandoned from now on
            stopping = True
            plan.running.stop_all()

    with sigint_calls(pressed):
        for name, job in jobs.items():
            try:
                job.finish_removal()
            except Exception as exc:  # the host's failure, recorded like any other
                failed[name] = exc
    return failed


#: what a replay needs once its hosts are done: the analysis and its reports, the history index, and
#: the tables that draw them (``rich``: the progress view before the hosts does without it off a terminal)
_AFTER_THE_HOSTS = ("orchestrator.report", "orchestrator.store.history", "orchestrator.ui")


def _loader(with_analysis: bool) -> Callable[[], None]:
    """What starts, once, the import of what the replay needs after its hosts, in a thread of its own:
    their import (a tenth of a second and more) is off the replay's wall time. The first host's run
    stage starts it: the runners work then and the controller only waits, while connecting and
    pushing are the controller's own CPU, which the import's hold on the interpreter would slow. A
    module that fails to load here fails again, and is reported, where it is used."""
    once = threading.Lock()

    def load() -> None:
        for name in _AFTER_THE_HOSTS:
            with contextlib.suppress(Exception):
                importlib.import_module(name)
        ui = sys.modules.get("orchestrator.ui")
        with contextlib.suppress(Exception):  # rich's own first-table loads, off the wall time too
            if ui is not None:
                ui.warm()

    def start() -> None:
        if with_analysis and once.acquire(blocking=False):  # never released: the first call only
            threading.Thread(target=load, daemon=True, name="crosshost-load").start()

    return start


def outcome_interrupted(fan: FanoutResult[HostRecord]) -> bool:
    return any(isinstance(o.error, Interrupted) for o in fan.outcomes.values())


def planned_hosts(request: ReplayRequest) -> list[str]:
    """The names of the hosts ``request`` replays on, in inventory order (for the progress view)."""
    return [h.name for h in _resolve_hosts(request)]


#: --until-decided without --max-repeat: at most this many attempts per host
DEFAULT_MAX_REPEAT = 32


def until_decided_budget(until_decided: bool, max_repeat: int | None) -> int | None:
    """``--until-decided [--max-repeat N]`` as the request's budget; --max-repeat alone is bad input."""
    if max_repeat is not None and not until_decided:
        raise SuiteError("--max-repeat is the budget of --until-decided; add --until-decided (or use --repeat)")
    return (max_repeat or DEFAULT_MAX_REPEAT) if until_decided else None


def replay_command(
    request: ReplayRequest,
    *,
    lint: bool = True,
    rounds: Callable[..., ReplayOutcome] | None = None,
    **kwargs: Any,
) -> ReplayOutcome:
    """What ``crosshost replay`` does: the suite linted, the replay, then (unless interrupted) the run
    recorded in the history index; with ``--compare-last``, a task that newly flips makes a passing
    run exit 1."""
    from agent_runner.suite import load_suite
    from orchestrator.commands.lint import lint_suite
    from orchestrator.exit_policy import shard_exit

    if request.shard is not None and request.compare_last:
        raise InputError("--compare-last with --shard: a shard is part of a run; compare the merged run instead")
    # `crosshost lint`'s checks first, on the selected tasks: an error is bad input before any host is
    # touched (exit 2); warnings, and errors of tasks not selected, are said with the summary and the
    # run goes on (lint=False: a stand-in suite in tests). The suite is read once: the lint checks it and
    # the bundle ships it (the bundle's cache key still digests every file it ships).
    suite = load_suite(request.suite_dir) if lint else None
    findings = lint_suite(request.suite_dir, request.selection, suite=suite) if lint else None
    if findings is not None:
        findings.raise_on_errors()
    if suite is not None and "bundle" not in kwargs:
        kwargs["suite"] = suite
    # What is loaded by now (modules, classes, the suite) is frozen out of the cyclic collector's sight
    # (its full passes while the hosts run walk only what the replay makes), and the collector, paused
    # for the start, runs again from here: before any host is touched.
    collector.settle()
    outcome = (rounds or replay)(request, **kwargs)
    outcome.notes[:0] = [f.line() for f in findings.warnings] if findings is not None else []
    if request.shard is not None:  # not a run of its own: the merged run is recorded and judged
        outcome.exit_code, outcome.exit_reason = shard_exit(outcome.exit_code, outcome.exit_reason)
        return outcome
    if outcome.manifest.interrupted:
        return outcome
    from orchestrator.store.history import after_replay

    after = after_replay(outcome.run_dir.path, compare=request.compare_last, report=outcome.report)
    outcome.notes += [n for n in (after.warning, after.message(outcome.manifest.suite_name or "?")) if n]
    code = after.exit_code(outcome.exit_code) if request.compare_last else outcome.exit_code
    if code != outcome.exit_code:
        reason = COMPARE_LAST_REASON if after.compared else (after.warning or "--compare-last could not compare")
        outcome.exit_code, outcome.exit_reason = code, reason
    return outcome
