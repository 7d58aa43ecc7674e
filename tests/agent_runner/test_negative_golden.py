"""A negative golden task: a scripted call outside the contract, declared in ``expect_findings``, is
what the task tests. Lint accepts it, the runner replays it, and the checker's finding grades it: found
is a pass, missed is a fail; any other finding still fails it. Lint is per selection: an error in a
task a replay does not select is a warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_runner.errors import SuiteError
from agent_runner.suite import load_suite
from orchestrator.analysis.attempts import TraceSummariser
from orchestrator.commands.lint import NOT_SELECTED, lint_suite
from orchestrator.selection import TaskSelection
from tests.support.runner import CONTRACT, records, run_runner, write_suite

WIPE = [{"tool_calls": [{"name": "wipe_disk", "args": {"device": "sda"}}]}, {"content": "done", "finish": "stop"}]
LOOKUP = [{"tool_calls": [{"name": "lookup", "args": {"q": "x"}}]}, {"content": "done", "finish": "stop"}]
NEGATIVE = 'expect_findings = ["unknown_tool:wipe_disk"]\n'


def _suite(root: Path) -> Path:
    return write_suite(root, {
        "catches-wipe": {"toml": NEGATIVE, "script": WIPE},  # the checker must catch it: pass
        "misses-wipe": {"toml": NEGATIVE, "script": LOOKUP},  # declared, never called: fail
        "plain": {"toml": 'expect_tools = ["lookup"]\n', "script": LOOKUP},
    })  # fmt: skip


def test_the_checkers_finding_grades_a_negative_golden_task(tmp_path: Path) -> None:
    suite = _suite(tmp_path / "s")
    assert not lint_suite(suite).errors  # the declared out-of-contract call is not a lint error
    out = tmp_path / "out"
    done = run_runner("run", "--suite", str(suite), "--out", str(out), "--host", "local", "--run-id", "r1",
                      "--workspace-root", str(tmp_path / "ws"))
    assert done.returncode == 0, done.stderr
    rows = {r["task"]: r for r in records(out / "results.jsonl")}
    assert rows["catches-wipe"]["verdict"] == "pass", rows["catches-wipe"]
    assert rows["misses-wipe"]["verdict"] == "fail"
    assert "expected finding unknown_tool:wipe_disk was not raised" in rows["misses-wipe"]["why"]
    assert rows["plain"]["verdict"] == "pass"
    # the controller's checker grades it again from the trace: the declared finding is the pass
    expected = {t.id: t.expect_findings for t in load_suite(suite).tasks if t.expect_findings}
    summariser = TraceSummariser(CONTRACT, [], expected)
    caught = summariser.summarise(out / "traces" / "catches-wipe.0.jsonl", "local", "catches-wipe", 0)
    assert (caught.verdict, caught.expected_found, caught.n_findings) == ("pass", {"unknown_tool:wipe_disk"}, 0)
    # without the declaration the same trace is an out-of-contract call: a fail
    bare = TraceSummariser(CONTRACT, []).summarise(out / "traces" / "catches-wipe.0.jsonl", "local", "catches-wipe", 0)
    assert bare.verdict == "fail" and bare.why.startswith("checker: unknown_tool")


def test_expect_findings_must_name_a_contract_finding_and_a_tool(tmp_path: Path) -> None:
    suite = write_suite(tmp_path / "s", {"a": {"toml": 'expect_findings = ["leak:wipe_disk"]\n', "script": WIPE}})
    with pytest.raises(SuiteError, match="expect_findings: 'leak:wipe_disk' must be \"kind:tool\""):
        load_suite(suite)


def test_lint_is_per_selection(tmp_path: Path) -> None:
    suite = write_suite(tmp_path / "s", {
        "broken": {"script": WIPE},  # an undeclared out-of-contract call: an error
        "other": {"toml": 'expect_tools = ["lookup"]\n', "script": LOOKUP},
    })  # fmt: skip
    whole = lint_suite(suite)
    assert [f.task for f in whole.errors] == ["broken"]
    with pytest.raises(SuiteError, match="'wipe_disk' is not a tool in contract.json"):
        whole.raise_on_errors()
    other = lint_suite(suite, TaskSelection.of(["other"], None, None))
    assert not other.errors
    [warning] = [f for f in other.warnings if f.task == "broken" and f.key.startswith("[0]")]
    assert NOT_SELECTED in warning.message and "'wipe_disk' is not a tool" in warning.message
    other.raise_on_errors()  # a replay of --tasks other is not stopped
    assert lint_suite(suite, TaskSelection.of(["broken"], None, None)).errors
