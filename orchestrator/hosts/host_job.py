"""One host's part of a replay: connect, push, run, pull, judge, clean; each stage timed and reported.

``HostJob`` drives the host's ``Workspace`` (``orchestrator/hosts/workspace.py``) through its lifecycle and
fills the host's record for the manifest: the fingerprint its runner sent, the runner's exit, whether
the workspace is gone. It never leaves the run's workspace behind: it waits for the removal, or
(``HostPlan.defer_removal``, after a run that went well) leaves it running for ``finish_removal``,
which the replay always calls; the first error is the host's error, a cleanup failure is said beside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import posixpath
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from orchestrator.errors import (
    AuthenticationFailed,
    HostError,
    HostKeyRejected,
    HostUnreachable,
    RunnerCrashed,
    WorkspaceLeft,
)
from orchestrator.hosts import remote
from orchestrator.hosts.bundle import (
    BUNDLE_REFUSED_EXIT,
    Bundle,
    bundle_present_test,
    bundle_remove_script,
    checked_runner_argv,
    ensure_bundle,
)
from orchestrator.hosts.fanout import Interrupted
from orchestrator.hosts.fingerprint import fingerprint_script, tail
from orchestrator.hosts.integrity import verify_host_output
from orchestrator.hosts.inventory import HostConfig
from orchestrator.hosts.transport import Opener
from orchestrator.hosts.transport.base import ConnectRetry, ExecResult, Host
from orchestrator.hosts.workspace import ABANDON_AFTER_S, Running, Workspace
from orchestrator.store.records import HostRecord
from orchestrator.store.rundir import RunDir, utc_now

if TYPE_CHECKING:
    from orchestrator.model.hold import ModelHold
    from orchestrator.model.settings import ProxyConfig

#: on top of timeout_s x attempts: start-up, fingerprint, writing out/ and packing it
RUN_MARGIN_S = 60
#: how long the partial results of a stopped run may take to come home
PARTIAL_PULL_S = 15.0
#: how many hosts' archives are written and checked at once (never held while one travels). That is the
#: controller's own CPU, under one interpreter lock: with every host of a fleet at it at once (they end
#: together), a third of the controller's CPU went to handing that lock from thread to thread, and the
#: last host finished no sooner
PULLING_AT_ONCE = 2
_pulling = threading.BoundedSemaphore(PULLING_AT_ONCE)
#: connection-level failures: the host is unreachable, not merely failing
UNREACHABLE = (HostUnreachable, HostKeyRejected, AuthenticationFailed)
#: (host, stage, detail): stage is one of workspace.STAGES, or "retry", "done", "failed"
EventSink = Callable[[str, str, str], None]


@dataclass
class HostPlan:
    run_dir: RunDir
    bundle: Bundle
    tasks: list[str]
    all_tasks: bool
    repeat: int
    opener: Opener
    accept_new: bool
    emit: EventSink
    #: the model proxy's settings when a task uses agent.kind = "openai" (orchestrator/model/proxy.py)
    model: ProxyConfig | None = None
    #: the held model (orchestrator/model/hold.py): the reference runs first, the others answered from it
    hold: ModelHold | None = None
    running: Running = field(default_factory=Running)  # the runs in flight (Ctrl-C kills them)
    retries: list[ConnectRetry] = field(default_factory=list)  # every connect retry, for the manifest
    #: --slots: attempts at once on every host, over the inventory's slots
    slots: int | None = None
    #: run each predicate under strace where the host has it (``explain``'s file evidence)
    trace_files: bool = False
    #: the number of the first attempt (a later round of ``replay --until-decided`` goes on numbering)
    first_attempt: int = 0
    #: a host whose run, pull and checks went well returns while its workspace's removal goes on; the
    #: replay takes the removal's answer (``HostJob.finish_removal``) once its own work after the hosts
    #: is done, so that work and the removal overlap. Off: each host waits for its removal.
    defer_removal: bool = False


class _CleanBeside:
    """A workspace's removal (``remove``: its answer, True when it is gone) on a thread of its own."""

    def __init__(self, remove: Callable[[], bool], name: str) -> None:
        self._remove = remove
        self._removed = False
        self._error: BaseException | None = None
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"clean-{name}")
        self._thread.start()

    def _run(self) -> None:
        t0 = time.monotonic()
        try:
            self._removed = self._remove()
        except BaseException as exc:  # raised again by ``result``, in the host's own worker
            self._error = exc
        finally:
            self.seconds = time.monotonic() - t0

    def result(self) -> bool:
        """The removal's answer, once it is over; what it raised is raised here."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._removed


@dataclass
class _Removal:
    """A removal still running when the host's job returned (``HostPlan.defer_removal``): what
    ``HostJob.finish_removal`` needs to take its answer and let the host go."""

    ws: Workspace
    beside: _CleanBeside
    watched: contextlib.ExitStack


class _Connecting(TypedDict, total=False):
    """What the connecting thread left: the host, or the error, or that the job gave up on it."""

    host: Host
    error: BaseException
    given_up: bool


class HostJob:
    """Everything one host does in one replay; ``__call__`` never leaves the run's workspace behind
    (a removal it leaves running is ``finish_removal``'s)."""

    def __init__(self, cfg: HostConfig, plan: HostPlan) -> None:
        self.cfg = cfg
        self.plan = plan
        self.record = HostRecord()
        self.cleanup_error: str | None = None
        self.host_dir = plan.run_dir.host_dir(cfg.name)
        self._removal: _Removal | None = None

    def __call__(self, _name: str) -> HostRecord:
        ws: Workspace | None = None
        beside: list[_CleanBeside] = []  # the removal started once the pulled archive was home
        run_started = run_finished = False
        error: BaseException | None = None
        watched = contextlib.ExitStack()
        try:
            host = self._stage("connect", self._connect)
            watched.enter_context(self.plan.running.connected(host))  # Ctrl-C abandons it when it goes silent
            ws = made = Workspace(host, self.cfg.name, self.cfg.workspace_root, self.plan.run_dir.run_id, self.cfg.python)
            self.record.reachable = True
            self.record.container = host.facts() or None  # the image a container host runs, beside its fingerprint
            self.plan.running.check_cancel()
            self.record.bundle_pushed = False
            # Nothing pinned (the pins go into the workspace before the run): the run's own exec creates
            # the workspace, and the runner's start checks the bundle (one exec, one Python on the host).
            folded = not self._pins_ahead()
            if not folded:
                self.record.bundle_pushed = self._stage("push", lambda: ws.create_with_bundle(self.plan.bundle))
                self._said_replaced(ws.bundle_replaced)
                self.plan.running.check_cancel()
                self._wait_for_the_reference()
            run_started = True
            # The runner writes out/fingerprint.json before its first task; the run's exec packs out/.
            slots = self.slots()
            detail = f"{slots} slots" if slots > 1 else ""
            result = self._stage("run", lambda: self._run(ws, create=folded), detail)
            if remote.bundle_refused(result, BUNDLE_REFUSED_EXIT):  # not on the host, or changed there
                self._said_replaced("bundle-replaced" in result.stdout.split())
                bundle, root = self.plan.bundle, self.cfg.workspace_root
                self.record.bundle_pushed = self._stage(
                    "push", lambda: ensure_bundle(ws.host, bundle, root, look=False, python=self.cfg.python)
                )
                self.plan.running.check_cancel()
                result = self._stage("run", lambda: self._run(ws), detail)
                if remote.bundle_refused(result, BUNDLE_REFUSED_EXIT):
                    raise RunnerCrashed(self.cfg.name, "the runner refused the bundle pushed now: it is not what "
                                        f"was pushed under {bundle.remote_dir(root)} (what changes it on the host?)")
            run_finished = True
            self.record.runner_exit = result.exit_code
            stdout, out_tar = remote.split_out_tar(result.stdout)
            result = dataclasses.replace(result, stdout=stdout)
            made.gone = out_tar.removed  # the run's own exec removed it once the archive was out
            # else the workspace is removed on the host while the controller reads and checks the archive
            pulled = self._stage(
                "pull", lambda: self._pull(
                    made, out_tar, fetched=None if made.gone else lambda: beside.append(self._clean_beside(made)))
            )
            self.plan.running.check_cancel()  # a runner stopped by Ctrl-C is interrupted, not crashed
            self._judge(result, pulled)
            expected = {t.id: t.expect_findings for t in self.plan.bundle.suite.tasks if t.expect_findings}
            with _pulling:
                verify_host_output(self.cfg.name, self.host_dir, ws.pulled, result.stdout, expected, ws.pulled_sha256)
        except BaseException as exc:
            error = exc
            if ws is not None and ws.created and run_started and not run_finished:
                # Partial results: whatever the runner wrote before it was stopped.
                with contextlib.suppress(Exception):  # the host may be gone; the first error counts
                    self._pull(ws, within_s=PARTIAL_PULL_S)
            raise
        finally:
            if self.plan.hold is not None and self.cfg.name == self.plan.hold.reference:
                self.plan.hold.reference_done.set()  # also when it failed: the others go on, unheld
            self._record_fingerprint()
            if ws is not None and error is None and beside and self.plan.defer_removal:
                self._removal = _Removal(ws, beside[0], watched)  # its answer: finish_removal
            else:
                if ws is not None:
                    self._clean(ws, run_started and not run_finished, error, beside[0] if beside else None)
                    ws.host.close()
                watched.close()
        if self._removal is None:
            self.plan.emit(self.cfg.name, "done", self.done_detail())
        return self.record

    @property
    def removing(self) -> bool:
        """Its workspace's removal is still to be answered (``finish_removal``)."""
        return self._removal is not None

    def finish_removal(self) -> None:
        """Take the answer of the removal this job left running (``HostPlan.defer_removal``), as
        ``_clean`` takes it, then close the host; the caller then says the host is done
        (``done_detail``). A removal that failed raises its ``HostError`` (the host failed, as if its
        job had waited); nothing left running: nothing."""
        pending, self._removal = self._removal, None
        if pending is None:
            return
        try:
            self._clean(pending.ws, False, None, pending.beside)
        finally:
            pending.ws.host.close()
            pending.watched.close()

    def _wait_for_the_reference(self) -> None:
        """A held model: every other host runs once the reference's record is complete (no race)."""
        hold = self.plan.hold
        if hold is None or self.cfg.name == hold.reference:
            return
        self.plan.emit(self.cfg.name, "waiting", f"for {hold.reference}'s model record (held model)")
        while not hold.reference_done.wait(0.2):
            self.plan.running.check_cancel()

    def _pins_ahead(self) -> bool:
        """Values are pinned for the runner (the inventory's ``env``, a live model's URL): they go into
        the workspace before the run's exec, so the workspace is made by an exec of its own."""
        return bool(self.cfg.env) or self.plan.model is not None

    def _said_replaced(self, replaced: bool) -> None:
        if replaced:
            self.record.bundle_replaced = True
            self.plan.emit(self.cfg.name, "push", "the cached bundle had changed: replaced")

    def _stage(self, stage: str, fn: Callable[[], Any], detail: str = "") -> Any:
        self.plan.emit(self.cfg.name, stage, detail)
        t0 = time.monotonic()
        try:
            return fn()
        finally:  # a stage run twice (a run whose bundle was pushed on its refusal) counts both
            self.record.stages[stage] = round(self.record.stages.get(stage, 0.0) + time.monotonic() - t0, 3)

    def _connect(self) -> Host:
        name = self.cfg.name

        def on_retry(info: ConnectRetry) -> None:
            # the name and the time are the controller's where an opener left them out
            entry = ConnectRetry(
                host=info.get("host") or name, at=info.get("at") or utc_now(), attempt=info["attempt"],
                error=info["error"], wait_s=info["wait_s"],
            )  # fmt: skip
            with self.plan.running.lock:
                self.plan.retries.append(entry)
            self.plan.emit(name, "retry", str(info.get("error") or info))

        return self._given_up_on_ctrl_c(
            lambda: self.plan.opener(self.cfg, accept_new=self.plan.accept_new, on_retry=on_retry)
        )

    def _given_up_on_ctrl_c(self, connect: Callable[[], Host]) -> Host:
        """``connect()`` in a thread of its own, given up ABANDON_AFTER_S after Ctrl-C (a host that
        accepts the TCP connection and answers nothing would hold it for its connect timeouts); a
        connection that completes after that is closed at once."""
        done = threading.Event()
        lock = threading.Lock()
        got: _Connecting = {}

        def attempt() -> None:
            try:
                host = connect()
            except BaseException as exc:
                got["error"] = exc
            else:
                with lock:
                    if got.get("given_up"):
                        host.close()
                    else:
                        got["host"] = host
            finally:
                done.set()

        threading.Thread(target=attempt, daemon=True, name=f"connect-{self.cfg.name}").start()
        cancelled_at: float | None = None
        while not done.wait(0.2):
            if cancelled_at is None and self.plan.running.cancel.is_set():
                cancelled_at = time.monotonic()
            if cancelled_at is not None and time.monotonic() - cancelled_at >= ABANDON_AFTER_S:
                with lock:
                    if "host" not in got and "error" not in got:
                        got["given_up"] = True
                        raise Interrupted("interrupted while connecting")
        if "error" in got:
            raise got["error"]
        host: Host = got["host"]
        return host

    def _runner_argv(self, args: list[str]) -> list[str]:
        """The runner's command line: started from the bundle only when it is the one pushed."""
        return checked_runner_argv(self.plan.bundle, self.cfg.workspace_root, self.cfg.python, args)

    def _fingerprint_script(self, ws: Workspace) -> str:
        """``runner fingerprint`` exactly as ``crosshost hosts --suite`` takes it (same digest)."""
        return fingerprint_script(
            self.cfg,
            self.plan.bundle.remote_runner(self.cfg.workspace_root),
            ws.path,
            suite=self.plan.bundle.remote_suite(self.cfg.workspace_root),
            argv=self._runner_argv,
        )

    def slots(self) -> int:
        """Attempts at once on this host: ``--slots`` for every host, else the inventory's ``slots``."""
        return self.plan.slots or self.cfg.slots

    def kill_after_s(self) -> int:
        attempts = max(1, len(self.plan.tasks)) * max(1, self.plan.repeat)
        return int(math.ceil(self.cfg.timeout_s * attempts)) + RUN_MARGIN_S

    def _run(self, ws: Workspace, *, create: bool = False) -> ExecResult:
        """The runner's exec (``create``: it makes the workspace first); a runner that refused its
        bundle (``remote.bundle_refused``) ran nothing and removed that bundle when it had changed."""
        suite = self.plan.bundle.remote_suite(self.cfg.workspace_root)
        args = [
            "run", "--suite", suite, "--out", posixpath.join(ws.path, "out"),
            "--host", self.cfg.name, "--run-id", self.plan.run_dir.run_id,
            "--workspace-root", posixpath.join(ws.path, "work"),
            "--env-allow", ",".join(self.cfg.env_allowlist),
            "--trace-stream",  # one file of traces on the host, split as the pull reads it (archive.py)
            "--reaped", posixpath.join(ws.path, remote.REAPED),  # the removal's process scan, saved where it can be
        ]  # fmt: skip
        if not self.plan.all_tasks:
            args += ["--tasks", ",".join(self.plan.tasks)]
        args += ["--repeat", str(self.plan.repeat)]
        if self.plan.first_attempt:
            args += ["--first-attempt", str(self.plan.first_attempt)]
        if self.plan.trace_files:
            args.append("--trace-files")
        if self.slots() > 1:
            args += ["--slots", str(self.slots())]
        if not self.cfg.attempts_in_memory:
            args.append("--attempts-on-disk")
        runner = self._runner_argv(args)
        # A live model: the controller's proxy (key added there), reached through a reverse forward on
        # an SSH host; the runner itself gets CROSSHOST_MODEL_URL only (not in --env-allow: tools never see it).
        with self._model_route(ws) as model_env:
            pinned = {**self.cfg.env, **model_env}
            ws.put_pins(pinned)  # never on the command line: `ps` on the host shows that to every user
            script = remote.run_script(
                ws.path,
                [*self.cfg.env_allowlist, *model_env],
                list(pinned),
                runner,
                self.kill_after_s(),
                fingerprint=self._fingerprint_script(ws),
                inline_max=ws.inline_max(),
                # once the archive is out in this exec's output, the same exec removes the workspace (a
                # removal that fails is asked for again, on its own, and says why)
                remove=ws.removal_script(prune_bundles=bool(self.record.bundle_pushed), foreign="exit 1"),
                # removed only when it is still not the bundle: another name of this machine may have
                # published it since this runner's start looked (the same recheck as ensure_bundle's look)
                refused=(BUNDLE_REFUSED_EXIT, f"{{ {bundle_present_test(self.plan.bundle, self.cfg.workspace_root, self.cfg.python)}; }} "
                         f"|| {{ {bundle_remove_script(self.plan.bundle, self.cfg.workspace_root)}; }}"),
            )
            made = self.plan.bundle if create else None
            return ws.run(script, self.kill_after_s() + 30, self.plan.running, create=made)

    def _model_route(self, ws: Workspace) -> contextlib.AbstractContextManager[dict[str, str]]:
        """``model.proxy.model_route`` for this host's run; no live model: nothing added, and the proxy's
        module (its HTTP server, wire APIs, held model) is not loaded."""
        if self.plan.model is None:
            return contextlib.nullcontext({})
        from orchestrator.model.proxy import model_route

        return model_route(ws.host, self.plan.model, self.host_dir, self.plan.hold, self.cfg.name)

    def _pull(
        self,
        ws: Workspace,
        out_tar: remote.OutTar | None = None,
        *,
        within_s: float | None = None,
        fetched: Callable[[], None] | None = None,
    ) -> int:
        """Pull ``out/`` home; Ctrl-C during it stops it. The partial results of a run already stopped
        (by Ctrl-C too) still come home, for at most ``within_s`` (default ``PARTIAL_PULL_S``).
        ``out_tar``: what the run's exec said of the archive (None: nothing, make it now).
        ``fetched``: called once the archive is home (``Workspace.pull``), in a pull not cut short."""
        size, inline = (out_tar.size, out_tar.inline) if out_tar is not None else (None, None)
        if within_s is None and not self.plan.running.cancel.is_set():
            return ws.pull(
                self.host_dir, scratch=self.plan.run_dir.path, size=size, inline=inline,
                cancel=self.plan.running.cancel, fetched=fetched, gate=_pulling,
            )
        give_up = threading.Event()
        timer = threading.Timer(within_s or PARTIAL_PULL_S, give_up.set)
        timer.start()
        try:
            return ws.pull(self.host_dir, scratch=self.plan.run_dir.path, size=size, inline=inline, cancel=give_up)
        finally:
            timer.cancel()

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
        if not self.plan.run_dir.host_results_path(name).is_file():
            raise RunnerCrashed(name, f"runner exited 0 but sent no results.jsonl ({pulled} files pulled)")

    def _record_fingerprint(self) -> None:
        """The host's digest and Python, from the fingerprint.json its run sent (none: not reached)."""
        fingerprint, _ = self.plan.run_dir.read_fingerprint(self.cfg.name)
        if fingerprint is not None:
            self.record.fingerprint = fingerprint.fingerprint
            self.record.python = fingerprint.python

    def _clean_beside(self, ws: Workspace) -> _CleanBeside:
        """The run is over and its archive home: the workspace's removal (as ``_clean``'s) starts now,
        on a thread of its own; ``_clean`` takes its answer."""
        with contextlib.suppress(BaseException):  # a progress hook must never stop the cleanup
            self.plan.emit(self.cfg.name, "clean", "")
        prune = bool(self.record.bundle_pushed)
        return _CleanBeside(lambda: ws.remove(prune_bundles=prune), self.cfg.name)

    def _clean(
        self, ws: Workspace, kill_first: bool, error: BaseException | None, beside: _CleanBeside | None = None
    ) -> None:
        """Remove the run's workspace and verify it is gone (or take the answer of the removal started
        ``beside``); record the answer, never hide a failure."""
        if beside is None:
            with contextlib.suppress(BaseException):  # a progress hook must never stop the cleanup
                self.plan.emit(self.cfg.name, "clean", "")
        t0 = time.monotonic()
        try:
            # only a push adds a bundle to the host: a run that found its bundle there has nothing to prune
            if beside.result() if beside is not None else ws.remove(
                kill_first=kill_first, prune_bundles=bool(self.record.bundle_pushed)
            ):
                self.record.workspace_removed = True
            elif error is not None:  # only a failed create meets a workspace that is not its own
                self.cleanup_error = f"{ws.path} was not created by this run: left alone"
        except HostError as exc:
            self.record.workspace_removed = False
            if error is None:
                raise
            if isinstance(exc, WorkspaceLeft) or not isinstance(error, UNREACHABLE):
                self.cleanup_error = exc.one_line()  # said beside the first error, never instead of it
        except BaseException:
            self.record.workspace_removed = False  # never claimed removed when the answer did not come
            raise
        finally:
            self.record.stages["clean"] = round(beside.seconds if beside is not None else time.monotonic() - t0, 3)

    def done_detail(self) -> str:
        fp = self.record.fingerprint or "?"
        state = "replaced (the cached one had changed)" if self.record.bundle_replaced else "pushed" if self.record.bundle_pushed else "cached"
        return f"fingerprint {fp}, bundle {state}"
