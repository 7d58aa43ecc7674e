"""Build run directories (``runs/<run_id>/``) for the analysis tests, through the runner's records, so
a test cannot write a trace, results row or fingerprint the product never writes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_runner.recordclass import replace
from agent_runner.records import Fingerprint, ResultRow, TraceFinish, TraceHeader, TraceTurn
from agent_runner.trace import fp
from orchestrator.store.records import HostRecord, Manifest, SuiteRef
from orchestrator.store.rundir import RunDir

CONTRACT: dict[str, Any] = {
    "contract_id": "test.v1",
    "tools": [
        {"name": "read_unit_status", "required_args": ["unit"]},
        {"name": "http_get_health", "required_args": ["url"]},
        {"name": "restart_unit", "required_args": ["unit"], "forbidden_args": ["ssh_identity"]},
    ],
    "invariants": ["no_absolute_local_paths", "no_home_directory_strings", "no_hostname_in_tool_args"],
}

PINS: dict[str, Any] = {
    "prompt_sha": "p" * 12,
    "tools_sha": "t" * 12,
    "predicate_sha": "d" * 12,
    "contract_sha": "c" * 12,
    "runner_source_sha": "r" * 12,
    "budget": {"max_steps": 8, "max_bytes": 32768, "timeout_s": 120},
}


def fingerprint(host: str, fid: str, **changes: Any) -> Fingerprint:
    """A fingerprint as the runner collects it on ``host`` (digest ``fid``); ``changes`` replace fields."""
    fpr = Fingerprint(
        fingerprint=fid,
        hostname=host,
        platform="Linux-6.1.0-x86_64-with-glibc2.36",
        machine="x86_64",
        python="CPython 3.11.2",
        python_executable="/usr/bin/python3",
        home="/root",
        cwd=f"/tmp/crosshost/{host}-ws",
        cwd_exists=True,
        user_home_in_cwd=False,
        env_keys=["LANG", "PATH", "TZ"],
        has_local_dotenv=False,
        cpu_count=2,
        locale={"LANG": "C.UTF-8", "LC_ALL": None, "preferred_encoding": "UTF-8", "resolved": "C.UTF-8"},
        tz={"TZ": "UTC", "tzname": ["UTC", "UTC"], "utc_offset_s": 0},
        uid=0,
        captured_at="2025-01-01T00:00:00Z",
    )
    return replace(fpr, **changes)


HEALTHY = [("read_unit_status", {"unit": "nginx.service"}), ("restart_unit", {"unit": "nginx.service"})]


@dataclass
class Attempt:
    verdict: str = "pass"
    calls: Sequence[tuple[str, dict[str, Any]]] = tuple(HEALTHY)
    pins: dict[str, Any] | None = None
    raw_lines: list[str] | None = None  # replaces the generated trace text entirely
    why: str = ""
    predicate_output: str | None = None
    answers: Sequence[str] | None = None  # what the tool answered per call (default "ok")
    dirs: dict[str, str] | None = None  # the header's ``dirs``: the attempt's own directories on its host
    findings: list[dict[str, Any]] | None = None  # the runner's findings in the finish record


@dataclass
class RunSpec:
    hosts: dict[str, Fingerprint | None]  # name -> fingerprint.json (None: not stored)
    attempts: dict[tuple[str, str, int], Attempt] = field(default_factory=dict)
    contract: dict[str, Any] | None = field(default_factory=lambda: dict(CONTRACT))
    gate: float | None = 0.10
    manifest_extra: dict[str, Any] = field(default_factory=dict)
    host_meta: dict[str, dict[str, Any]] = field(default_factory=dict)


def trace_lines(run_id: str, host: str, task: str, attempt: int, fid: str, a: Attempt) -> list[str]:
    header = TraceHeader(
        run_id=run_id, host=host, task=task, attempt=attempt, fingerprint=fid,
        pins=a.pins if a.pins is not None else PINS, env_sha=fid, agent="scripted",
        extra={"dirs": a.dirs} if a.dirs is not None else {},
    )  # fmt: skip
    lines = [json.dumps(header.to_json())]
    for step, (tool, args) in enumerate(a.calls, 1):
        answer = a.answers[step - 1] if a.answers is not None else "ok"
        turn = TraceTurn(step=step, tool=tool, args=args, args_fp=fp(args), obs_fp=fp(answer), latency_ms=1)
        lines.append(json.dumps(turn.to_json()))
    finish = TraceFinish(
        reason="stop", final=f"done on {host}", predicate_exit=0 if a.verdict == "pass" else 1,
        verdict=a.verdict, why=a.why or a.verdict, wall_ms=5, steps=len(a.calls), findings=a.findings or [],
        predicate_output=a.predicate_output,
    )  # fmt: skip
    lines.append(json.dumps(finish.to_json()))
    return lines


def build_run(root: Path, spec: RunSpec, run_id: str = "20250101T000000Z-abcdef") -> Path:
    rd = RunDir.create(root, run_id)
    hosts_meta: dict[str, dict[str, Any]] = {}
    for name, fpr in spec.hosts.items():
        meta = {"reachable": True, "error": None, "fingerprint": fpr.fingerprint if fpr else None}
        meta.update(spec.host_meta.get(name, {}))
        hosts_meta[name] = meta
        (rd.host_dir(name) / "traces").mkdir(parents=True)
        if fpr is not None:
            rd.write_fingerprint(name, fpr)
    tasks = sorted({k[1] for k in spec.attempts})
    manifest = Manifest(
        run_id=run_id,
        started="2025-01-01T00:00:00Z",
        finished="2025-01-01T00:01:00Z",
        suite=SuiteRef(name="triage", sha="s" * 16, path="suite"),
        gate=spec.gate,
        tasks=tasks,
        repeat=max((k[2] + 1 for k in spec.attempts), default=1),
        reference=next(iter(spec.hosts)),
        crosshost_version="0.1.0",
        hosts={name: HostRecord.model_validate(meta) for name, meta in hosts_meta.items()},
    )
    manifest = manifest.model_copy(update=spec.manifest_extra)
    rd.write_manifest(manifest)
    if spec.contract is not None:
        rd.write_contract(json.dumps(spec.contract).encode())
    rows: list[ResultRow] = []
    for (host, task, attempt), a in spec.attempts.items():
        fpr = spec.hosts.get(host)
        fid = fpr.fingerprint or "" if fpr else "0" * 16
        lines = a.raw_lines if a.raw_lines is not None else trace_lines(run_id, host, task, attempt, fid, a)
        rd.trace_path(host, task, attempt).write_text("\n".join(lines) + "\n")
        row = ResultRow(
            task=task, env=host, attempt=attempt, verdict=a.verdict, run_id=run_id, env_sha=fid,
            reason="agent_error" if a.verdict == "error" else "stop",
            exit_code=0 if a.verdict == "pass" else 1, wall_ms=5, fingerprint=fid, why=a.why or a.verdict,
        )  # fmt: skip
        rows.append(row)
    rd.write_results(rows)
    return rd.path


def two_hosts() -> dict[str, Fingerprint | None]:
    return {
        "local": fingerprint("devbox-ref", "a" * 16),
        "box-b": fingerprint("box-b", "b" * 16, python="CPython 3.11.9"),
    }
