"""One task attempt on one host, summarised from its trace in one streaming pass.

The summary keeps only what the verdicts need: the verdict, the pins, a hash of the shape, a hash of
the argument values, and capped lists of findings and problems. Each turn is checked as it streams
past, against the contract and against EVERY host's fingerprint (a trace from box-b that holds the
reference's hostname is a leak too), so a million-line trace never sits in memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from agent_runner.checker import LEAK_KINDS, Contract, Hit, TurnChecker
from agent_runner.errors import TraceError
from agent_runner.records import VERDICTS, TraceFinish, TraceHeader
from agent_runner.trace import TraceRecord, fp, iter_records, typed_records
from orchestrator.analysis.shapes import ShapeHasher, Step, shape_line, step_of

MEMO_TURNS = 4096  # distinct (tool, arguments) remembered at once; cleared when full
KEEP_FINDINGS = 20  # per attempt; the count is kept in full
KEEP_PROBLEMS = 10
KEEP_STRAYS = 10  # paths outside the workspace kept per attempt; the count is kept in full
KEEP_RECORDS = 50_000  # trace records kept for the report page, in all (``TraceRecords``)


@dataclass
class CheckFinding:
    kind: str
    step: int | None
    tool: str | None
    message: str
    is_leak: bool
    rule: str = ""  # which rule fired, and on what (docs/verdicts.md); empty for contract findings
    evidence: str = ""
    weak: bool = False


@dataclass
class AttemptSummary:
    host: str
    task: str
    attempt: int
    path: Path | None
    verdict: str = "error"
    why: str = ""
    predicate_output: str | None = None  # what run_tests.sh printed (capped by the runner), pass or fail
    fingerprint: str | None = None
    pins: dict[str, Any] | None = None
    steps: int = 0
    shape_hash: str = ""
    values_hash: str = ""
    answers_hash: str = ""  # the tools' answers (obs_fp), step by step
    findings: list[CheckFinding] = field(default_factory=list)  # contract findings and leaks
    n_findings: int = 0
    n_leaks: int = 0
    weak: list[CheckFinding] = field(default_factory=list)  # leak candidates without cross-host evidence
    #: the attempt's own directories on its host (the trace header's ``dirs``): attempt, cwd, home, tmp
    dirs: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    n_problems: int = 0
    #: files the attempt's uid left outside its workspace (the runner's finish record, capped)
    outside_workspace: list[str] = field(default_factory=list)
    n_outside_workspace: int = 0
    #: the declared findings of a negative golden task the controller's checker raised ("kind:tool")
    expected_found: set[str] = field(default_factory=set)

    @property
    def has_trace(self) -> bool:
        """A usable trace: read to the end without damage (its shape can be compared)."""
        return self.path is not None and self.n_problems == 0

    def problem(self, text: str) -> None:
        self.n_problems += 1
        if len(self.problems) < KEEP_PROBLEMS:
            self.problems.append(text)


class TraceRecords:
    """The records of the traces a summariser read whole, kept for the report page, which shows the
    same traces: a trace is then read and parsed once per analysis. At most ``limit`` records in all
    are kept; a trace past that, or one that could not be read to its end, is read again where it is
    shown."""

    def __init__(self, limit: int = KEEP_RECORDS) -> None:
        self.room = limit
        self._kept: dict[Path, list[tuple[int, dict[str, Any]]]] = {}

    def keep(self, path: Path, records: list[tuple[int, dict[str, Any]]]) -> None:
        if len(records) <= self.room:
            self._kept[path] = records
            self.room -= len(records)

    def typed(self, path: Path) -> Iterator[tuple[int, TraceRecord]] | None:
        """The trace's records as ``iter_trace`` reads them from its file; None when not kept."""
        records = self._kept.get(path)
        return None if records is None else typed_records(records)


class TraceSummariser:
    """Summarises the traces of one run: one contract, one set of fingerprints.

    Per turn it needs the shape line, the argument-value fingerprint and the checker's findings. A
    long trace repeats the same calls, so the shape line and the findings (without the step) are
    memoised per (tool, arguments) when every argument value is a string or null; other turns are
    worked out in full. The results are exactly those of ``step_of`` and ``check_turns``.
    """

    def __init__(
        self,
        contract: Mapping[str, Any] | None,
        fingerprints: Sequence[Mapping[str, Any]],
        expected: Mapping[str, Sequence[str]] | None = None,
        keep: TraceRecords | None = None,
    ) -> None:
        self.contract = contract
        #: where the records of each trace read whole are kept (the report page shows them again)
        self.keep = keep
        self.fingerprints = fingerprints
        #: per task, the findings a negative golden task declares ("kind:tool", task.toml expect_findings)
        self.expected = expected or {}
        self._checker: TurnChecker | None = None
        self._memo: dict[Any, tuple[bytes, tuple[Hit, ...]]] = {}

    def _turn_checker(self) -> TurnChecker | None:
        if self.contract is None:
            return None
        if self._checker is None:  # built at the first turn, as check_turns was
            # the run's contract.json as stored: the checker reads each of its keys with isinstance
            self._checker = TurnChecker(cast(Contract, dict(self.contract)), [dict(f) for f in self.fingerprints])
        return self._checker

    def _work_out(self, tool: str, args: dict[str, Any]) -> tuple[bytes, tuple[Hit, ...]]:
        checker = self._turn_checker()
        return shape_line(tool, args), checker.turn_findings(tool, args) if checker is not None else ()

    def summarise(self, path: Path, host: str, task: str, attempt: int) -> AttemptSummary:
        """Stream one trace. Damage never raises: it is a problem and the attempt's verdict is ``error``."""
        summary = AttemptSummary(host, task, attempt, path)
        hasher = ShapeHasher()
        add_line = hasher.add_line
        memo = self._memo
        finish: TraceFinish | None = None
        kept: list[tuple[int, dict[str, Any]]] | None = [] if self.keep is not None else None
        try:
            for lineno, record in iter_records(path):
                if kept is not None:
                    kept.append((lineno, record))
                    if self.keep is not None and len(kept) > self.keep.room:
                        kept = None  # past what is kept: the page reads this trace again
                kind = record.get("type")
                if finish is not None and kind != "corrupt":  # the runner writes nothing after the finish
                    summary.problem(f"{path}:{lineno}: a {kind} record after the finish")
                    continue
                if kind == "turn":
                    tool = record.get("tool")
                    if not isinstance(tool, str) or not tool:
                        summary.problem(f"{path}:{lineno}: turn without a tool name")
                        continue
                    raw_args = record.get("args")
                    args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
                    try:
                        key: Any = (tool, tuple(args.items()))
                        known = memo.get(key)
                    except TypeError:  # a list or object among the values: not hashable
                        key, known = None, None
                    if known is None:
                        known = self._work_out(tool, args)
                        # 1 == 1.0 == True as keys, but their types differ in a shape: flat strings only
                        if key is not None and all(type(v) is str or v is None for v in args.values()):
                            if len(memo) >= MEMO_TURNS:
                                memo.clear()
                            memo[key] = known
                    args_fp, obs_fp = record.get("args_fp"), record.get("obs_fp")
                    add_line(
                        known[0],
                        args_fp if isinstance(args_fp, str) else fp(dict(args)),
                        obs_fp if isinstance(obs_fp, str) else "",
                    )
                    if known[1]:
                        _record_findings(summary, known[1], record.get("step"), tool, self.expected.get(task, ()))
                elif kind == "corrupt":
                    summary.problem(f"{path}:{lineno}: {record.get('error', 'corrupt line')}")
                elif kind == "header":
                    header = TraceHeader.from_json(record)  # an older schema's pins migrated
                    summary.fingerprint = header.fingerprint or None
                    summary.pins = header.pins if isinstance(record.get("pins"), dict) else None
                    dirs = record.get("dirs")
                    if isinstance(dirs, dict):
                        summary.dirs = {k: v for k, v in dirs.items() if isinstance(k, str) and isinstance(v, str)}
                elif kind == "finish":
                    finish = TraceFinish.from_json(record)
                else:
                    summary.problem(f"{path}:{lineno}: unknown record type {kind!r}")
        except (TraceError, OSError) as exc:  # an unreadable file is a problem of this attempt
            summary.problem(str(exc))
            kept = None
        if kept is not None and self.keep is not None:
            self.keep.keep(path, kept)
        summary.steps = hasher.steps
        summary.shape_hash = hasher.shape_hash
        summary.values_hash = hasher.values_hash
        summary.answers_hash = hasher.answers_hash
        if finish is not None and not summary.n_problems and not summary.n_leaks:
            _runner_leaks(summary, finish)
        _settle_verdict(summary, path, finish, self.expected.get(task, ()))
        return summary


def _record_findings(
    summary: AttemptSummary, found: tuple[Hit, ...], step: Any, tool: str, expected: Sequence[str] = ()
) -> None:
    for hit in found:
        if f"{hit.kind}:{tool}" in expected:  # the negative golden task's declared call: its pass
            summary.expected_found.add(f"{hit.kind}:{tool}")
            continue
        record_finding(summary, CheckFinding(
            kind=hit.kind, step=step, tool=tool, message=hit.message, is_leak=hit.kind in LEAK_KINDS and not hit.weak,
            rule=hit.rule, evidence=hit.evidence, weak=hit.weak,
        ))  # fmt: skip


def record_finding(summary: AttemptSummary, finding: CheckFinding) -> None:
    """Count one finding of the attempt and keep it while the list has room (weak ones apart)."""
    if finding.weak:
        if len(summary.weak) < KEEP_FINDINGS:
            summary.weak.append(finding)
        return
    summary.n_findings += 1
    summary.n_leaks += finding.is_leak
    if len(summary.findings) < KEEP_FINDINGS:
        summary.findings.append(finding)


def _runner_leaks(summary: AttemptSummary, finish: TraceFinish) -> None:
    """The runner's own leaks from the finish record, for a trace the controller found none in: the
    runner also knew the attempt's own directories, which no fingerprint holds."""
    for f in finish.findings or []:
        if isinstance(f, dict) and f.get("kind") in LEAK_KINDS and f.get("weak") is not True:
            step, tool = f.get("step"), f.get("tool")
            record_finding(summary, CheckFinding(
                kind=str(f["kind"]), step=step if isinstance(step, int) else None,
                tool=tool if isinstance(tool, str) else None, message=str(f.get("message") or ""), is_leak=True,
                rule=str(f.get("rule") or ""), evidence=str(f.get("evidence") or ""),
            ))  # fmt: skip


def _settle_verdict(
    summary: AttemptSummary, path: Path, finish: TraceFinish | None, expected: Sequence[str] = ()
) -> None:
    if summary.n_problems:
        summary.verdict, summary.why = "error", f"damaged trace: {summary.problems[0]}"
    elif finish is None:
        summary.verdict, summary.why = "error", f"{path}: no finish record (the attempt was cut short)"
    elif finish.verdict not in VERDICTS:
        summary.verdict = "error"
        summary.why = f"{path}: finish verdict {finish.verdict!r} is not pass, fail or error"
    else:
        summary.verdict = finish.verdict
        summary.why = finish.why
        summary.predicate_output = finish.predicate_output
        strays = finish.extra.get("outside_workspace")  # the runner's sandbox adds it
        if isinstance(strays, list):
            paths = [p for p in strays if isinstance(p, str)]
            summary.outside_workspace, summary.n_outside_workspace = paths[:KEEP_STRAYS], len(paths)
        if summary.verdict == "pass" and summary.n_findings:
            # pass needs a clean contract check, and ours sees every host's fingerprint
            first = summary.findings[0]
            summary.verdict = "fail"
            summary.why = f"checker: {first.kind} at step {first.step}: {first.message}"
        missed = [spec for spec in expected if spec not in summary.expected_found]
        if summary.verdict == "pass" and missed:  # the checker's own finding grades a negative task
            summary.verdict = "fail"
            summary.why = f"checker: expected finding {missed[0]} was not raised"


def summarise_trace(
    path: Path,
    host: str,
    task: str,
    attempt: int,
    contract: Mapping[str, Any] | None,
    fingerprints: Sequence[Mapping[str, Any]],
) -> AttemptSummary:
    """One trace on its own (``TraceSummariser`` shares its memo over all the traces of a run)."""
    return TraceSummariser(contract, fingerprints).summarise(path, host, task, attempt)


def iter_steps(path: Path) -> Iterator[Step]:
    """The shape steps of one trace, re-read on demand (for the diff of one task only)."""
    for _, record in iter_records(path):
        if record.get("type") == "turn":
            step = step_of(record)
            if step is not None:
                yield step


def iter_turns_by_value(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(args_fp, turn)`` for the turns ``iter_steps`` makes steps of, without making the steps.

    Comparing two traces' argument values needs only ``args_fp``; a ``Step`` is built (``step_of``)
    just for the turns whose values differ.
    """
    for _, record in iter_records(path):
        if record.get("type") == "turn":
            tool = record.get("tool")
            if isinstance(tool, str) and tool:
                args_fp = record.get("args_fp")
                if not isinstance(args_fp, str):
                    raw_args = record.get("args")
                    args_fp = fp(dict(raw_args) if isinstance(raw_args, dict) else {})
                yield args_fp, record
