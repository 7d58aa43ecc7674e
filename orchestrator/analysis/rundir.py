"""Reading a run directory (``runs/<run_id>/``) tolerantly.

Optional manifest fields may be missing; a missing or unreadable contract or fingerprint is not an
exception but a recorded problem, because it makes the run invalid and the report must say so.
Only a directory without a readable manifest is not a run at all (InputError, exit 2).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.analysis.flips import DEFAULT_GATE, row_attempt, row_verdict
from orchestrator.analysis.stats import DEFAULT_ALPHA
from orchestrator.errors import InputError
from orchestrator.store import iter_jsonl

AttemptKey = tuple[str, str, int]  # (host, task, attempt)


def _load_json_object(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(object, None) or (None, why) — why names the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, f"{path}: missing"
    except OSError as exc:
        return None, f"{path}: cannot read: {exc.strerror or exc}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"{path}:{exc.lineno}: not JSON: {exc.msg}"
    if not isinstance(obj, dict):
        return None, f"{path}: must hold a JSON object"
    return obj, None


def _alpha_of(value: object) -> float | None:
    """The manifest's ``alpha``, or the suite's ``[gate] alpha``; only a number strictly in (0, 1)."""
    if isinstance(value, dict):
        value = value.get("alpha")
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 1:
        return float(value)
    return None


def _gate_of(value: object) -> float | None:
    """The manifest's gate: a number, or the suite's ``[gate]`` table ``{"flip_rate": x}``."""
    if isinstance(value, dict):
        value = value.get("flip_rate")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


@dataclass
class ResultRow:
    verdict: str
    reason: str


@dataclass
class RunDir:
    path: Path
    manifest: dict[str, Any]
    run_id: str
    suite_name: str | None
    suite_sha: str | None
    hosts: list[str]
    reference: str | None
    host_meta: dict[str, dict[str, Any]]
    gate: float | None
    interrupted: bool
    contract: dict[str, Any] | None
    contract_problem: str | None
    tasks: list[str] = field(default_factory=list)
    repeat: int = 0
    alpha: float = DEFAULT_ALPHA
    sampled: set[str] = field(default_factory=set)  # tasks whose agent is sampled
    fingerprints: dict[str, dict[str, Any]] = field(default_factory=dict)
    fingerprint_problems: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def host_dir(self, host: str) -> Path:
        return self.path / "hosts" / host

    def trace_files(self) -> Iterator[tuple[AttemptKey, Path]]:
        """Every ``hosts/<host>/traces/<task>.<attempt>.jsonl``; sidecars and strays are skipped."""
        hosts_dir = self.path / "hosts"
        if not hosts_dir.is_dir():
            return
        for host_dir in sorted(p for p in hosts_dir.iterdir() if p.is_dir()):
            traces = host_dir / "traces"
            if not traces.is_dir():
                continue
            for trace in sorted(traces.glob("*.jsonl")):
                stem = trace.name[: -len(".jsonl")]
                task, _, attempt = stem.rpartition(".")
                if task and attempt.isdigit():
                    yield (host_dir.name, task, int(attempt)), trace

    def results(self) -> dict[AttemptKey, ResultRow]:
        """``results.jsonl`` rows by (host, task, attempt); a bad row is a problem, not a crash."""
        rows: dict[AttemptKey, ResultRow] = {}
        path = self.path / "results.jsonl"

        def problem(where: str, why: str) -> None:
            self.problems.append(f"{where}: {why}")

        for where, row in iter_jsonl(path, missing_ok=True, on_bad_line=problem):
            try:
                if not isinstance(row.get("task"), str):
                    raise ValueError("a row must be an object with a string 'task'")
                host = row.get("env", row.get("host"))
                if not isinstance(host, str):
                    raise ValueError("a row must name its host in 'env'")
                key = (host, row["task"], row_attempt(row, where))
                reason = row.get("reason")
                rows[key] = ResultRow(row_verdict(row, where), reason if isinstance(reason, str) else "")
            except (ValueError, InputError) as exc:
                problem(where, str(exc))
        return rows


def load_run(run_dir: Path) -> RunDir:
    manifest, problem = _load_json_object(run_dir / "manifest.json")
    if manifest is None:
        raise InputError(f"{problem}; is {run_dir} a crosshost run directory (runs/<run_id>/)?")

    suite = manifest.get("suite")
    suite_name = suite.get("name") if isinstance(suite, dict) else suite if isinstance(suite, str) else None
    suite_sha = suite.get("sha") if isinstance(suite, dict) else None

    host_meta: dict[str, dict[str, Any]] = {}
    raw_hosts = manifest.get("hosts")
    if isinstance(raw_hosts, dict):
        host_meta = {str(k): (v if isinstance(v, dict) else {}) for k, v in raw_hosts.items()}
    hosts = list(host_meta)
    inventory = manifest.get("inventory")
    if isinstance(inventory, dict):  # {"hosts": [...]} as well as a bare list
        inventory = inventory.get("hosts")
    if isinstance(inventory, list):
        for entry in inventory:
            name = entry.get("name") if isinstance(entry, dict) else None
            if isinstance(name, str) and name not in hosts:
                hosts.append(name)
    hosts_dir = run_dir / "hosts"
    if hosts_dir.is_dir():  # hosts with traces the manifest forgot still get analysed
        hosts += sorted(p.name for p in hosts_dir.iterdir() if p.is_dir() and p.name not in hosts)

    reference = manifest.get("reference")
    if not isinstance(reference, str) or not reference:
        reference = hosts[0] if hosts else None
    elif reference not in hosts:
        hosts.insert(0, reference)

    gate = _gate_of(manifest.get("gate"))
    if gate is None and isinstance(suite, dict):
        gate = _gate_of(suite.get("gate"))

    contract, contract_problem = _load_json_object(run_dir / "contract.json")
    run = RunDir(
        path=run_dir,
        manifest=manifest,
        run_id=str(manifest.get("run_id") or run_dir.name),
        suite_name=suite_name if isinstance(suite_name, str) else None,
        suite_sha=suite_sha if isinstance(suite_sha, str) else None,
        hosts=hosts,
        reference=reference,
        host_meta=host_meta,
        gate=gate,
        interrupted=bool(manifest.get("interrupted")),
        contract=contract,
        contract_problem=contract_problem,
    )
    tasks = manifest.get("tasks")
    if isinstance(tasks, list):
        run.tasks = [t for t in tasks if isinstance(t, str)]
    alpha = _alpha_of(manifest.get("alpha"))
    if alpha is None and isinstance(suite, dict):
        alpha = _alpha_of(suite.get("gate"))
    run.alpha = alpha if alpha is not None else DEFAULT_ALPHA
    sampled = manifest.get("sampled")
    if isinstance(sampled, list):
        run.sampled = {t for t in sampled if isinstance(t, str)}
    repeat = manifest.get("repeat")
    if isinstance(repeat, int) and not isinstance(repeat, bool) and repeat > 0:
        run.repeat = repeat
    for host in hosts:
        fingerprint, fp_problem = _load_json_object(run.host_dir(host) / "fingerprint.json")
        if fingerprint is not None:
            run.fingerprints[host] = fingerprint
        elif fp_problem is not None:
            run.fingerprint_problems[host] = fp_problem
    return run


def effective_gate(run: RunDir, gate: float | None) -> float:
    """``--gate`` wins, then the manifest's (the suite's) gate, then the default 0.10."""
    if gate is not None:
        return gate
    return run.gate if run.gate is not None else DEFAULT_GATE
