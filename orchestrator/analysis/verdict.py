"""The decision table of DESIGN: one classification and one action per task.

Precedence (highest first), because one task may show several observations at once:

1. ``infra_error``  any ``error`` verdict on any host: nothing else about the task can be trusted.
2. ``same_host``    no other host has a fingerprint different from the reference's: there was no
                    second machine, so a verdict difference cannot be attributed to the host.
3. ``flaky``        the attempts of one host disagree: the test must be fixed before a difference
                    between hosts means anything.
4. then each host whose fingerprint differs from the reference is compared with it (its attempts
   agree now, so each host has one verdict) and the worst pair wins:
   ``host_coupling`` (reference pass, other fail) > ``laptop_contamination`` (reference fail, other
   pass) > ``unstable_contract`` (same verdict, tool-call shapes differ; for two failures too,
   because failing in different ways is not "the same way") > ``honest_bug`` (both fail, same
   shapes) > ``agree`` (both pass, same shapes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from orchestrator.analysis.flips import flaky_hosts
from orchestrator.analysis.models import ACTIONS, PRECEDENCE


def same_fingerprint(a: str | None, b: str | None) -> bool:
    """Only two known, equal fingerprints are the same host; an unknown one is never assumed equal."""
    return a is not None and a == b


def pair_classification(reference: str, other: str, shapes_differ: bool) -> str:
    """Two hosts with consistent verdicts (``pass``/``fail``), the reference's first."""
    if reference == "pass" and other == "fail":
        return "host_coupling"
    if reference == "fail" and other == "pass":
        return "laptop_contamination"
    if shapes_differ:
        return "unstable_contract"
    return "agree" if reference == "pass" else "honest_bug"


def classify_task(
    verdicts: Mapping[str, Sequence[str]],
    reference: str,
    fingerprints: Mapping[str, str | None],
    shapes_differ: Mapping[str, bool],
) -> str:
    """The classification of one task; ``ACTIONS[classification]`` is what to do about it."""
    if any(not seq or "error" in seq for seq in verdicts.values()):
        return "infra_error"
    others = [
        h
        for h in verdicts
        if h != reference and not same_fingerprint(fingerprints.get(h), fingerprints.get(reference))
    ]
    if not others:
        return "same_host"
    if flaky_hosts(verdicts):
        return "flaky"
    ref_verdict = verdicts[reference][0]
    found = {pair_classification(ref_verdict, verdicts[h][0], shapes_differ.get(h, False)) for h in others}
    return next(c for c in PRECEDENCE if c in found)


def action_for(classification: str) -> str:
    return ACTIONS[classification]
