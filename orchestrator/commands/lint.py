"""``crosshost lint SUITE``: what a suite says that cannot be what its author meant.

The suite is first read as a replay reads it (``agent_runner.suite.load_suite``: a broken file is one
``SuiteError``, exit 2). Then, per task, each finding one line naming file and key:

- error: a tool in ``expect_tools``, ``forbid_tools`` or ``script.json`` that the contract does not
  declare (the expectation can never be met, the ban never bites, the call is refused);
- warning: a fixture for a tool the task never calls (not in the contract, a script that never calls
  it, an agent of kind ``none``);
- warning: a task with neither a predicate (``repo/run_tests.sh``) nor ``expect_tools`` /
  ``forbid_tools``: only ``must_finish`` and the contract checks can fail it.

``replay`` runs the same checks first, on the tasks it selects: errors in those stop it (exit 2); an
error in a task it does not replay is a warning there (it stops no replay of other tasks); warnings
are printed and it goes on. A negative golden task's declared out-of-contract call (``expect_findings``
in its task.toml) is what the task tests, not an error.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from agent_runner.suite import Suite, Task, load_suite
from orchestrator.errors import SuiteError
from orchestrator.hints import command
from orchestrator.selection import TaskSelection

Level = Literal["error", "warning"]


@dataclass(frozen=True)
class Finding:
    level: Level
    file: Path
    key: str
    message: str
    task: str | None = None

    def line(self) -> str:
        return f"{self.level}: {self.file}: {self.key}: {self.message}"


@dataclass
class LintReport:
    suite: str
    tasks: int
    suite_dir: Path
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]

    def summary(self) -> str:
        if not self.findings:
            return f"suite {self.suite}: {self.tasks} task(s), no findings"
        return f"suite {self.suite}: {len(self.errors)} error(s), {len(self.warnings)} warning(s)"

    def raise_on_errors(self) -> None:
        """What a replay does before it touches a host: the first error as bad input (exit 2)."""
        if self.errors:
            first = self.errors[0]
            every = command("lint", self.suite_dir)
            more = f" (+{len(self.errors) - 1} more: {every} lists them)" if len(self.errors) > 1 else ""
            raise SuiteError(f"{first.file}: {first.key}: {first.message}{more}")


NOT_SELECTED = "not selected, so it does not stop this replay"


def lint_suite(suite_dir: Path, selection: TaskSelection | None = None, *, suite: Suite | None = None) -> LintReport:
    """Every finding of the suite in ``suite_dir``, in task order; a suite that does not load raises.
    With a ``selection`` (a replay's ``--tasks/--exclude/--tags``), an error in a task it leaves out
    is a warning that says so: lint is per selection. ``suite``: the suite already read from
    ``suite_dir`` (``load_suite``; a replay reads it once, for the lint and the bundle)."""
    suite = suite if suite is not None else load_suite(suite_dir)
    shown = Path(suite_dir)
    tools = _contract_tools(suite)
    contract_file = shown / _contract_name(shown)
    report = LintReport(suite.name, len(suite.tasks), shown)
    selected = None
    if selection is not None and not selection.everything:
        selected = set(selection.select(suite.task_ids, {t.id: t.tags for t in suite.tasks}, str(shown)))
    for task in suite.tasks:
        found = _task_findings(task, shown / "tasks" / task.id, tools, contract_file)
        if selected is not None and task.id not in selected:
            found = [
                replace(f, level="warning", message=f"{f.message} ({NOT_SELECTED})") if f.level == "error" else f
                for f in found
            ]
        report.findings += found
    return report


def _contract_name(shown: Path) -> str:
    try:
        raw = tomllib.loads((shown / "suite.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):  # a normalised suite.json: the contract is inside it
        return "suite.json"
    return str(raw.get("contract", "contract.json"))


def _contract_tools(suite: Suite) -> list[str]:
    return [str(t.get("name")) for t in suite.contract.get("tools") or [] if isinstance(t, dict)]


def _unknown(tool: str, tools: list[str], contract_file: Path) -> str:
    close = difflib.get_close_matches(tool, tools, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f" (it declares: {', '.join(tools) or 'none'})"
    return f"{tool!r} is not a tool in {contract_file.name}{hint}"


def _script_calls(task: Task) -> Iterator[tuple[str, str]]:
    """(key, tool name) of every call in the task's script."""
    for i, turn in enumerate(task.script or []):
        for n, call in enumerate(turn.get("tool_calls") or []):
            yield f"[{i}].tool_calls[{n}].name", str(call.get("name"))


def _task_findings(task: Task, task_dir: Path, tools: list[str], contract_file: Path) -> list[Finding]:
    toml = task_dir / "task.toml"
    found: list[Finding] = []
    known = set(tools)
    for key in ("expect_tools", "forbid_tools"):
        for spec in getattr(task, key):
            tool = spec.partition(":")[0]
            if tool not in known:
                found.append(Finding("error", toml, key, _unknown(tool, tools, contract_file)))
    calls = list(_script_calls(task))
    for key, tool in calls:
        if tool not in known and f"unknown_tool:{tool}" not in task.expect_findings:
            found.append(Finding("error", task_dir / "script.json", key, _unknown(tool, tools, contract_file)))
    called = {tool for _, tool in calls}
    for tool in task.fixtures:
        why = None
        if tool not in known:
            why = f"{tool!r} is not a tool in {contract_file.name}: no call can reach this fixture"
        elif task.agent.kind == "none":
            why = f"the agent is kind 'none' and calls no tool: this fixture for {tool!r} is never used"
        elif task.agent.kind == "scripted" and tool not in called:
            why = f"script.json never calls {tool!r}: this fixture is never used"
        if why:
            found.append(Finding("warning", toml, f"fixtures.{tool}", why))
    if task.predicate is None and not task.expect_tools and not task.forbid_tools:
        found.append(
            Finding(
                "warning", toml, "expect_tools",
                "no predicate (repo/run_tests.sh) and no expect_tools or forbid_tools: "
                "only must_finish and the contract checks can fail this task",
            )  # fmt: skip
        )
    return [replace(f, task=task.id) for f in found]


def lint_lines(report: LintReport) -> list[str]:
    """What ``crosshost lint`` prints: one line a finding, then the summary."""
    return [*(f.line() for f in report.findings), report.summary()]

