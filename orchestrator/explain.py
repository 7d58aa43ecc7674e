"""``crosshost explain RUN_DIR``: why each flipped task flipped, by running it again.

For the run's flipped tasks, explain replays them once more with the run's pins (the suite the run
recorded, checked by its sha) on the reference and every host they flipped on, then re-runs them on
the reference with one environment fact of another host applied at a time (a counterfactual: each
allowlisted variable whose value differs between the two fingerprints, the locale variables, TZ),
at most ``MAX_COUNTERFACTUALS`` replays. A fact whose change alone gives the reference the other
host's verdict is named. Every replay is an ordinary replay of kind ``explain`` under
``<run>/explain/``, so each host's workspace is removed and verified gone as after any replay.
The evidence goes to ``explain.json``; the run's reports are written again to carry it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_runner.records import Fingerprint
from orchestrator.analysis import analyse_run
from orchestrator.analysis.models import Counterfactual, ExplainRecord, ExplainTask, RunReport, TaskReport
from orchestrator.bundle import build_bundle, bundle_cache_dir
from orchestrator.errors import InputError
from orchestrator.exit_policy import explain_exit
from orchestrator.host_job import EventSink
from orchestrator.inventory import HostConfig, load_inventory
from orchestrator.report import analyse_and_write
from orchestrator.rundir import RunDir, load_run, write_json_atomic
from orchestrator.transport import Opener

#: counterfactual replays per explain (each is one replay of the flipped tasks on the reference)
MAX_COUNTERFACTUALS = 8
COUNTERFACTUALS_AT_ONCE = 4
#: fingerprint fields that are environment variables the runner passes (when allowlisted)
_ENV_FACTS = ("locale.LANG", "locale.LC_ALL", "locale.LC_CTYPE", "locale.LC_MESSAGES", "tz.TZ")

FILE_EVIDENCE_NOTE = "file evidence not collected: this crosshost does not trace file access yet"


@dataclass
class ExplainRequest:
    run_dir: Path
    inventory_path: Path = Path("hosts.toml")
    tasks: list[str] | None = None  # the flipped tasks to explain (default: every one)
    accept_new: bool = False
    cache_dir: Path | None = None


@dataclass
class ExplainOutcome:
    run_dir: Path
    record: ExplainRecord
    report: RunReport | None = None
    errors: dict[str, str] = field(default_factory=dict)
    exit_code: int = 0


@dataclass(frozen=True)
class EnvFact:
    host: str  # the host whose value it is
    name: str  # the variable
    value: str | None  # None: unset on that host


def env_facts(
    reference: Fingerprint | None, other: Fingerprint | None, host: str, allowlist: Collection[str]
) -> list[EnvFact]:
    """The environment variables whose value differs between the two fingerprints, as facts of ``host``:
    the locale variables and TZ with their values, then an allowlisted variable present on the
    reference only (unset on ``host``; ``allowlist`` is the reference's: what its runs can see). A variable set on ``host`` alone has no recorded value (the
    fingerprint keeps names only): it is not a fact explain can apply."""
    left = reference.to_json() if reference else {}
    right = other.to_json() if other else {}
    facts: list[EnvFact] = []
    for dotted in _ENV_FACTS:
        group, name = dotted.split(".")
        a, b = (left.get(group) or {}).get(name), (right.get(group) or {}).get(name)
        if a != b and (b is None or isinstance(b, str)):
            facts.append(EnvFact(host, name, b))
    known = {f.name for f in facts} | {d.split(".")[1] for d in _ENV_FACTS}
    ref_keys, other_keys = set(left.get("env_keys") or []), set(right.get("env_keys") or [])
    facts += [
        EnvFact(host, k, None) for k in sorted(ref_keys - other_keys) if k not in known and k in allowlist
    ]
    return facts


def with_fact(fact: EnvFact) -> Callable[[HostConfig], HostConfig]:
    """The inventory entry with ``fact`` applied: the variable pinned to the value, or left out."""

    def adjust(cfg: HostConfig) -> HostConfig:
        allow = [k for k in cfg.env_allowlist if k != fact.name]
        env = {k: v for k, v in cfg.env.items() if k != fact.name}
        if fact.value is not None:
            allow.append(fact.name)
            env[fact.name] = fact.value
        return cfg.model_copy(update={"env_allowlist": allow, "env": env})

    return adjust


def _usual(verdicts: list[str]) -> str | None:
    """A host's verdict on a task: its most common non-error one."""
    counts = Counter(v for v in verdicts if v != "error")
    return counts.most_common(1)[0][0] if counts else None


def _flipped(report: RunReport, wanted: list[str] | None, where: str) -> list[TaskReport]:
    flipped = [t for t in report.tasks if t.flip]
    if wanted:
        names = {t.task for t in report.tasks}
        for name in wanted:
            if name not in names:
                raise InputError(f"{where}: --task {name!r} is not a task of this run")
        flipped = [t for t in flipped if t.task in wanted]
    return flipped


def explain(
    request: ExplainRequest, *, opener: Opener | None = None, on_event: EventSink | None = None
) -> ExplainOutcome:
    """Replay the flipped tasks once more and the counterfactuals; write explain.json and the reports."""
    from orchestrator.replay import ReplayRequest, replay

    started = time.monotonic()
    run = load_run(request.run_dir)
    report = analyse_run(request.run_dir)
    reference = report.reference or (run.hosts[0] if run.hosts else "")
    record = ExplainRecord(run_id=run.run_id, reference=reference, max_counterfactuals=MAX_COUNTERFACTUALS)
    outcome = ExplainOutcome(request.run_dir, record)
    tasks = _flipped(report, request.tasks, str(request.run_dir))
    if not tasks:
        outcome.report = report
        return outcome
    suite = run.manifest.suite
    if suite is None or not suite.path or not Path(suite.path).is_dir():
        raise InputError(
            f"{request.run_dir}: the run's suite is not on this machine ({suite.path if suite else '?'})"
        )
    suite_path = Path(suite.path)
    bundle = build_bundle(suite_path, request.cache_dir or bundle_cache_dir(run.path.parent))
    if suite.sha and bundle.suite_sha != suite.sha:
        raise InputError(
            f"{suite.path}: the suite changed since run {run.run_id} (sha {bundle.suite_sha}, the run's {suite.sha}); "
            "explain replays with the run's pins only"
        )
    out = RunDir(request.run_dir).explain_runs
    lock = threading.Lock()

    def run_once(
        hosts: list[str], names: list[str], adjust: Callable[[HostConfig], HostConfig] | None
    ) -> dict[tuple[str, str], str]:
        replayed = replay(
            ReplayRequest(
                suite_dir=suite_path,
                inventory_path=request.inventory_path,
                hosts=hosts,
                tasks=names,
                repeat=1,
                out=out,
                accept_new=request.accept_new,
                kind="explain",
                reference=hosts[0],
                adjust_host=adjust,
                hold_model=False,
            ),
            opener=opener,
            on_event=on_event,
            bundle=bundle,
            with_analysis=False,
        )
        with lock:  # counterfactual replays finish side by side
            record.replays += 1
            record.runs.append(replayed.run_dir.run_id)
            outcome.errors.update(replayed.errors)
        return {(r.env, r.task): r.verdict for r in replayed.results}

    others = sorted({h for t in tasks for h in t.flipped_hosts})
    again = run_once([reference, *others], [t.task for t in tasks], None)
    entries = {t.task: ExplainTask(task=t.task) for t in tasks}
    for t in tasks:
        entries[t.task].again = {h: again.get((h, t.task)) for h in [reference, *t.flipped_hosts]}
        entries[t.task].not_collected.append(FILE_EVIDENCE_NOTE)

    allowlist = load_inventory(request.inventory_path).get(reference).env_allowlist
    planned: list[tuple[EnvFact, list[str]]] = []
    for host in others:
        names = [t.task for t in tasks if host in t.flipped_hosts]
        for fact in env_facts(run.fingerprints.get(reference), run.fingerprints.get(host), host, allowlist):
            if len(planned) < MAX_COUNTERFACTUALS:
                planned.append((fact, names))
            else:
                record.skipped.append(
                    f"{host}'s {fact.name}: over the bound of {MAX_COUNTERFACTUALS} re-runs"
                )
    # each counterfactual is its own replay of the reference (its own workspace): they run side by side
    with ThreadPoolExecutor(max_workers=COUNTERFACTUALS_AT_ONCE) as pool:
        results = list(pool.map(lambda p: run_once([reference], p[1], with_fact(p[0])), planned))
    for (fact, names), verdicts in zip(planned, results, strict=True):
        for t in tasks:
            if t.task not in names:
                continue
            theirs = _usual(t.verdicts.get(fact.host, []))
            ours = _usual(t.verdicts.get(reference, []))
            got = verdicts.get((reference, t.task))
            entries[t.task].counterfactuals.append(
                Counterfactual(
                    host=fact.host,
                    fact=fact.name,
                    value=fact.value,
                    verdict=got,
                    reproduces=got is not None and got == theirs and got != ours,
                )  # fmt: skip
            )
    record.tasks = list(entries.values())
    record.seconds = round(time.monotonic() - started, 2)
    write_json_atomic(RunDir(request.run_dir).explain_path, record.model_dump(mode="json"))
    outcome.report = analyse_and_write(request.run_dir, None)
    outcome.exit_code = explain_exit(outcome.errors)
    return outcome


def explain_summary(record: ExplainRecord) -> dict[str, Any]:
    """What explain spent, for the terminal and the report."""
    counterfactuals = sum(len(t.counterfactuals) for t in record.tasks)
    return {"replays": record.replays, "seconds": record.seconds, "counterfactuals": counterfactuals}
