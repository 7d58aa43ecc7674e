"""Cross-host leak evidence: the same step on two hosts, differing exactly by each host's own facts.

The checker judges one argument string at a time. Some leaks only show side by side: a generic host
name (``vm`` in "record-for-vm") proves nothing alone, and neither does a home or working directory
joined into an identifier ("tmp-crosshost-ws-t.0.x7-work") or URL-encoded. But when the same step of
the same attempt on another host carries that host's own name or directory in the same place, and
nothing else differs, the agent copied the host's fact into its call: a leak (rule ``cross_host``).
A weak finding (a generic host name) with such evidence becomes a leak; without it, it stays weak.

Only traces whose argument values differ (``values_hash``) are read again, pairwise and streamed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from agent_runner.checker import INVARIANT_KIND, arg_strings, host_dir, host_names, quote_evidence
from agent_runner.records import Fingerprint
from orchestrator.analysis.attempts import AttemptSummary, CheckFinding, iter_turns_by_value, record_finding
from orchestrator.store.rundir import AttemptKey

#: steps of a pair of traces searched for evidence, beyond which only a weak finding's step is sought
MAX_EVIDENCE_STEPS = 20_000
_MEMO_LIMIT = 4096
# what each fact is called in findings, and the leak kind (invariant) that covers it
_KIND_OF = {"hostname": "hostname", "home directory": "home_directory", "working directory": "absolute_local_path"}
_ALNUM_BEFORE, _ALNUM_AFTER = r"(?<![A-Za-z0-9])", r"(?![A-Za-z0-9])"


def _path_forms(path: str) -> set[str]:
    """A directory as a path, without its leading slash, joined by ``-``, ``_`` or ``.``, URL-encoded."""
    bare = path.strip("/")
    forms = {path, bare, quote(path, safe=""), quote(path, safe="").replace("%2F", "%2f")}
    forms |= {bare.replace("/", sep) for sep in "-_."}
    return {f for f in forms if len(f) > 1}


@dataclass
class _Normaliser:
    """One attempt's facts as patterns, longest first: each match becomes a placeholder for its fact."""

    patterns: list[tuple[re.Pattern[str], str]]
    memo: dict[str, str] = field(default_factory=dict)

    def text(self, value: str) -> str:
        done = self.memo.get(value)
        if done is None:
            done = value
            for pattern, label in self.patterns:
                done = pattern.sub(f"\0{label}\0", done)
            if len(self.memo) >= _MEMO_LIMIT:
                self.memo.clear()
            self.memo[value] = done
        return done

    def tree(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.tree(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.tree(v) for v in value]
        return value


def _normaliser(fingerprint: Fingerprint | None, dirs: Mapping[str, str], kinds: set[str]) -> _Normaliser:
    facts: list[tuple[str, str]] = []  # (form, label)
    if "hostname" in kinds and fingerprint is not None:
        facts += [(name, "hostname") for name in host_names(fingerprint.hostname)]
    paths: list[tuple[Any, str]] = []
    if "home_directory" in kinds:
        paths += [(fingerprint.home if fingerprint else None, "home directory"), (dirs.get("home"), "home directory")]
    if "absolute_local_path" in kinds:
        paths += [(fingerprint.cwd if fingerprint else None, "working directory")]
        paths += [(dirs.get(k), "working directory") for k in ("attempt", "cwd", "tmp")]
    for value, label in paths:
        path = host_dir(value)
        if path is not None:
            facts += [(form, label) for form in _path_forms(path)]
    # longest first: a hostname inside a working directory is the directory's
    facts.sort(key=lambda f: -len(f[0]))
    flags = {"hostname": re.IGNORECASE}
    return _Normaliser(
        [(re.compile(_ALNUM_BEFORE + re.escape(form) + _ALNUM_AFTER, flags.get(label, 0)), label) for form, label in facts]
    )


@dataclass
class _Evidence:
    labels: list[str]  # the facts that make up the difference
    where: str  # the first differing argument
    mine: str
    theirs: str


def _explained(args: Any, other_args: Any, mine: _Normaliser, theirs: _Normaliser) -> _Evidence | None:
    """Evidence when two calls' arguments are the same once each host's own facts are set aside."""
    normal, other_normal = mine.tree(args), theirs.tree(other_args)
    if normal != other_normal:
        return None
    labels: list[str] = []
    first: tuple[str, str, str] | None = None
    pairs = zip(*(arg_strings(v, sort_keys=True) for v in (args, other_args, normal)), strict=True)
    for (where, a), (_, b), (_, n) in pairs:
        if a != b:
            first = first or (where, a, b)
            labels += [label for label in _KIND_OF if f"\0{label}\0" in n and label not in labels]
    if first is None or not labels:
        return None
    return _Evidence(labels, *first)


def _add(summary: AttemptSummary, step: int | None, tool: str, label: str, ev: _Evidence, other: str, host: str) -> bool:
    """Record a cross-host leak at ``step`` unless one of its kind is there; a weak one is promoted."""
    kind = _KIND_OF[label]
    if any(f.step == step and f.kind == kind for f in summary.findings):
        return False
    promoted = next((f for f in summary.weak if f.step == step and f.kind == kind), None)
    if promoted is not None:
        summary.weak.remove(promoted)
    message = promoted.message if promoted is not None else f"{host}'s own {label} in an argument"
    evidence = (
        f"{quote_evidence(ev.where, ev.mine)} here and {quote_evidence(ev.where, ev.theirs)} at the same step on "
        f"{other}: the same call but for each host's own {' and '.join(ev.labels)}"
    )
    record_finding(summary, CheckFinding(
        kind=kind, step=step, tool=tool, message=message, is_leak=True, rule="cross_host", evidence=evidence,
    ))  # fmt: skip
    return True


def _last_weak_step(summary: AttemptSummary) -> int:
    return max((f.step for f in summary.weak if isinstance(f.step, int)), default=0)


def _compare(a: AttemptSummary, b: AttemptSummary, norm_a: _Normaliser, norm_b: _Normaliser) -> list[AttemptSummary]:
    """Look for evidence in one pair of traces; returns the summaries that gained a leak."""
    assert a.path is not None and b.path is not None
    horizon = max(MAX_EVIDENCE_STEPS, _last_weak_step(a), _last_weak_step(b))
    gained: list[AttemptSummary] = []
    for count, ((fp_a, turn_a), (fp_b, turn_b)) in enumerate(
        zip(iter_turns_by_value(a.path), iter_turns_by_value(b.path), strict=False), 1
    ):
        if count > horizon:
            break
        if fp_a == fp_b or turn_a.get("tool") != turn_b.get("tool"):
            continue
        ev = _explained(turn_a.get("args"), turn_b.get("args"), norm_a, norm_b)
        if ev is None:
            continue
        tool = str(turn_a.get("tool"))
        mirrored = _Evidence(ev.labels, ev.where, ev.theirs, ev.mine)
        for label in ev.labels:
            for summary, step, evidence, other in (
                (a, turn_a.get("step"), ev, b.host), (b, turn_b.get("step"), mirrored, a.host)
            ):
                if _add(summary, step if isinstance(step, int) else None, tool, label, evidence, other, summary.host):
                    gained.append(summary)
    return gained


def cross_host_leaks(
    summaries: Mapping[AttemptKey, AttemptSummary],
    fingerprints: Mapping[str, Fingerprint],
    contract: Mapping[str, Any] | None,
    hosts: Sequence[str],
    reference: str,
) -> None:
    """Add ``cross_host`` leaks to the summaries (promoting weak findings), and fail a ``pass`` that
    gains one, as the checker's own findings do. Each host is compared with the reference attempt by
    attempt; a host whose weak findings the reference does not settle is compared with the others."""
    raw = contract.get("invariants", []) if contract is not None else []
    kinds = {INVARIANT_KIND[i] for i in raw if isinstance(i, str) and i in INVARIANT_KIND}
    if not kinds:
        return
    order = {h: i for i, h in enumerate(hosts)}
    groups: dict[tuple[str, int], list[AttemptSummary]] = {}
    for (_, task, attempt), summary in summaries.items():
        if summary.has_trace:
            groups.setdefault((task, attempt), []).append(summary)
    normalisers: dict[tuple[str, str, int], _Normaliser] = {}

    def norm(s: AttemptSummary) -> _Normaliser:
        key = (s.host, s.task, s.attempt)
        if key not in normalisers:
            normalisers[key] = _normaliser(fingerprints.get(s.host), s.dirs, kinds)
        return normalisers[key]

    for group in groups.values():
        group.sort(key=lambda s: (s.host != reference, order.get(s.host, len(order))))
        gained: list[AttemptSummary] = []
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                if a.values_hash == b.values_hash:
                    continue
                if a.host != reference and not (a.weak or b.weak):
                    continue  # beyond the reference, only to settle a weak finding
                gained += _compare(a, b, norm(a), norm(b))
        for s in gained:
            first = next((f for f in s.findings if f.is_leak), None)
            if s.verdict == "pass" and first is not None:
                s.verdict, s.why = "fail", f"checker: {first.kind} at step {first.step}: {first.message}"
