"""The decision table (docs/verdicts.md): one classification and one action per task.

Precedence (highest first), because one task may show several observations at once:

1. ``infra_error``  any ``error`` verdict on any host: nothing else about the task can be trusted.
2. ``same_host``    every other host is the reference's host: the same fingerprint, or the same
                    machine under another inventory name (equal machine identities): there was no
                    second machine, so a verdict difference cannot be attributed to the host.
3. On deterministic evidence (see ``flips.task_flip``), each host whose fingerprint differs from the
   reference is compared with it (its attempts agree, so each host has one verdict) and the worst
   pair wins: ``host_coupling`` (reference pass, other fail) > ``laptop_contamination`` (reference
   fail, other pass) > ``unstable_contract`` (same verdict, tool-call shapes differ; for two failures
   too, because failing in different ways is not "the same way") > ``honest_bug`` (both fail, same
   shapes) > ``agree`` (both pass, same shapes).
4. On statistical evidence (attempts vary within a host, or the agent is sampled):
   ``host_coupling`` / ``laptop_contamination`` when a host's pass count differs from the
   reference's at p < alpha (the reference passing more often is host coupling); else
   ``underpowered`` when the agent is sampled, the pass rates differ, and these attempt counts could
   not reach alpha whatever they showed (one attempt per host, or three: its action names the
   attempts per host a difference of the observed size needs); else ``flaky`` when a host's attempts disagree
   with each other; else (every attempt of every host the same verdict) the pair rows of 3.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.analysis.flips import DETERMINISTIC, HELD, TaskFlip, flaky_hosts
from orchestrator.analysis.models import ACTIONS, PRECEDENCE
from orchestrator.analysis.stats import DEFAULT_ALPHA, first_decisive_repeat, min_p_value, needed_repeat


@dataclass
class Decision:
    classification: str
    needed_repeat: int | None = None  # for ``underpowered``: attempts per host that could settle it

    @property
    def action(self) -> str:
        return action_for(self.classification, self.needed_repeat)


def same_fingerprint(a: str | None, b: str | None) -> bool:
    """Only two known, equal fingerprints are the same host; an unknown one is never assumed equal."""
    return a is not None and a == b


def same_host(
    a: str, b: str, fingerprints: Mapping[str, str | None], machines: Mapping[str, str | None] | None = None
) -> bool:
    """Hosts ``a`` and ``b`` are one: equal fingerprints, or equal machine identities (one machine
    under two inventory names, whatever its working directories or users). ``machines`` holds only
    identities that can say so (``Fingerprint.same_machine_key``)."""
    if same_fingerprint(fingerprints.get(a), fingerprints.get(b)):
        return True
    return machines is not None and same_fingerprint(machines.get(a), machines.get(b))


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
    flip: TaskFlip,
    *,
    alpha: float = DEFAULT_ALPHA,
    sampled: bool = False,
    machines: Mapping[str, str | None] | None = None,
) -> Decision:
    """The classification of one task (and, when underpowered, the attempts that could settle it);
    ``machines``: each host's machine identity (``same_host``)."""
    if any(not seq or "error" in seq for seq in verdicts.values()):
        return Decision("infra_error")
    others = [h for h in verdicts if h != reference and not same_host(h, reference, fingerprints, machines)]
    if not others:
        return Decision("same_host")
    if flip.evidence == DETERMINISTIC:  # every host's attempts agree: one verdict a host
        return Decision(_worst_pair(verdicts, reference, others, shapes_differ))
    if flip.evidence == HELD:  # attempt i paired again: the host's effect, even where attempts vary
        differing = [h for h in others if h in flip.flipped_hosts]
        if differing:
            ref_seq = verdicts[reference]
            coupled = any(
                r == "pass" and v == "fail" for h in differing for r, v in zip(ref_seq, verdicts[h], strict=False)
            )
            return Decision("host_coupling" if coupled else "laptop_contamination")
        if flaky_hosts(verdicts):
            return Decision("flaky")
        return Decision(_worst_pair(verdicts, reference, others, shapes_differ))
    ref = flip.counts[reference]
    differing = [h for h in others if h in flip.flipped_hosts]
    if differing:
        ref_rate = ref.passes / ref.n
        coupled = any(flip.counts[h].passes / flip.counts[h].n < ref_rate for h in differing)
        return Decision("host_coupling" if coupled else "laptop_contamination")
    if sampled:
        needed = undecided_repeat(flip, reference, others, alpha)
        if needed is not None:
            return Decision("underpowered", needed)
        if flaky_hosts(verdicts):  # the agent draws, the same on every host as far as alpha can tell
            return Decision("sampled_noise")
    if flaky_hosts(verdicts):
        return Decision("flaky")
    return Decision(_worst_pair(verdicts, reference, others, shapes_differ))


#: attempts per host after which one verdict everywhere (all pass or all fail on every host) settles a
#: sampled task: a 90%/10% host difference looks like that at 2 attempts in under 2% of runs
QUIET_AFTER = 2


def undecided_repeat(flip: TaskFlip, reference: str, others: Sequence[str], alpha: float) -> int | None:
    """The attempts per host that could settle a sampled task these attempts do not, or None when it
    is settled: it differs, shows one verdict everywhere on ``QUIET_AFTER`` attempts a host, or every
    compared host's attempt count could have reached ``alpha`` (what they showed is the answer)."""
    if flip.flip:
        return None
    ref = flip.counts[reference]
    compared = [flip.counts[h] for h in others]
    counted = [ref, *compared]
    constant = all(c.n for c in counted) and (
        all(c.passes == c.n for c in counted) or all(c.passes == 0 for c in counted)
    )
    if constant and min(c.n for c in counted) >= QUIET_AFTER:
        return None
    needed = [
        n
        for c in compared
        if min_p_value(ref.n, c.n) >= alpha
        and (n := _needed(ref.rate, c.rate, alpha, max(ref.n, c.n))) is not None
    ]
    if needed:  # the largest observed difference needs the fewest attempts: settle that one first
        return min(needed)
    if ref.n and all(c.n for c in compared) and any(min_p_value(ref.n, c.n) >= alpha for c in compared):
        # nothing differs yet, and nothing could have: one verdict everywhere settles at QUIET_AFTER
        return QUIET_AFTER if constant else first_decisive_repeat(alpha)
    return None


def _needed(ref_rate: float | None, rate: float | None, alpha: float, start: int) -> int | None:
    if ref_rate is None or rate is None:
        return None
    return needed_repeat(ref_rate, rate, alpha, start=start)


def _worst_pair(
    verdicts: Mapping[str, Sequence[str]], reference: str, others: list[str], shapes_differ: Mapping[str, bool]
) -> str:
    ref_verdict = verdicts[reference][0]
    found = {pair_classification(ref_verdict, verdicts[h][0], shapes_differ.get(h, False)) for h in others}
    return next(c for c in PRECEDENCE if c in found)


#: contract findings that are the agent's own call (a leak is too): the agent's author must act
AGENT_CALL_KINDS = frozenset({"forbidden_args", "missing_args", "unknown_tool"})
FIX_AGENT_CALL = "fix the agent's call"
FIX_TOOL = "fix the tool"


def who_acts(classification: str, action: str, *, agent_call_wrong: bool, tool_answers_differ: bool) -> str:
    """The action, naming who must act where the traces say: a task that fails the same way (or
    with other shapes) because of the agent's own call — a forbidden or missing argument, an unknown
    tool, a leak — is the agent's to fix; a flip where the agent made the same calls on both hosts
    and a tool answered differently is the tool's."""
    if classification in ("honest_bug", "unstable_contract") and agent_call_wrong:
        return FIX_AGENT_CALL
    if classification in ("host_coupling", "laptop_contamination") and tool_answers_differ:
        return FIX_TOOL
    return action


def action_for(classification: str, needed_repeat: int | None = None) -> str:
    action = ACTIONS[classification]
    if classification == "underpowered" and needed_repeat is not None:
        return action.replace("N", str(needed_repeat))
    return action
