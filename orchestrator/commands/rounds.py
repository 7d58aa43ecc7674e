"""``replay --until-decided [--max-repeat N]``: rounds of attempts only for the tasks still undecided.

The rounds are planned first (``analysis.sequential.plan_looks``: the suite's repeat, at least 2, then
doubling up to ``--max-repeat``). Each round is an ordinary replay of the open tasks into
``<run>/rounds/<round run id>/``, numbering its attempts on from the last round (``--first-attempt``),
so the held model holds every round as it holds one replay. After each round the run directory is
assembled from all rounds (traces, results, fingerprints, the held model's summary) and judged with
the sequential rule: each look at alpha / looks, Holm or Benjamini–Hochberg across the suite as
always. The rounds stop when no task is open or the budget is spent; the assembled run is analysed
and reported like any other, its manifest naming every round (``rounds``), the attempts each task got
(``task_repeat``) and the number of planned looks (``looks``).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.analysis.flips import TaskFlip
from orchestrator.analysis.models import RunReport
from orchestrator.analysis.run import analyse_run
from orchestrator.analysis.sequential import look_level, plan_looks, still_open
from orchestrator.analysis.stats import MAX_REPEAT, Counts
from orchestrator.commands.replay import ReplayOutcome, ReplayRequest, replay
from orchestrator.errors import SuiteError
from orchestrator.exit_policy import replay_exit
from orchestrator.hosts.bundle import bundle_cache_dir, replay_bundle
from orchestrator.model.hold import HoldSummary
from orchestrator.report import analyse_and_write
from orchestrator.store.jsonl import iter_results
from orchestrator.store.records import Manifest, RoundRecord
from orchestrator.store.rundir import ResultRow, RunDir, utc_now, write_bytes_atomic

ROUNDS_DIR = "rounds"


def open_tasks(report: RunReport, level: float, max_repeat: int) -> list[str]:
    """The tasks of an assembled run that another round could still decide."""
    reference = report.reference or ""
    out = []
    for task in report.tasks:
        counts = {r.host: Counts(r.n, r.passes) for r in task.rates}
        flip = TaskFlip(task.flip, task.flipped_hosts, task.comparable, task.evidence, counts)
        others = [h for h in counts if h != reference]
        if task.classification not in ("infra_error", "same_host") and still_open(
            flip, reference, others, level, max_repeat
        ):
            out.append(task.task)
    return out


def _link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` as ``src`` (a hard link where it can be); one a later round assembles again stays."""
    if dst.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _assemble(main: RunDir, rounds: list[ReplayOutcome], manifest: Manifest) -> list[ResultRow]:
    """The run directory as one replay of every round: traces and fingerprints of each host, the
    results of every round, the held model's summary merged."""
    rows: list[ResultRow] = []
    holds: list[HoldSummary] = []
    for i, outcome in enumerate(rounds):
        src = outcome.run_dir
        if i == 0:
            shutil.copy2(src.contract_path, main.contract_path)
        for host in outcome.manifest.hosts:
            if i == 0 and src.fingerprint_path(host).is_file():
                _link_or_copy(src.fingerprint_path(host), main.fingerprint_path(host))
            traces = src.host_dir(host) / "traces"
            for path in sorted(traces.glob("*.jsonl")) if traces.is_dir() else []:
                _link_or_copy(path, main.host_dir(host) / "traces" / path.name)
        if src.results_path.is_file():
            rows += [row for _, row in iter_results(src.results_path)]
        part = HoldSummary.read(src)
        if part is not None:
            holds.append(part)
    main.write_results(rows)
    hold = HoldSummary.joined(holds)
    if hold is not None:
        hold.write(main.model_hold_path, write_bytes_atomic)
    main.write_manifest(manifest)
    return rows


def replay_until_decided(request: ReplayRequest, **kwargs: Any) -> ReplayOutcome:
    """Rounds of ``replay`` for the open tasks until every task is decided or ``--max-repeat`` is spent."""
    max_repeat = request.until_decided
    if max_repeat is None or not 1 <= max_repeat <= MAX_REPEAT:
        raise SuiteError(f"--max-repeat must be from 1 to {MAX_REPEAT}, got {max_repeat}")
    bundle = kwargs.pop("bundle", None)
    suite = kwargs.pop("suite", None)
    if bundle is None:
        cache = request.cache_dir or bundle_cache_dir(request.out)
        bundle = replay_bundle(request.suite_dir, cache, suite)
    looks = plan_looks(request.repeat or bundle.suite.repeat, max_repeat)
    level = look_level(bundle.suite.gate.alpha, len(looks))
    main = RunDir.create(request.out)
    rounds: list[ReplayOutcome] = []
    done = 0
    todo: list[str] | None = None  # None: the request's own selection
    task_repeat: dict[str, int] = {}
    manifest: Manifest | None = None
    rows: list[ResultRow] = []
    for number, target in enumerate(looks, 1):
        sub = replace(
            request, out=main.path / ROUNDS_DIR, repeat=target - done, first_attempt=done, until_decided=None,
            compare_last=False,
        )  # fmt: skip
        if todo is not None:  # later rounds: exactly the open tasks (task ids hold no glob characters)
            sub = replace(sub, tasks=todo, exclude=None, tags=None)
        outcome = replay(sub, bundle=bundle, with_analysis=False, **kwargs)
        rounds.append(outcome)
        for task in outcome.manifest.tasks:
            task_repeat[task] = target
        if manifest is None:
            manifest = outcome.manifest.model_copy(deep=True)
            manifest.run_id = main.run_id
            manifest.first_attempt = 0
        manifest.repeat = target
        manifest.looks = len(looks)
        manifest.task_repeat = dict(task_repeat)
        manifest.rounds.append(
            RoundRecord(round=number, run_id=outcome.manifest.run_id, repeat=target, tasks=list(outcome.manifest.tasks))
        )
        for host, rec in outcome.manifest.hosts.items():
            mine = manifest.hosts.get(host)
            if mine is not None and rec.error and not mine.error:
                manifest.hosts[host] = rec
        manifest.retries += outcome.manifest.retries if number > 1 else []
        manifest.interrupted = manifest.interrupted or outcome.manifest.interrupted
        manifest.finished = utc_now()
        rows = _assemble(main, rounds, manifest)
        done = target
        if outcome.manifest.interrupted or outcome.errors:
            break
        todo = open_tasks(analyse_run(main.path), level, max_repeat)
        if not todo:
            break
    assert manifest is not None  # one round at least: plan_looks is never empty
    final = rounds[-1]
    result = ReplayOutcome(main, manifest, 0, results=rows, errors=final.errors)
    if not manifest.interrupted:
        result.report = analyse_and_write(main.path, request.gate)
    result.exit_code, result.exit_reason = replay_exit(manifest, result.report, request.gate, rows)
    spent = sum(len(r.manifest.tasks) * (r.manifest.repeat or 0) for r in rounds)
    result.notes.append(
        f"--until-decided: {len(rounds)} round(s) of {len(looks)} planned ({', '.join(map(str, looks))} attempts a host), "
        f"{spent} attempts a host over {len(task_repeat)} task(s) against {max_repeat * len(task_repeat)} at a fixed "
        f"--repeat {max_repeat}; each look at alpha/{len(looks)} = {level:g}"
    )
    return result
