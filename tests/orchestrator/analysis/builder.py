"""Build run directories (``runs/<run_id>/``) in the DESIGN format for the analysis tests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_runner.trace import fp

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
    "runner_sha": "r" * 12,
    "budget": {"max_steps": 8, "max_bytes": 32768, "timeout_s": 120},
}


def fingerprint(host: str, fid: str, **extra: Any) -> dict[str, Any]:
    fpr: dict[str, Any] = {
        "id": fid,
        "hostname": host,
        "home": "/root",
        "cwd": f"/tmp/crosshost/{host}-ws",
        "python": {"version": "3.11.2", "implementation": "CPython"},
        "locale": "C.UTF-8",
        "env": {"TZ": "UTC", "LANG": "C.UTF-8"},
    }
    fpr.update(extra)
    return fpr


HEALTHY = [("read_unit_status", {"unit": "nginx.service"}), ("restart_unit", {"unit": "nginx.service"})]


@dataclass
class Attempt:
    verdict: str = "pass"
    calls: Sequence[tuple[str, dict[str, Any]]] = tuple(HEALTHY)
    pins: dict[str, Any] | None = None
    raw_lines: list[str] | None = None  # replaces the generated trace text entirely
    why: str = ""


@dataclass
class RunSpec:
    hosts: dict[str, dict[str, Any] | None]  # name -> fingerprint.json (None: not stored)
    attempts: dict[tuple[str, str, int], Attempt] = field(default_factory=dict)
    contract: dict[str, Any] | None = field(default_factory=lambda: dict(CONTRACT))
    gate: float | None = 0.10
    manifest_extra: dict[str, Any] = field(default_factory=dict)
    host_meta: dict[str, dict[str, Any]] = field(default_factory=dict)


def trace_lines(run_id: str, host: str, task: str, attempt: int, fid: str, a: Attempt) -> list[str]:
    header = {
        "type": "header",
        "schema": "crosshost.trace/1",
        "run_id": run_id,
        "host": host,
        "task": task,
        "attempt": attempt,
        "fingerprint": fid,
        "pins": a.pins if a.pins is not None else PINS,
    }
    lines = [json.dumps(header)]
    for step, (tool, args) in enumerate(a.calls, 1):
        lines.append(
            json.dumps(
                {
                    "type": "turn",
                    "step": step,
                    "role": "assistant",
                    "tool": tool,
                    "args": args,
                    "args_fp": fp(args),
                    "obs_fp": fp("ok"),
                    "error": None,
                    "prompt_tokens": 0,
                    "completion_tokens": 0,
                    "latency_ms": 1,
                    "reason": "tool_calls",
                }
            )
        )
    lines.append(
        json.dumps(
            {
                "type": "finish",
                "reason": "stop",
                "final": f"done on {host}",
                "predicate_exit": 0 if a.verdict == "pass" else 1,
                "verdict": a.verdict,
                "why": a.why or a.verdict,
                "wall_ms": 5,
            }
        )
    )
    return lines


def build_run(root: Path, spec: RunSpec, run_id: str = "20250101T000000Z-abcdef") -> Path:
    run = root / run_id
    run.mkdir(parents=True)
    hosts_meta = {}
    for name, fpr in spec.hosts.items():
        meta = {"reachable": True, "error": None, "fingerprint": fpr["id"] if fpr else None}
        meta.update(spec.host_meta.get(name, {}))
        hosts_meta[name] = meta
        (run / "hosts" / name / "traces").mkdir(parents=True)
        if fpr is not None:
            (run / "hosts" / name / "fingerprint.json").write_text(json.dumps(fpr))
    tasks = sorted({k[1] for k in spec.attempts})
    manifest = {
        "schema": "crosshost.manifest/1",
        "run_id": run_id,
        "kind": "replay",
        "started": "2025-01-01T00:00:00Z",
        "finished": "2025-01-01T00:01:00Z",
        "suite": {"name": "triage", "sha": "s" * 16, "path": "suite"},
        "gate": spec.gate,
        "tasks": tasks,
        "reference": next(iter(spec.hosts)),
        "hosts": hosts_meta,
        "crosshost_version": "0.1.0",
        "retries": [],
        "interrupted": False,
    }
    manifest.update(spec.manifest_extra)
    (run / "manifest.json").write_text(json.dumps(manifest))
    if spec.contract is not None:
        (run / "contract.json").write_text(json.dumps(spec.contract))
    rows = []
    for (host, task, attempt), a in spec.attempts.items():
        fpr = spec.hosts.get(host)
        fid = fpr["id"] if fpr else "0" * 16
        lines = a.raw_lines if a.raw_lines is not None else trace_lines(run_id, host, task, attempt, fid, a)
        (run / "hosts" / host / "traces" / f"{task}.{attempt}.jsonl").write_text("\n".join(lines) + "\n")
        rows.append(
            {
                "run_id": run_id,
                "task": task,
                "env": host,
                "env_sha": fid,
                "attempt": attempt,
                "exit_code": 0 if a.verdict == "pass" else 1,
                "passed": a.verdict == "pass",
                "wall_ms": 5,
                "verdict": a.verdict,
                "reason": a.why,
                "fingerprint": fid,
            }
        )
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def two_hosts() -> dict[str, dict[str, Any] | None]:
    return {
        "local": fingerprint("devbox-ref", "a" * 16),
        "box-b": fingerprint("box-b", "b" * 16, python={"version": "3.11.9", "implementation": "CPython"}),
    }
