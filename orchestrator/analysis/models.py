"""The report models: ``RunReport`` serialises to ``report.json`` (docs/verdicts.md).

The first fields of each model are the original report format; those after ``# extras`` were added later.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from agent_runner.jsonfile import loads as json_loads
from orchestrator.errors import InputError, not_the_record

REPORT_NAME = "report.json"

# The decision table: classification -> action.
ACTIONS: dict[str, str] = {
    "host_coupling": "quarantine the agent",
    "laptop_contamination": "clean local secrets",
    "unstable_contract": "pin tools, rerun",
    "honest_bug": "fix the tool",
    "flaky": "fix the test first",
    # a sampled agent whose attempts vary alike on every host: the test is fine, the model draws
    "sampled_noise": "report its pass rate; no host effect found",
    "underpowered": "rerun with --repeat N",  # N: the attempts per host that could settle it
    "same_host": "use a real second machine",
    "infra_error": "fix the host, rerun",
    "agree": "—",
}

# Highest first. A task gets the first classification that applies (see verdict.classify_task).
PRECEDENCE: tuple[str, ...] = (
    "infra_error",
    "same_host",
    "flaky",
    "underpowered",
    "sampled_noise",
    "host_coupling",
    "laptop_contamination",
    "unstable_contract",
    "honest_bug",
    "agree",
)

VERDICTS = ("pass", "fail", "error")


class HostEntry(BaseModel):
    name: str
    fingerprint: str | None = None
    reachable: bool = True
    error: str | None = None
    # extras
    replayed: bool = False


class Leak(BaseModel):
    host: str
    step: int | None = None
    kind: str
    # extras
    attempt: int = 0
    tool: str | None = None
    message: str = ""
    #: which rule fired (docs/verdicts.md, e.g. ``distinct_hostname``, ``cross_host``) and on what
    rule: str = ""
    evidence: str = ""


class ShapeDiff(BaseModel):
    """One differing step of the (tool, sorted argument keys, value types) sequence."""

    host: str
    attempt: int
    op: str  # "changed" | "missing" (reference has it, host lacks it) | "extra" (host only)
    reference_step: int | None = None
    step: int | None = None
    reference: str | None = None
    other: str | None = None


class ArgValue(BaseModel):
    """One argument whose value differs at a same-shape step, as redacted text (null: not passed)."""

    key: str
    reference: str | None = None
    other: str | None = None


class ArgsDiff(BaseModel):
    """Same shape at a step, different argument values (compared by ``args_fp``)."""

    host: str
    attempt: int
    step: int
    tool: str
    reference_args_fp: str
    args_fp: str
    #: per differing argument: [key, the reference's value, this host's value], redacted, null when absent
    values: list[ArgValue] = Field(default_factory=list)


class FieldDiff(BaseModel):
    field: str
    reference: str | None = None
    other: str | None = None
    #: what ties this fact to the task (its output names it), None when nothing does
    tied: str | None = None


class Attribution(BaseModel):
    """The fingerprint fields that differ between the reference and a host: the first lead."""

    host: str
    reference: str
    fields: list[FieldDiff] = Field(default_factory=list)


class Counterfactual(BaseModel):
    """The reference re-run with one environment fact of another host: does that alone flip it?"""

    host: str  # whose fact
    fact: str  # the variable, e.g. "LANG"
    value: str | None = None  # the other host's value; None: unset there
    verdict: str | None = None  # the reference's verdict with it (None: the run gave none)
    reproduces: bool = False  # the verdict is the other host's


class PathEvidence(BaseModel):
    """A path an attempt touched outside its own directories whose state differs between hosts."""

    path: str
    #: other spellings of the same file through a directory link on every host (/bin/jq for /usr/bin/jq)
    aliases: list[str] = Field(default_factory=list)
    calls: list[str] = Field(default_factory=list)  # the system calls that named it (openat, stat, execve…)
    touched_on: list[str] = Field(default_factory=list)  # the hosts where the attempt touched it
    #: who touched it: "predicate" (run_tests.sh) and/or "agent" (the agent's processes and its tools')
    by: list[str] = Field(default_factory=lambda: ["predicate"])
    #: host -> its state there: "absent", "directory", "file 12 bytes sha256 ab12…", "symlink -> x", …
    state: dict[str, str] = Field(default_factory=dict)


class ExplainTask(BaseModel):
    """``crosshost explain``'s evidence for one flipped task (``explain.json``)."""

    task: str
    #: host -> the verdict when the task was replayed once more with the run's pins
    again: dict[str, str | None] = Field(default_factory=dict)
    counterfactuals: list[Counterfactual] = Field(default_factory=list)
    #: paths touched on a host whose state differs between the compared hosts (file evidence)
    paths: list[PathEvidence] = Field(default_factory=list)
    #: what could not be gathered and why, one line each (never a guess)
    not_collected: list[str] = Field(default_factory=list)


class ExplainRecord(BaseModel):
    """``explain.json`` in the run directory."""

    run_id: str
    reference: str
    tasks: list[ExplainTask] = Field(default_factory=list)
    replays: int = 0  # replays explain ran (the once-more replay and one per counterfactual)
    seconds: float = 0.0
    #: the bound on counterfactual replays and the facts left out by it
    max_counterfactuals: int = 0
    skipped: list[str] = Field(default_factory=list)
    runs: list[str] = Field(default_factory=list)  # the run ids of explain's replays (under explain/)


class HostRate(BaseModel):
    """One host's pass rate on one task: non-error attempts, passes, the 95% Wilson interval and the
    two-sided p-value of Fisher's exact test against the reference (None for the reference)."""

    host: str
    n: int
    passes: int
    pass_rate: float | None = None
    ci_low: float
    ci_high: float
    p_value: float | None = None
    differs: bool = False
    #: ``p_value`` after the suite-wide correction (Holm or Benjamini–Hochberg); the host differs when
    #: it is below the level. Equal to ``p_value`` where the comparison is not in the family.
    p_adjusted: float | None = None


#: how much of a predicate's output report.json keeps per attempt (the trace keeps the runner's cap)
PREDICATE_OUTPUT_CAP = 1000


class TaskReport(BaseModel):
    task: str
    verdicts: dict[str, list[str]]
    flip: bool
    flaky_hosts: list[str] = Field(default_factory=list)
    classification: str
    action: str
    shape_diff: list[ShapeDiff] = Field(default_factory=list)
    leaks: list[Leak] = Field(default_factory=list)
    # extras
    flipped_hosts: list[str] = Field(default_factory=list)
    comparable: bool = False
    errors: int = 0
    why: dict[str, list[str]] = Field(default_factory=dict)
    #: per host, per attempt: the predicate's output (last PREDICATE_OUTPUT_CAP chars), null without one
    predicate_output: dict[str, list[str | None]] = Field(default_factory=dict)
    args_diff: list[ArgsDiff] = Field(default_factory=list)
    findings: list[Leak] = Field(default_factory=list)  # contract findings that are not leaks
    #: leak candidates without the cross-host evidence a generic host name needs: reported, not leaks
    weak: list[Leak] = Field(default_factory=list)
    attribution: list[Attribution] = Field(default_factory=list)
    #: a flipped task's cause in one line (the terminal table shows it); the evidence is in attribution
    cause: str = ""
    #: ``crosshost explain``'s evidence when the run has an explain.json naming this task
    explain: ExplainTask | None = None
    problems: list[str] = Field(default_factory=list)
    evidence: str = "deterministic"  # or "statistical": see docs/statistics.md
    sampled: bool = False
    rates: list[HostRate] = Field(default_factory=list)
    needed_repeat: int | None = None
    model_hold: list[str] = Field(default_factory=list)  # "model held for N requests on HOST", divergences


class HostStats(BaseModel):
    """Pass rate and pass^k of one host; ``error`` attempts are counted apart, not as failures."""

    host: str
    attempts: int = 0
    passed: int = 0
    failed: int = 0
    errors: int = 0
    pass_rate: float | None = None
    pass_k: dict[str, float] = Field(default_factory=dict)


class BurnFinding(BaseModel):
    """An isolation finding of action ``burn`` in a host's fingerprint: this box leaks into runs."""

    host: str
    kind: str
    detail: str
    meaning: str


class OutsideWorkspace(BaseModel):
    """Files an attempt left outside its workspace (``/tmp``, ``/var/tmp``, ``/dev/shm``, the runner's
    HOME), found by the uid the sandbox gave the run's attempts: a warning, never a verdict and never
    invalidating (docs/threat-model.md). Attempts of one run share that uid, so with slots > 1 the
    attempt named is the one after which the files were first seen."""

    host: str
    task: str
    attempt: int
    paths: list[str]  # at most a few; ``count`` is all of them
    count: int


class RunReport(BaseModel):
    run_id: str
    suite: str | None = None
    valid: bool
    invalid_reasons: list[str] = Field(default_factory=list)
    gate: float
    flip_rate: float
    reference: str | None = None
    hosts: list[HostEntry] = Field(default_factory=list)
    tasks: list[TaskReport] = Field(default_factory=list)
    # extras
    suite_sha: str | None = None
    within_gate: bool = True
    flipped: int = 0
    comparable: int = 0
    error_attempts: int = 0
    error_tasks: int = 0
    interrupted: bool = False
    stats: list[HostStats] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)
    alpha: float = 0.05
    #: every host's burn findings, always listed; they invalidate the run under [gate] burn_invalidates
    burn: list[BurnFinding] = Field(default_factory=list)
    burn_invalidates: bool = False
    #: every attempt that left files outside its workspace on its host (a warning)
    outside_workspace: list[OutsideWorkspace] = Field(default_factory=list)
    #: what the run's manifest says once per run: inventory values crosshost replaced or ignored
    notes: list[str] = Field(default_factory=list)
    hold_model: str | None = None  # "true" or "strict" when the run held the model
    #: what ``crosshost explain`` spent (replays, seconds), when it ran on this run
    explain: str | None = None
    #: how host differences on statistical evidence are declared across the suite: "bh" or "holm"
    correction: str = "bh"
    #: the statistical comparisons the correction counted (those whose margins could reach the level)
    family: int = 0
    #: how many times --until-decided looked at the evidence; each look is tested at alpha / looks
    looks: int = 1
    #: comparable tasks these attempts could not settle (``underpowered``), and how many [gate] allows
    undecided: int = 0
    allow_undecided: int = 0
    #: the attempts per host that would settle every undecided task (the largest they need)
    settle_repeat: int | None = None
    #: more tasks undecided than [gate] allows: the run measured too little to pass or fail
    inconclusive: bool = False

    def to_json_text(self) -> str:
        """``report.json``'s text: the one writer of the file."""
        return self.model_dump_json(indent=2) + "\n"

    @classmethod
    def read(cls, path: Path) -> RunReport:
        """``report.json``: the one reader of the file; one that cannot be read, is not JSON or not a
        report is an InputError naming the file (and the key)."""
        try:
            data = json_loads(path.read_bytes())
        except UnicodeDecodeError as exc:
            raise InputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: line {exc.lineno}: not valid JSON: {exc.msg}") from exc
        except OSError as exc:
            raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        if not isinstance(data, dict):
            raise InputError(f"{path}: must hold a JSON object")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise not_the_record(path, exc) from exc

    def host_names(self) -> list[str]:
        """Every host's name, the reference's order first; a host only traces know of still gets one."""
        names = [h.name for h in self.hosts]
        for task in self.tasks:
            names += [h for h in task.verdicts if h not in names]
        return names
