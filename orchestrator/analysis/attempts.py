"""One task attempt on one host, summarised from its trace in one streaming pass.

The summary keeps only what the verdicts need: the verdict, the pins, a hash of the shape, a hash of
the argument values, and capped lists of findings and problems. Turns are checked in small batches
against the contract and against EVERY host's fingerprint (a trace from box-b that holds the
reference's hostname is a leak too), so a million-line trace never sits in memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_runner.checker import check_turns
from agent_runner.errors import RunnerError
from agent_runner.trace import iter_records
from orchestrator.analysis.shapes import ShapeHasher, Step, step_of

CHECK_BATCH = 256  # turns handed to the checker at once
KEEP_FINDINGS = 20  # per attempt; the count is kept in full
KEEP_PROBLEMS = 10


@dataclass
class CheckFinding:
    kind: str
    step: int | None
    tool: str | None
    message: str
    is_leak: bool


@dataclass
class AttemptSummary:
    host: str
    task: str
    attempt: int
    path: Path | None
    verdict: str = "error"
    why: str = ""
    fingerprint: str | None = None
    pins: dict[str, Any] | None = None
    steps: int = 0
    shape_hash: str = ""
    values_hash: str = ""
    findings: list[CheckFinding] = field(default_factory=list)
    n_findings: int = 0
    n_leaks: int = 0
    problems: list[str] = field(default_factory=list)
    n_problems: int = 0

    @property
    def has_trace(self) -> bool:
        """A usable trace: read to the end without damage (its shape can be compared)."""
        return self.path is not None and self.n_problems == 0

    def problem(self, text: str) -> None:
        self.n_problems += 1
        if len(self.problems) < KEEP_PROBLEMS:
            self.problems.append(text)


def _check(
    summary: AttemptSummary,
    contract: Mapping[str, Any] | None,
    batch: list[dict[str, Any]],
    fingerprints: Sequence[Mapping[str, Any]],
) -> None:
    if contract is None or not batch:
        return
    for finding in check_turns(dict(contract), batch, [dict(f) for f in fingerprints]):
        summary.n_findings += 1
        summary.n_leaks += bool(finding.is_leak)
        if len(summary.findings) < KEEP_FINDINGS:
            summary.findings.append(
                CheckFinding(
                    kind=finding.kind,
                    step=finding.step,
                    tool=finding.tool,
                    message=finding.message,
                    is_leak=bool(finding.is_leak),
                )
            )


def summarise_trace(
    path: Path,
    host: str,
    task: str,
    attempt: int,
    contract: Mapping[str, Any] | None,
    fingerprints: Sequence[Mapping[str, Any]],
) -> AttemptSummary:
    """Stream one trace. Damage never raises: it is a problem and the attempt's verdict is ``error``."""
    summary = AttemptSummary(host, task, attempt, path)
    hasher = ShapeHasher()
    batch: list[dict[str, Any]] = []
    finish: dict[str, Any] | None = None
    try:
        for lineno, record in iter_records(path):
            kind = record.get("type")
            if kind == "corrupt":
                summary.problem(f"{path}:{lineno}: {record.get('error', 'corrupt line')}")
            elif kind == "header":
                fingerprint, pins = record.get("fingerprint"), record.get("pins")
                summary.fingerprint = fingerprint if isinstance(fingerprint, str) else None
                summary.pins = pins if isinstance(pins, dict) else None
            elif kind == "turn":
                step = step_of(record)
                if step is None:
                    summary.problem(f"{path}:{lineno}: turn without a tool name")
                    continue
                hasher.add(step)
                batch.append(record)
                if len(batch) >= CHECK_BATCH:
                    _check(summary, contract, batch, fingerprints)
                    batch = []
            elif kind == "finish":
                finish = record
            else:
                summary.problem(f"{path}:{lineno}: unknown record type {kind!r}")
    except (RunnerError, OSError) as exc:  # unreadable file: agent_runner's TraceError
        summary.problem(str(exc))
    _check(summary, contract, batch, fingerprints)
    summary.steps = hasher.steps
    summary.shape_hash = hasher.shape_hash
    summary.values_hash = hasher.values_hash

    if summary.n_problems:
        summary.verdict, summary.why = "error", f"damaged trace: {summary.problems[0]}"
    elif finish is None:
        summary.verdict, summary.why = "error", f"{path}: no finish record (the attempt was cut short)"
    elif finish.get("verdict") not in ("pass", "fail", "error"):
        summary.verdict = "error"
        summary.why = f"{path}: finish verdict {finish.get('verdict')!r} is not pass, fail or error"
    else:
        summary.verdict = str(finish["verdict"])
        why = finish.get("why")
        summary.why = why if isinstance(why, str) else ""
        if summary.verdict == "pass" and summary.n_findings:
            # pass needs a clean contract check, and ours sees every host's fingerprint
            first = summary.findings[0]
            summary.verdict = "fail"
            summary.why = f"checker: {first.kind} at step {first.step}: {first.message}"
    return summary


def iter_steps(path: Path) -> Iterator[Step]:
    """The shape steps of one trace, re-read on demand (for the diff of one task only)."""
    for _, record in iter_records(path):
        if record.get("type") == "turn":
            step = step_of(record)
            if step is not None:
                yield step
