"""``crosshost merge``: the shards of one run (``replay --shard``) joined into the run directory the
unsharded replay would have written, and judged as it would have been.

The shards must be all N of one run: the same run id, suite, bundle, run-wide pins, contract,
reference, hosts, gate and held-model mode, each shard's own part of the tasks, none missing or
given twice; anything else is refused in one line. The merged ``<out>/<run_id>/`` holds every
shard's traces, fingerprints and results rows, the held model's files joined (``model.hold``), and
a manifest whose host records add the shards' up; then the one analysis every run gets
(``analyse_and_write``) and the replay's exit policy judge it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from orchestrator.commands.replay import ReplayOutcome
from orchestrator.commands.shards import Shard
from orchestrator.errors import InputError
from orchestrator.exit_policy import replay_exit
from orchestrator.model.hold import HoldSummary, merge_hold
from orchestrator.report import analyse_and_write
from orchestrator.store.history import after_replay
from orchestrator.store.records import HostRecord, Manifest, ShardRecord
from orchestrator.store.rundir import ResultRow, RunDir, write_bytes_atomic

#: pins that are the same for every task of one run: shards that differ there are not one run
RUN_WIDE_PINS = ("runner_source_sha", "contract_sha")


@dataclass
class _Part:
    run_dir: RunDir
    manifest: Manifest
    shard: ShardRecord

    @property
    def label(self) -> str:
        return f"{self.run_dir.path} ({self.shard.label} of run {self.shard.run_id})"


def _read_part(path: Path) -> _Part:
    if not path.is_dir():
        raise InputError(f"{path}: not a directory; give the shard run directories (replay --shard)")
    run_dir = RunDir(path)
    manifest = run_dir.read_manifest()
    if manifest.shard is None:
        raise InputError(
            f"{path}: not a shard (its manifest.json has no shard); crosshost merge joins the shards of one "
            "replay --shard run"
        )
    if manifest.finished is None or manifest.interrupted:
        how = "was interrupted" if manifest.interrupted else "has not finished (manifest.json: finished is null)"
        raise InputError(f"{path}: {manifest.shard.label} {how}; remove it and run that shard again")
    return _Part(run_dir, manifest, manifest.shard)


def _run_wide_pins(parts: list[_Part]) -> None:
    """Refuse shards whose tasks ran on different runners or contracts (a run has one of each)."""
    first: dict[str, tuple[str, _Part]] = {}
    for part in parts:
        for pins in part.manifest.pins.values():
            for key in RUN_WIDE_PINS:
                value = pins.get(key)
                if not value:
                    continue
                seen = first.setdefault(key, (value, part))
                if seen[0] != value:
                    _refuse(part, seen[1], f"pin {key} {value}, not {seen[0]}")


#: manifest fields every shard of one run shares, with the words a refusal names them by
_SAME: tuple[tuple[str, Callable[[_Part], object]], ...] = (
    ("run id", lambda p: p.shard.run_id),
    ("number of shards", lambda p: p.shard.count),
    ("split", lambda p: p.shard.by),
    ("kind", lambda p: p.manifest.kind),
    ("suite", lambda p: (p.manifest.suite.name, p.manifest.suite.sha) if p.manifest.suite else None),
    ("bundle", lambda p: (p.manifest.bundle_sha, p.manifest.zipapp_sha)),
    ("tasks of the run", lambda p: p.shard.tasks),
    ("repeat", lambda p: p.manifest.repeat),
    ("reference", lambda p: p.manifest.reference),
    ("hosts", lambda p: list(p.manifest.hosts)),
    ("gate", lambda p: (p.manifest.gate, p.manifest.alpha, p.manifest.burn_invalidates)),
    ("held model", lambda p: p.manifest.hold_model),
)


def _name(entry: Any) -> str:
    return str(entry.get("name")) if isinstance(entry, dict) else repr(entry)


def _refuse(part: _Part, first: _Part, what: str) -> NoReturn:
    raise InputError(
        f"{part.run_dir.path}: not a shard of the same run as {first.run_dir.path}: {what}; "
        "merge the shards of one run"
    )


def _check_one_run(parts: list[_Part]) -> None:
    """Refuse, in one line, shards that are not all N of one run."""
    first = parts[0]
    for what, value in _SAME:
        for part in parts[1:]:
            if value(part) != value(first):
                _refuse(part, first, f"{what} {value(part)!r}, not {value(first)!r}")
    entries = {_name(e): e for e in first.manifest.inventory.get("hosts") or []}
    for part in parts[1:]:
        for entry in part.manifest.inventory.get("hosts") or []:
            if entries.get(_name(entry)) != entry:
                _refuse(part, first, f"host {_name(entry)}'s inventory entry differs")
    _run_wide_pins(parts)
    contract = first.run_dir.contract_path.read_bytes() if first.run_dir.contract_path.is_file() else None
    for part in parts[1:]:
        mine = part.run_dir.contract_path.read_bytes() if part.run_dir.contract_path.is_file() else None
        if mine != contract:
            _refuse(part, first, f"its contract.json is not {first.run_dir.contract_path}")
    seen: dict[int, _Part] = {}
    for part in parts:
        if part.shard.index in seen:
            raise InputError(
                f"{part.run_dir.path}: {part.shard.label} is given twice (also {seen[part.shard.index].run_dir.path})"
            )
        seen[part.shard.index] = part
        expected = Shard(part.shard.run_id, part.shard.index, part.shard.count).take(part.shard.tasks)
        if part.manifest.tasks != expected:
            raise InputError(
                f"{part.run_dir.manifest_path}: {part.shard.label} replayed tasks {part.manifest.tasks}, "
                f"not its part of the run {expected}; run that shard again"
            )
    missing = [i for i in range(1, first.shard.count + 1) if i not in seen]
    if missing:
        names = ", ".join(f"{i}/{first.shard.count}" for i in missing)
        raise InputError(
            f"run {first.shard.run_id}: shard(s) {names} missing; give all {first.shard.count} shard directories"
        )


def _merged_host(records: list[tuple[str, HostRecord]]) -> HostRecord:
    """One host's record over every shard: reachable and cleaned only if it was in each; every
    shard's error, named by its shard; each stage's seconds added up."""
    got = [r for _, r in records]

    def first(values: list[Any]) -> Any:
        return next((v for v in values if v is not None), None)

    def every(values: list[bool | None]) -> bool | None:
        return None if all(v is None for v in values) else all(bool(v) for v in values)

    stages: dict[str, float] = {}
    for r in got:
        for stage, seconds in r.stages.items():
            stages[stage] = round(stages.get(stage, 0.0) + seconds, 3)
    errors = [f"{label}: {r.error}" for label, r in records if r.error]
    exits = [r.runner_exit for r in got if r.runner_exit is not None]
    return HostRecord(
        reachable=all(r.reachable for r in got),
        error="; ".join(errors) or None,
        fingerprint=first([r.fingerprint for r in got]),
        python=first([r.python for r in got]),
        bundle_pushed=None if all(r.bundle_pushed is None for r in got) else any(bool(r.bundle_pushed) for r in got),
        bundle_replaced=None if all(r.bundle_replaced is None for r in got) else any(bool(r.bundle_replaced) for r in got),
        runner_exit=next((e for e in exits if e != 0), exits[0] if exits else None),
        workspace_removed=every([r.workspace_removed for r in got]),
        stages=stages,
    )


def _merged_manifest(run_id: str, parts: list[_Part]) -> Manifest:
    first = parts[0].manifest
    tasks = parts[0].shard.tasks
    hosts = list(first.hosts)
    notes: list[str] = []
    for part in parts:
        notes += [n for n in part.manifest.notes if n not in notes]
    merged_hosts: dict[str, HostRecord] = {}
    for host in hosts:
        records = [(p.shard.label, p.manifest.hosts[host]) for p in parts if host in p.manifest.hosts]
        merged_hosts[host] = _merged_host(records)
        digests = {(r.fingerprint, label) for label, r in records if r.fingerprint}
        if len({d for d, _ in digests}) > 1:
            seen = ", ".join(f"{d} ({label})" for d, label in sorted(digests, key=lambda x: x[1]))
            notes.append(f"{host}: its fingerprint changed between shards: {seen}; the first shard's is the run's")
    pins: dict[str, dict[str, Any]] = {}
    sampled: set[str] = set()
    tags: dict[str, list[str]] = {}
    for part in parts:
        pins.update(part.manifest.pins)
        sampled.update(part.manifest.sampled)
        tags.update(part.manifest.task_tags)
    started = [p.manifest.started for p in parts if p.manifest.started]
    finished = [p.manifest.finished for p in parts if p.manifest.finished]
    return first.model_copy(
        update={
            "run_id": run_id,
            "started": min(started) if started else None,
            "finished": max(finished) if finished else None,
            "sampled": [t for t in tasks if t in sampled],
            "task_tags": {t: tags[t] for t in tasks if t in tags},
            "tasks": list(tasks),
            "pins": {t: pins[t] for t in tasks if t in pins},
            "retries": [r for p in parts for r in p.manifest.retries],
            "hosts": merged_hosts,
            "interrupted": False,
            "notes": notes,
            "shard": None,
            "shards": [p.run_dir.path.name for p in parts],
        },
        deep=True,
    )


def _copy_new(src: str, dst: str) -> str:
    """Copy a file unless the merged run has it already (each host's fingerprint.json is in every
    shard: the first shard's is kept)."""
    if Path(dst).exists():
        return dst
    return str(shutil.copy2(src, dst))


def _merged_results(parts: list[_Part], hosts: list[str], tasks: list[str]) -> list[ResultRow]:
    """Every shard's rows, host by host (inventory order), task by task (suite order), by attempt."""
    rows = [row for part in parts for _, row in part.run_dir.iter_results()]
    host_at = {h: i for i, h in enumerate(hosts)}
    task_at = {t: i for i, t in enumerate(tasks)}
    return sorted(
        rows, key=lambda r: (host_at.get(r.env, len(host_at)), task_at.get(r.task, len(task_at)), r.attempt)
    )


def merge_shards(paths: Sequence[Path], out: Path | None = None) -> ReplayOutcome:
    """Join the shard directories ``paths`` (all N of one run) into ``<out>/<run_id>/`` (``out``
    defaults to the directory holding the first shard), analyse it as every run is analysed, and
    judge it as its replay would have been judged."""
    if not paths:
        raise InputError("crosshost merge: give the shard run directories (replay --shard), all of them")
    parts = sorted((_read_part(Path(p)) for p in paths), key=lambda p: p.shard.index)
    _check_one_run(parts)
    for part in parts:
        if part.manifest.hold_model is not None and HoldSummary.read(part.run_dir) is None:
            raise InputError(
                f"{part.run_dir.model_hold_path}: missing or unreadable, but the run held the model; "
                f"run {part.shard.label} again"
            )
    run_id = parts[0].shard.run_id
    root = Path(out) if out is not None else parts[0].run_dir.path.parent
    if (root / run_id).exists():
        raise InputError(f"{root / run_id}: exists already (merged before?); remove it, or give --out elsewhere")
    merged = RunDir.create(root, run_id)
    try:
        manifest = _merged_manifest(run_id, parts)
        hosts = list(manifest.hosts)
        write_bytes_atomic(merged.contract_path, parts[0].run_dir.contract_path.read_bytes())
        for part in parts:
            for host in part.run_dir.hosts_on_disk():
                shutil.copytree(
                    part.run_dir.host_dir(host), merged.host_dir(host), symlinks=True,
                    dirs_exist_ok=True, copy_function=_copy_new,
                )  # fmt: skip
        rows = _merged_results(parts, hosts, manifest.tasks)
        merged.write_results(rows)
        if manifest.hold_model is not None:
            merge_hold([p.run_dir for p in parts], merged, write_bytes_atomic)
        merged.write_manifest(manifest)
    except BaseException:
        shutil.rmtree(merged.path, ignore_errors=True)  # half a merged run is no run
        raise
    report = analyse_and_write(merged.path)
    code, reason = replay_exit(manifest, report, manifest.gate, rows)
    after = after_replay(merged.path)
    errors = {h: rec.error for h, rec in manifest.hosts.items() if rec.error}
    joined = f"merged {len(parts)} shard(s) of run {run_id}: {', '.join(p.run_dir.path.name for p in parts)}"
    notes = [joined, *(n for n in (after.warning,) if n)]
    return ReplayOutcome(merged, manifest, code, report, rows, errors, exit_reason=reason, notes=notes)
