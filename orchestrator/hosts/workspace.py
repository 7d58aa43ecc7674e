"""One run's workspace on one host, from creation to its verified removal.

``<workspace_root>/runs/<run_id>-<name>/`` (mode 711; ``name`` the inventory's, so two names for
one machine never share one) with ``out/`` (700: what the runner writes and the controller brings
home), ``in/`` (700: what the controller hands the runner, the pinned values; never brought home),
``work/`` (711: the attempts' workspaces, the directory the fingerprint describes; made by the
runner when the run's own exec makes the workspace) and ``owner`` (600: a
token only this ``Workspace`` knows). ``Workspace`` creates it (looking for the bundle in the same
exec) and pushes the bundle when it is missing, runs a script in it, pulls ``out/`` home as one tar
whose size is checked on the host before anything is transferred, removes it and verifies it is
gone, and kills what runs in it. It never removes, nor kills in, a workspace whose ``owner`` is not
its token: one it did not create (a stale one, another worker's) is left alone.
``Running`` knows which workspaces run a runner now, so Ctrl-C kills them all. ``crosshost replay``
and ``crosshost hosts`` use it; ``crosshost repro`` through the replay.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath

from orchestrator.errors import ArchiveRejected, HostError, RunnerCrashed, WorkspaceLeft
from orchestrator.hosts import remote
from orchestrator.hosts.archive import ArchiveLimits, max_archive_bytes, read_archive
from orchestrator.hosts.bundle import (
    Bundle,
    bundle_present_test,
    bundle_remove_script,
    ensure_bundle,
    in_use_marker,
    prune_host_bundles_script,
)
from orchestrator.hosts.fanout import Interrupted
from orchestrator.hosts.fingerprint import run_workspace, tail, work_dir
from orchestrator.hosts.transport.base import ExecResult, Host

#: the stages of one host in a replay, in order (the progress view and the manifest's timings)
STAGES = ("connect", "push", "run", "pull", "clean")
#: every exec of the lifecycle but the run itself
SHORT_TIMEOUT_S = 120.0
#: what a host's out.tar may hold; its size is checked on the host before anything is transferred
PULL_LIMITS = ArchiveLimits()
#: how long Ctrl-C waits for one kill
KILL_TIMEOUT_S = 30
#: after Ctrl-C, a host that owes a reply for SILENT_AFTER_S, whatever stage it is in, is abandoned
#: (every channel waiting on it ends; its workspace is reported not removed), so Ctrl-C is honoured
#: within seconds; a host still connecting is given up ABANDON_AFTER_S after Ctrl-C
ABANDON_AFTER_S = 3.0
SILENT_AFTER_S = 2.0
#: after Ctrl-C, how often every host is asked for a reply until the replay is over
WATCH_EVERY_S = 0.5


#: ``Workspace.remove``'s answer when the workspace there is not this worker's
NOT_OURS = "crosshost-not-ours"
#: ``Workspace.run``'s answer when it was asked to create the workspace and could not
NOT_CREATED = "crosshost-not-created"


class Workspace:
    """``<workspace_root>/runs/<run_id>-<name>/`` on ``host`` (``name`` is the inventory's: every error
    names it)."""

    def __init__(self, host: Host, name: str, workspace_root: str, run_id: str, python: str = "python3") -> None:
        self.host = host
        self.python = python  # the host's Python (checks the bundle cache)
        self.bundle_replaced = False  # the cached bundle had changed: removed, pushed again
        self.name = name
        self.root = workspace_root
        self.path = run_workspace(workspace_root, run_id, name)
        # Written into ``owner`` when this worker creates the workspace; removal checks it first. Not a
        # secret (it is on a command line): it tells this worker's workspace from any other.
        self.token = secrets.token_hex(16)
        self.created = False  # it exists on the host: remove it
        self.gone = False  # the run's own exec removed it (``remote.run_script``'s ``remove``): nothing to do
        self.pulled: list[PurePosixPath] = []  # the files the last pull wrote, relative to its ``into``
        self.pulled_sha256: dict[PurePosixPath, str] = {}  # their sha256, of the bytes as written

    def _exec(self, script: str, timeout: float = SHORT_TIMEOUT_S) -> ExecResult:
        return self.host.exec(["sh", "-c", script], timeout)

    def _make_script(self, bundle: Bundle | None, *, work: bool = True) -> str:
        """Shell text that creates it (an existing one fails: never reused), naming ``bundle`` as the one
        its run uses: a concurrent run's pruning never removes it (``prune_host_bundles_script``).
        ``work=False``: without ``work/``, for the run's own exec (the runner makes it, 711, and so does
        the fallback fingerprint: one exec of mkdir fewer)."""
        ws = remote.q(self.path)
        runs = remote.q(posixpath.dirname(self.path))
        make_work = f" && mkdir -m 711 {remote.q(work_dir(self.path))}" if work else ""
        mark = f" && {in_use_marker(bundle, self.path)}" if bundle else ""
        # The attempts' uid may pass through the workspace to work/ (711), never into out/ or in/
        # (700). ``mkdir`` claims the path (it fails on one that exists); ``owner`` is written next.
        owner = remote.q(posixpath.join(self.path, "owner"))
        # runs/ exists from the host's first run on: a test (the shell's own) spares an exec of mkdir
        return (
            f"{{ test -d {runs} || mkdir -p {runs}; }} && mkdir -m 711 {ws} && ( umask 077 && echo {self.token} > {owner} ) "
            f"&& mkdir -m 700 {ws}/out {ws}/{remote.PRIVATE_DIR}{make_work}{mark}"
        )

    def create(self, bundle: Bundle | None = None, *, failure: type[HostError] = RunnerCrashed) -> bool:
        """Create it, with ``out/`` and ``work/``; an existing one is never reused. With ``bundle``,
        look for it in the same exec: True when it is on the host already. A failure is ``failure``."""
        look = ""
        if bundle:
            present = bundle_present_test(bundle, self.root, self.python)
            look = f"if {present}; then echo bundle-cached; else {bundle_remove_script(bundle, self.root)}; fi; "
        made = self._exec(look + self._make_script(bundle))
        if not made.ok:
            raise failure(self.name, f"cannot create {self.path}: {tail(made.stderr)}")
        self.created = True
        said = made.stdout.split()
        self.bundle_replaced = "bundle-replaced" in said
        return bundle is not None and "bundle-cached" in said

    def create_with_bundle(self, bundle: Bundle) -> bool:
        """Create it and make sure the bundle is on the host (one exec when it is); True when pushed."""
        if self.create(bundle):
            return False
        return ensure_bundle(self.host, bundle, self.root, look=False, python=self.python)

    def put_pins(self, pinned: Mapping[str, str]) -> str | None:
        """Write the pinned values into ``in/`` (``remote.pins_path``; never on a command line, in a
        directory only the login user can enter); None when nothing is pinned."""
        if not pinned:
            return None
        path = remote.pins_path(self.path)
        with tempfile.TemporaryDirectory(prefix="crosshost-pins-") as tmp:  # 700, like the file
            local = Path(tmp) / "pins.env"
            fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(remote.pins_text(pinned))
            self.host.put(local, path)
        return path

    def put(self, local: Path, name: str) -> str:
        """Copy a local file into the workspace; its path on the host."""
        path = posixpath.join(self.path, name)
        self.host.put(local, path)
        return path

    def run(
        self, script: str, timeout: float, running: Running | None = None, *, create: Bundle | None = None
    ) -> ExecResult:
        """Run ``script`` (built by ``remote.run_script`` for this workspace); while it runs, it is
        in ``running``, so Ctrl-C can kill it. ``create``: it does not exist yet, and the same exec
        creates it first (as ``create`` does, naming that bundle; without the look: the runner's start
        checks the bundle, and the runner makes ``work/``); a failure to create it is ``RunnerCrashed``, and
        nothing else runs."""
        if create is not None:
            # the bundle's mtime (when it was last used) is set by the runner's checked start
            script = f"if ! {{ {self._make_script(create, work=False)}; }}; then echo {NOT_CREATED}; exit 1; fi\n{script}"
            # whatever the exec's fate, a workspace at this path with this token is this run's
            self.created = True
        if running is None:
            result = self._exec(script, timeout)
        else:
            with running.started(self):
                result = self._exec(script, timeout)
        if create is not None and result.stdout.split()[:1] == [NOT_CREATED]:
            self.created = False
            raise RunnerCrashed(self.name, f"cannot create {self.path}: {tail(result.stderr)}")
        return result

    @staticmethod
    def inline_max() -> int:
        """The largest archive the run's own output may carry (``remote.run_script``'s ``inline_max``):
        never one over the pull's cap, which must be refused before anything of it leaves the host."""
        return min(remote.INLINE_MAX_BYTES, max_archive_bytes(PULL_LIMITS))

    def pull(
        self,
        into: Path,
        *,
        scratch: Path,
        size: str | None = None,
        inline: bytes | None = None,
        cancel: threading.Event | None = None,
        fetched: Callable[[], None] | None = None,
        gate: contextlib.AbstractContextManager[object] | None = None,
    ) -> int:
        """Bring ``out/`` home into ``into`` as one tar; the number of files accepted. ``size`` is what
        the run's own exec said of ``out.tar`` (``remote.split_out_tar``), ``inline`` the archive when it
        came in that output (then nothing is fetched); without ``size`` (the exec was
        cut off) the archive is made and measured here, in one exec. ``scratch``: a local directory on
        the same file system as ``into`` for the tar in transit. The size the host reported is a first
        refusal only: the transfer itself stops at the cap, refuses anything but a regular file, and
        ends within one chunk of ``cancel`` (Ctrl-C). ``fetched`` is called once nothing more is needed
        from the host (the archive is here, or there is none), before the archive is read. ``gate`` is
        held while the archive is read and written (the controller's CPU), never while it travels."""
        if self.gone and inline is None:
            raise ArchiveRejected(self.name, f"{self.path}: the archive in the run's output did not decode, and "
                                  "the workspace is already removed: nothing to fetch")
        if size is None:
            ws = remote.q(self.path)
            made = self._exec(f"test -d {ws}/out && tar -C {ws}/out -cf {ws}/out.tar . && wc -c < {ws}/out.tar")
            size = made.stdout if made.ok else "none"
        if size.strip() == "none":
            if fetched is not None:
                fetched()
            return 0
        self._check_archive_size(size)
        sha256s: dict[PurePosixPath, str] = {}
        with contextlib.ExitStack() as transit:
            local = Path(f"{self.name}.out.tar")  # in memory already: the name alone, nothing fetched
            if inline is None:
                local = Path(transit.enter_context(tempfile.TemporaryDirectory(prefix=".pull-", dir=scratch))) / local
                self.host.get(
                    posixpath.join(self.path, "out.tar"), local, max_bytes=max_archive_bytes(PULL_LIMITS), cancel=cancel
                )
            if fetched is not None:
                fetched()
            with gate or contextlib.nullcontext():
                written = read_archive(local, into, host=self.name, limits=PULL_LIMITS, sha256s=sha256s, data=inline)
        self.pulled, self.pulled_sha256 = written, sha256s
        return len(written)

    def _check_archive_size(self, reported: str) -> None:
        """Refuse, before transferring it, an out.tar larger than read_archive would accept: a host
        must not be able to fill the controller's disk. ``reported`` is ``wc -c`` of it on the host."""
        where = posixpath.join(self.path, "out.tar")
        words = reported.split()
        if not words or not words[-1].isdigit():
            raise ArchiveRejected(self.name, f"{where}: cannot tell its size ({tail(reported) or 'no answer'})")
        size, cap = int(words[-1]), max_archive_bytes(PULL_LIMITS)
        if size > cap:
            raise ArchiveRejected(
                self.name,
                f"{where} is {size} bytes, more than the {cap} bytes an archive may have; not transferred "
                "(look for what fills the run's out/)",
            )

    def remove(self, *, kill_first: bool = False, prune_bundles: bool = False) -> bool:
        """Remove it and verify it is gone (``kill_first``: a runner may still run in it); True when
        nothing of it is left. A workspace at this path that this worker did not create (its
        ``owner`` is not this token) is left alone, nothing in it killed: False (one it created whose
        token changed is ``WorkspaceLeft``). Not gone is
        ``WorkspaceLeft``; a host that cannot be asked raises its ``HostError``. ``prune_bundles``: in
        the same exec, keep only the host's newest bundles (never one a run in progress uses). Removed
        by the run's own exec already (``gone``): True, nothing asked of the host."""
        if self.gone:
            return True
        res = self._exec(self.removal_script(kill_first=kill_first, prune_bundles=prune_bundles))
        if not res.ok:
            raise WorkspaceLeft(self.name, f"{self.path} is not gone: {tail(res.stderr) or f'exit {res.exit_code}'}")
        if NOT_OURS not in res.stdout.split():
            return True
        if self.created:  # this worker made it: what runs in it changed the token, and it stays
            raise WorkspaceLeft(self.name, f"{self.path} is not gone: its owner token changed while it ran; left alone")
        return False

    def removal_script(self, *, kill_first: bool = False, prune_bundles: bool = False, foreign: str = "") -> str:
        """``remove``'s shell text (its exec, or the run's own: ``remote.run_script``'s ``remove``): exit 0
        only when nothing of the workspace is left; one that is not this worker's is left alone, and
        ``foreign`` runs then (default: ``NOT_OURS`` is printed, and the exit is 0)."""
        ws = remote.q(self.path)
        script = remote.remove_script(self.path, self.python)
        if kill_first:
            script = f"{remote.kill_script(self.path)}; {script}"
        owner = remote.q(posixpath.join(self.path, "owner"))
        script = (
            f'if test -e {ws} || test -L {ws}; then if test "$(head -c 64 {owner} 2>/dev/null)" = {self.token}; '
            f"then {script}; else {foreign or f'echo {NOT_OURS}'}; fi; fi"
        )
        if prune_bundles:
            script = f"{script}; gone=$?; {prune_host_bundles_script(self.root)}; exit $gone"
        return script

    def kill(self) -> None:
        """Kill the runner's process group, if any; a dead host cannot be helped (its worker says so)."""
        with contextlib.suppress(Exception):
            self._exec(remote.kill_script(self.path), KILL_TIMEOUT_S)


class Running:
    """The hosts of a replay and the workspaces running a runner now, and the cancel flag Ctrl-C
    sets: a run is either seen and killed, or never started; a host that stops answering after
    Ctrl-C, in any stage, is abandoned within seconds."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cancel = threading.Event()
        self._now: dict[int, Workspace] = {}
        self._hosts: dict[int, Host] = {}  # every connected host, from its connect to its close
        self._over = threading.Event()

    def check_cancel(self) -> None:
        if self.cancel.is_set():
            raise Interrupted("interrupted")

    @contextlib.contextmanager
    def started(self, ws: Workspace) -> Iterator[None]:
        with self.lock:  # checked under the lock stop_all's snapshot takes
            self.check_cancel()
            self._now[id(ws)] = ws
        try:
            yield
        finally:
            with self.lock:
                self._now.pop(id(ws), None)

    @contextlib.contextmanager
    def connected(self, host: Host) -> Iterator[None]:
        """``host`` is watched after Ctrl-C for as long as this lasts (push, run, pull and clean)."""
        with self.lock:
            self._hosts[id(host)] = host
        try:
            yield
        finally:
            with self.lock:
                self._hosts.pop(id(host), None)

    def over(self) -> None:
        """The replay's hosts are done: nothing more to watch."""
        self._over.set()

    def stop_all(self) -> None:
        """Ctrl-C: no new run starts, every runner in flight is killed (its process group), and from
        now on every host that stops answering is abandoned; the workers then clean up."""
        with self.lock:
            self.cancel.set()
            now = list(self._now.values())
        self._watch_once()  # a host silent for long already is abandoned at once
        threading.Thread(target=self._watch, daemon=True, name="crosshost-watch").start()
        threads = [threading.Thread(target=ws.kill, daemon=True) for ws in now]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=KILL_TIMEOUT_S + 5)

    def _watch_once(self) -> None:
        with self.lock:
            hosts = list(self._hosts.values())
        for host in hosts:
            if host.silent_s() >= SILENT_AFTER_S:
                host.abandon()  # it answers nothing: its channels end now, its workspace is left
            else:
                host.ping()  # a stopped host is told from a slow one within SILENT_AFTER_S

    def _watch(self) -> None:
        """After Ctrl-C until the replay is over: every host is asked for a reply every WATCH_EVERY_S,
        and one that owes a reply for SILENT_AFTER_S is abandoned (a hung push, pull or clean too)."""
        while not self._over.wait(WATCH_EVERY_S):
            self._watch_once()
