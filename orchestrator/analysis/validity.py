"""Whether a run is valid: every reason it is not, in the order of the validity rule
(docs/verdicts.md), and the facts the report lists beside them (burn findings, files outside the
workspace, hosts that are one machine)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agent_runner.wire import REFUSED_API
from orchestrator.analysis.attempts import AttemptSummary
from orchestrator.analysis.attribution import cut_words, leaf_text
from orchestrator.analysis.models import BurnFinding, OutsideWorkspace
from orchestrator.analysis.verdict import same_fingerprint, same_host
from orchestrator.dotted import flatten
from orchestrator.store.rundir import AttemptKey, Run

MAX_LEAK_EXAMPLES = 1  # the rest are in each task's leaks
#: a leak's message in the validity reason: room for a long workspace path, whose end is the evidence
MAX_LEAK_MESSAGE = 400


def _flat_pins(pins: Mapping[str, Any]) -> dict[str, str]:
    return {key: leaf_text(leaf) for key, leaf in flatten(dict(pins)).items()}


def _pins_text(pins: Mapping[str, Any]) -> str:
    """Pins as JSON with sorted keys: equal texts flatten equal (``1``, ``1.0`` and ``true`` stay apart)."""
    return json.dumps(pins, sort_keys=True)


def burn_findings(run: Run) -> list[BurnFinding]:
    """The ``burn`` isolation findings of every host's fingerprint, in host order."""
    found: list[BurnFinding] = []
    for host in run.hosts:
        fingerprint = run.fingerprints.get(host)
        entries = fingerprint.findings if fingerprint is not None else None
        for f in entries if isinstance(entries, list) else []:
            if isinstance(f, dict) and f.get("action") == "burn":
                found.append(
                    BurnFinding(
                        host=host, kind=str(f.get("kind") or "?"), detail=str(f.get("detail") or ""),
                        meaning=str(f.get("meaning") or ""),
                    )  # fmt: skip
                )
    return found


def outside_workspace(summaries: Mapping[AttemptKey, AttemptSummary]) -> list[OutsideWorkspace]:
    """Every attempt whose files were found outside its workspace, in host, task, attempt order."""
    return [
        OutsideWorkspace(host=h, task=t, attempt=a, paths=s.outside_workspace, count=s.n_outside_workspace)
        for (h, t, a), s in sorted(summaries.items())
        if s.n_outside_workspace
    ]


def burn_reasons(burn: list[BurnFinding]) -> list[str]:
    by_host: dict[str, list[BurnFinding]] = {}
    for f in burn:
        by_host.setdefault(f.host, []).append(f)
    return [
        f"isolation: {host} has {len(found)} burn finding(s) ([gate] burn_invalidates): "
        + "; ".join(f"{f.kind} ({f.detail})" for f in found)
        for host, found in by_host.items()
    ]


def invalid_reasons(
    run: Run,
    summaries: Mapping[AttemptKey, AttemptSummary],
    tasks: list[str],
    reference: str,
    fp_ids: Mapping[str, str | None],
    machines: Mapping[str, str | None],
) -> list[str]:
    """Every reason the run is not valid, in the order of the validity rule; empty means valid."""
    reasons: list[str] = []
    if run.manifest.interrupted:
        reasons.append("run interrupted: not every host finished")
    for host in run.hosts:
        if host not in run.fingerprints:
            why = run.fingerprint_problems.get(host, "missing")
            reasons.append(f"fingerprint not stored for {host}: {why}")
    if run.contract is None:
        reasons.append(f"contract not stored: {run.contract_problem}")

    replayed = [h for h in run.hosts if any(s.path is not None for k, s in summaries.items() if k[0] == h)]
    if len(replayed) < 2:
        reasons.append(f"fewer than two hosts replayed ({', '.join(replayed) or 'none'})")
    else:
        distinct = [h for h in replayed if not any(same_host(h, g, fp_ids, machines) for g in replayed if g < h)]
        if len(distinct) < 2:
            same = ", ".join(h for h in replayed if h != replayed[0])
            if all(same_fingerprint(machines.get(h), machines.get(replayed[0])) for h in replayed):
                reasons.append(
                    f"no two replayed hosts are different machines ({same} the same machine as {replayed[0]})"
                )
            else:
                reasons.append(f"no two replayed hosts have different fingerprints ({same} same as {replayed[0]})")

    reasons.extend(_pin_reasons(run, summaries, tasks, reference))

    for host in run.hosts:
        leaks = [(k, s) for k, s in summaries.items() if k[0] == host and s.n_leaks]
        if not leaks:
            continue
        total = sum(s.n_leaks for _, s in leaks)
        examples: list[str] = []
        for (_, task, attempt), s in leaks:
            for f in s.findings:
                if f.is_leak and len(examples) < MAX_LEAK_EXAMPLES:
                    message = cut_words(f.message, MAX_LEAK_MESSAGE)
                    examples.append(f"{task}.{attempt} step {f.step}: {f.kind} [{f.rule}]: {message}")
        reasons.append(f"host leakage: {total} finding(s) in traces from {host} (first: {'; '.join(examples)})")
    for host in run.hosts:
        refused = [s for k, s in summaries.items() if k[0] == host and s.verdict == "error"
                   and s.why.startswith(REFUSED_API)]
        if refused:
            reasons.append(f"model API refused on {host}: {len(refused)} attempt(s) never reached the model "
                           f"({cut_words(refused[0].why, MAX_LEAK_MESSAGE)})")
    return reasons


def same_machine_notes(hosts: list[str], machines: Mapping[str, str | None]) -> list[str]:
    """One note for each host that is an earlier host's machine under another inventory name (their
    fingerprints may differ: another workspace_root, another user)."""
    notes = []
    for i, host in enumerate(hosts):
        first = next((g for g in hosts[:i] if same_fingerprint(machines.get(host), machines.get(g))), None)
        if first is not None:
            notes.append(
                f"{host} is the same machine as {first} (equal machine identities): compared with each "
                "other they are same_host, a difference between them is not the host's"
            )
    return notes


def _pin_reasons(
    run: Run, summaries: Mapping[AttemptKey, AttemptSummary], tasks: list[str], reference: str
) -> list[str]:
    """``pins differ: <pin> on <host>`` for each pin a host ran with a value other than the reference's."""
    differing: dict[tuple[str, str], list[str]] = {}  # (host, pin) -> tasks
    by_task: dict[str, list[AttemptSummary]] = {}
    for (_, task, _), s in summaries.items():
        if s.pins is not None:
            by_task.setdefault(task, []).append(s)
    for task in tasks:
        seq = sorted(by_task.get(task, []), key=lambda s: (s.host != reference, s.attempt))
        if not seq:
            continue
        base, base_text = _flat_pins(seq[0].pins or {}), _pins_text(seq[0].pins or {})
        for s in seq[1:]:
            if _pins_text(s.pins or {}) == base_text:  # the same JSON: no pin can differ
                continue
            pins = _flat_pins(s.pins or {})
            for pin in sorted(base.keys() | pins.keys()):
                if base.get(pin) != pins.get(pin):
                    tasks_of = differing.setdefault((s.host, pin), [])
                    if task not in tasks_of:
                        tasks_of.append(task)
    order = {h: i for i, h in enumerate(run.hosts)}
    return [
        f"pins differ: {pin} on {host} (tasks: {', '.join(tasks_of)})"
        for (host, pin), tasks_of in sorted(
            differing.items(), key=lambda kv: (order.get(kv[0][0], 0), kv[0][1])
        )
    ]
