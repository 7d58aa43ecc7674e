"""A run as the history index keeps it: ``RunRow``, read from a finished run directory.

The run directory is the source of truth: ``read_run`` reads its manifest, its ``report.json``
(through ``RunReport``) or its ``repro.json``, and the index stores what it returns.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from orchestrator.analysis.models import REPORT_NAME, RunReport
from orchestrator.analysis.stats import pass_counts, pass_rate
from orchestrator.errors import InputError
from orchestrator.store.records import Manifest
from orchestrator.store.rundir import RunDir, parse_utc


class HostSummary(TypedDict):
    """One host of an indexed run (the ``hosts`` column holds a JSON list of them)."""

    name: str
    fingerprint: str | None
    reachable: bool | None
    python: NotRequired[str]  # the manifest's, when it named one
    error: NotRequired[str]  # why the run failed there


class TaskOutcome(TypedDict):
    """One task of an indexed run (a ``task_results`` row)."""

    classification: str | None
    flip: bool


class RunRowJson(TypedDict):
    """A ``RunRow`` as ``history --json`` prints it."""

    run_id: str
    kind: str
    started: str | None
    finished: str | None
    suite: str | None
    suite_sha: str | None
    pins: Any
    hosts: list[HostSummary]
    flip_rate: float | None
    valid: bool | None
    pass_rate: dict[str, float | None]
    tasks: dict[str, TaskOutcome]
    repeat: int | None


@dataclass
class RunRow:
    """One indexed run, as ``history`` returns it."""

    run_id: str
    kind: str
    started: str | None
    finished: str | None
    suite: str | None
    suite_sha: str | None
    pins: Any
    hosts: list[HostSummary]
    flip_rate: float | None
    valid: bool | None
    pass_rate: dict[str, float | None]
    tasks: dict[str, TaskOutcome] = field(default_factory=dict)
    repeat: int | None = None

    @property
    def flipping(self) -> set[str]:
        return {t for t, r in self.tasks.items() if r["flip"]}

    def to_json(self) -> RunRowJson:
        return RunRowJson(
            run_id=self.run_id, kind=self.kind, started=self.started, finished=self.finished, suite=self.suite,
            suite_sha=self.suite_sha, pins=self.pins, hosts=self.hosts, flip_rate=self.flip_rate,
            valid=self.valid, pass_rate=self.pass_rate, tasks=self.tasks, repeat=self.repeat,
        )  # fmt: skip


def _iso(value: str | None) -> str | None:
    """Timestamps as ISO-8601 UTC strings of one fixed width, so ordering by text is ordering by time."""
    parsed = parse_utc(value)
    if parsed is None:
        return value or None
    # one fixed width (microseconds): text order must be time order, even within one second
    return parsed.astimezone(_dt.UTC).isoformat(timespec="microseconds")


def _hosts(manifest: Manifest, report: RunReport | None) -> list[HostSummary]:
    """The report's hosts, else the manifest's; the manifest's python beside each (it names what moved
    when a fingerprint does: cron vs a shell) and the host's error where it failed."""
    if report is not None and report.hosts:
        hosts = [HostSummary(name=h.name, fingerprint=h.fingerprint, reachable=h.reachable) for h in report.hosts]
    else:
        hosts = [
            HostSummary(name=name, fingerprint=rec.fingerprint, reachable=rec.reachable)
            for name, rec in manifest.hosts.items()
        ]
    for h in hosts:
        rec = manifest.hosts.get(h["name"])
        if rec is not None and rec.python:
            h["python"] = rec.python
        if rec is not None and rec.error:  # why the run failed there, for `history` to say
            h["error"] = rec.error
    return hosts


def _pass_rates(run_dir: RunDir, report: RunReport | None, host_names: list[str]) -> dict[str, float | None]:
    """Per host: passes / attempts with a verdict on the agent (``error`` is the host's, not counted),
    from the report's verdicts, else from results.jsonl."""
    verdicts: dict[str, list[str]] = {name: [] for name in host_names}
    tasks = report.tasks if report is not None else []
    if any(t.verdicts for t in tasks):
        for t in tasks:
            for host, seq in t.verdicts.items():
                verdicts.setdefault(host, []).extend(seq)
    else:
        for _, row in run_dir.iter_results():
            verdicts.setdefault(row.env, []).append(row.verdict)
    rates = {h: pass_counts(seq) for h, seq in sorted(verdicts.items())}
    return {h: pass_rate(c.passes, c.n) for h, c in rates.items()}


def read_run(run_dir: Path, report: RunReport | None = None) -> RunRow:
    """Read one finished run directory into the row the index keeps for it; ``report``: its
    report.json as the analysis that just wrote it holds it (not read back)."""
    rundir = RunDir(Path(run_dir))
    manifest = rundir.read_manifest()
    if manifest.shard is not None:  # a part of a run: its merged run is the one indexed
        raise InputError(
            f"{rundir.path}: {manifest.shard.label} of run {manifest.shard.run_id}, not a run of its own "
            "(crosshost merge joins the shards into the run)"
        )
    report_path = rundir.path / REPORT_NAME
    if report is None:
        report = RunReport.read(report_path) if report_path.is_file() else None
    repro = rundir.read_repro()
    if report is None and repro is None:
        raise InputError(f"{report_path}: missing; the run has not finished (or crashed before its report)")

    kind = "repro" if repro is not None or manifest.kind == "repro" else "replay"
    suite = manifest.suite.name if manifest.suite else report.suite if report is not None else None
    suite_sha = manifest.suite.sha if manifest.suite else None
    if kind == "repro" and not suite and repro is not None:
        suite = repro.suite
    hosts = _hosts(manifest, report)
    if kind == "repro" and not hosts and repro is not None:
        hosts = [HostSummary(name=h, fingerprint=None, reachable=None) for h in repro.hosts]
    tasks = {t.task: TaskOutcome(classification=t.classification, flip=t.flip) for t in report.tasks} if report else {}
    valid = report.valid if report is not None else None
    flip_rate = report.flip_rate if report is not None else None
    return RunRow(
        run_id=manifest.run_id,
        kind=kind,
        started=_iso(manifest.started),
        finished=_iso(manifest.finished),
        suite=str(suite) if suite else None,
        suite_sha=suite_sha,
        pins=manifest.pins,
        hosts=hosts,
        flip_rate=float(flip_rate) if flip_rate is not None else None,
        valid=bool(valid) if valid is not None else None,
        pass_rate=_pass_rates(rundir, report, [h["name"] for h in hosts]),
        tasks=tasks,
        repeat=manifest.repeat,
    )
