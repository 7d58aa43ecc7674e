"""Every command's exit code, and why, in one place.

    0    ok: a valid run within its gate, shapes equal, every host answered
    1    a finding: an invalid run, a flip rate over the gate, a new flip (--compare-last), hosts
         that parted in a reproduction, shapes that differ
    2    bad input (raised as an ``InputError`` before anything runs; the error carries the code)
    3    a host or the harness failed: unreachable, crashed, an ``error`` verdict
    4    inconclusive: a valid run within its gate whose attempts left more tasks undecided than the
         suite's [gate] undecided allows (no green light from no evidence)
    130  interrupted (Ctrl-C); remote workspaces removed, partial results kept

Precedence when several apply: 130 > 2 > 3 > 1 > 4 > 0. Errors raised on purpose carry their own code
(``exit_code`` on the error classes); this module decides the code of a command that ran to its end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import zip_longest
from typing import Any, Protocol

from agent_runner.records import ResultRow
from orchestrator.errors import HostError, InputError

OK = 0
FINDING = 1
BAD_INPUT = InputError.exit_code
HOST_FAILURE = HostError.exit_code
INCONCLUSIVE = 4
INTERRUPTED = 130
#: a bug in crosshost (an exception nobody raised on purpose): never a verdict, never bad input (EX_SOFTWARE)
INTERNAL_ERROR = 70


class _HostState(Protocol):
    error: str | None
    fingerprint: str | None


class _RunState(Protocol):
    interrupted: bool

    @property
    def hosts(self) -> Mapping[str, _HostState]: ...


def replay_exit(
    manifest: _RunState, report: Any, gate: float | None, rows: list[ResultRow]
) -> tuple[int, str]:
    """A replay's exit code and why. 130: interrupted; 3: a host failed or ANY row is an ``error``
    verdict — the harness or the host failed (unreachable, runner crashed, predicate could not
    start, model provider unreachable), so the run cannot pass as valid; then the analysis's judgement
    (``judged_exit``, the code ``crosshost report`` gives the same run). Without the analysis, a run is
    judged on its fingerprints only."""
    if manifest.interrupted:
        return INTERRUPTED, "interrupted"
    infra = infra_reason(manifest, rows)
    if infra:
        return HOST_FAILURE, infra
    if report is None:
        fps = {rec.fingerprint for rec in manifest.hosts.values() if rec.fingerprint}
        if len(fps) >= 2:
            return OK, f"{len(fps)} different fingerprints, no error (analysis not available)"
        return FINDING, "fewer than two different fingerprints (analysis not available)"
    return judged_exit(report, gate)


def shard_exit(code: int, reason: str) -> tuple[int, str]:
    """A shard's exit code (``replay --shard``): a finding is the merged run's to judge (a shard's flip
    rate is a part's), so 1 and 4 become 0; bad input, a host failure and Ctrl-C stay what they are."""
    if code in (OK, FINDING, INCONCLUSIVE):
        return OK, f"shard written, crosshost merge judges the run (this shard alone: {reason})"
    return code, reason


def judged_exit(report: Any, gate: float | None = None) -> tuple[int, str]:
    """A finished run's exit code and why from its analysis (``RunReport``) alone: 3 when a host
    failed, an attempt is an ``error`` or the run directory holds damaged or unexpected evidence from
    a host; 1 invalid, over the gate or nothing comparable; 0 valid and within it. ``crosshost
    report`` gives exactly this code; a replay gives it after its own checks (``replay_exit``)."""
    failed = analysis_failure(report)
    if failed:
        return HOST_FAILURE, failed
    if not getattr(report, "valid", False):
        reasons = list(getattr(report, "invalid_reasons", None) or [])
        more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
        return FINDING, f"invalid run: {reasons[0] if reasons else 'see report.json'}{more}"
    rate = getattr(report, "flip_rate", None)
    limit = getattr(report, "gate", None)
    limit = gate if limit is None else limit
    if rate is not None and limit is not None and rate > limit:
        return FINDING, f"flip rate {rate:g} over the gate {limit:g}"
    if not getattr(report, "within_gate", True):
        return FINDING, "no comparable task: nothing was measured, the gate is not passed"
    if getattr(report, "inconclusive", False):
        return INCONCLUSIVE, inconclusive_reason(report)
    within = f", flip rate {rate:g} within the gate {limit:g}" if rate is not None and limit is not None else ""
    return OK, f"valid{within}"


def inconclusive_reason(report: Any) -> str:
    """"inconclusive: 3 of 3 comparable task(s) undecided ...": how many, and the repeat that settles them."""
    allowed = getattr(report, "allow_undecided", 0)
    settle = getattr(report, "settle_repeat", None)
    rerun = f"rerun with --repeat {settle} or --until-decided" if settle else "rerun with --until-decided"
    return (
        f"inconclusive: {report.undecided} of {report.comparable} comparable task(s) undecided "
        f"([gate] undecided allows {allowed}); {rerun}"
    )


def undecided_line(report: Any) -> str:
    """The tasks the run could not settle, and whether that makes it inconclusive ("" when none)."""
    if getattr(report, "inconclusive", False):
        return inconclusive_reason(report)
    if getattr(report, "undecided", 0):
        settle = getattr(report, "settle_repeat", None)
        return (
            f"undecided: {report.undecided} task(s), within [gate] undecided = {report.allow_undecided}"
            + (f"; --repeat {settle} would settle them" if settle else "")
        )
    return ""


def analysis_failure(report: Any) -> str:
    """Why an analysed run is a host failure (exit 3), or "" when it is not: per host, its error or
    its ``error`` attempts (and the first reason); then damaged or unexpected evidence."""
    parts: list[str] = []
    for host in getattr(report, "hosts", None) or []:
        whys = [
            why
            for task in getattr(report, "tasks", None) or []
            for verdict, why in zip_longest(task.verdicts.get(host.name, []), task.why.get(host.name, []))
            if verdict == "error"
        ]
        if whys:
            first = (whys[0] or host.error or "error").removeprefix(f"{host.name}: ")
            parts.append(f"{len(whys)} error verdict(s) on {host.name}: {first}")
        elif host.error:
            parts.append(host.error)
    problems = list(getattr(report, "problems", None) or [])
    if problems:  # damaged or unexpected evidence from a host: never a verdict
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        parts.append(f"damaged run directory: {problems[0]}{more}")
    return "; ".join(parts)


def infra_reason(manifest: _RunState, rows: list[ResultRow]) -> str:
    """Why the run is an infrastructure failure (exit 3), or "" when it is not: per host, in
    inventory order, its error verdicts (and the first reason) or its error."""
    parts: list[str] = []
    for name, rec in manifest.hosts.items():
        errs = [r for r in rows if r.env == name and r.verdict == "error"]
        if errs:
            first = (errs[0].reason or errs[0].why or "error").removeprefix(f"{name}: ")
            if rec.error and not rec.error.removeprefix(f"{name}: ").startswith(first[:40]):
                first = f"{rec.error}; {first}"
            parts.append(f"{len(errs)} error verdict(s) on {name}: {first}")
        elif rec.error:
            parts.append(rec.error)
    return "; ".join(parts)


def compare_last_exit(code: int, newly_flipping: list[str]) -> int:
    """``--compare-last``: a newly flipping task makes a passing replay exit 1, even under the gate;
    any other code stands."""
    return FINDING if code == OK and newly_flipping else code


COMPARE_LAST_REASON = "a task newly flips against the previous run (--compare-last)"


def flips_exit(within_gate: bool) -> int:
    """``crosshost flips``: 1 when the flip rate is over the gate."""
    return OK if within_gate else FINDING


def lint_exit(errors: int) -> int:
    """``lint``: 2 when the suite has an error (it is bad input a replay would refuse), else 0:
    warnings never fail."""
    return BAD_INPUT if errors else OK


def diff_exit(differs: bool, problems: Iterable[str] = ()) -> int:
    """``crosshost diff``: 3 when a host's trace cannot be read, 1 when the tool-call shapes differ."""
    if list(problems):
        return HOST_FAILURE
    return FINDING if differs else OK


def probe_exit(errors: Iterable[str | None]) -> int:
    """``crosshost hosts``: 0 when every host answered, 3 otherwise."""
    return OK if all(e is None for e in errors) else HOST_FAILURE


def repro_exit(replay_code: int, errors: Mapping[str, str], parted: bool | None) -> int:
    """``crosshost repro``: 130 interrupted, 3 a host produced no trace or failed, 1 the hosts parted
    (a different step or verdict), 0 they behaved the same."""
    if replay_code == INTERRUPTED:
        return INTERRUPTED
    if errors:
        return HOST_FAILURE
    return FINDING if parted else OK


def compare_exit(model_gap: int, box_flips: int) -> int:
    """``crosshost compare``: 0 when the agents differ on more tasks than the box flips, else 1
    (two runs that cannot be compared are bad input, exit 2, raised before)."""
    return OK if model_gap > box_flips else FINDING


def explain_exit(errors: Mapping[str, str], replay_code: int | None = None) -> int:
    """``crosshost explain``: 3 when a host failed in one of its replays, else 0 (what it found is
    evidence, not a finding); after ``replay --explain`` the replay's code, raised to 3 by such a
    failure (precedence 130 > 2 > 3 > 1 > 0)."""
    code = HOST_FAILURE if errors else OK
    if replay_code is None:
        return code
    if replay_code in (INTERRUPTED, BAD_INPUT, HOST_FAILURE):
        return replay_code
    return max(replay_code, code)
