"""`crosshost lint SUITE`: tools the contract lacks are errors (exit 2), unused fixtures and tasks that
cannot fail are warnings (exit 0); tools.json is needed only when a task can call shell."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from orchestrator.cli import app

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "suites" / "triage"
CONTRACT = {
    "contract_id": "t.v1",
    "tools": [
        {"name": "read_unit_status", "required_args": ["unit"]},
        {"name": "restart_unit", "required_args": ["unit"]},
        {"name": "shell", "required_args": ["argv"]},
    ],
}
runner = CliRunner()


def _suite(root: Path, tasks: dict[str, dict[str, str]], *, tools_json: bool = True) -> Path:
    """A suite: ``tasks`` maps id -> {file name: text} (prompt.md added)."""
    root.mkdir()
    (root / "suite.toml").write_text('name = "s"\n')
    (root / "contract.json").write_text(json.dumps(CONTRACT))
    if tools_json:
        (root / "tools.json").write_text('{"allow": ["ls"], "deny": []}')
    for task_id, files in tasks.items():
        d = root / "tasks" / task_id
        d.mkdir(parents=True)
        (d / "prompt.md").write_text("do it\n")
        for name, text in files.items():
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_text(text)
    return root


STATUS_SCRIPT = json.dumps([{"tool_calls": [{"name": "read_unit_status", "args": {"unit": "a"}}]}, {"content": "ok"}])


def test_the_example_suite_is_clean() -> None:
    out = runner.invoke(app, ["lint", str(EXAMPLE)])
    assert out.exit_code == 0, out.output
    assert out.output == "suite triage: 13 task(s), no findings\n"


def test_tools_the_contract_lacks_are_errors_naming_file_and_key(tmp_path: Path) -> None:
    root = _suite(tmp_path / "s", {
        "typo": {
            "task.toml": 'expect_tools = ["read_unit_statu"]\nforbid_tools = ["reboot:now"]\n',
            "script.json": json.dumps([{"tool_calls": [{"name": "read_unit_status", "args": {}},
                                                       {"name": "restrat_unit", "args": {}}]}, {"content": "x"}]),
        },
    })  # fmt: skip
    out = runner.invoke(app, ["lint", str(root)])
    assert out.exit_code == 2
    assert out.output.splitlines() == [
        f"error: {root}/tasks/typo/task.toml: expect_tools: 'read_unit_statu' is not a tool in contract.json; "
        "did you mean 'read_unit_status'?",
        f"error: {root}/tasks/typo/task.toml: forbid_tools: 'reboot' is not a tool in contract.json "
        "(it declares: read_unit_status, restart_unit, shell)",
        f"error: {root}/tasks/typo/script.json: [0].tool_calls[1].name: 'restrat_unit' is not a tool in "
        "contract.json; did you mean 'restart_unit'?",
        "suite s: 3 error(s), 0 warning(s)",
    ]


def test_unused_fixtures_and_a_task_that_cannot_fail_are_warnings(tmp_path: Path) -> None:
    root = _suite(tmp_path / "s", {
        "a-scripted": {
            "task.toml": 'expect_tools = ["read_unit_status"]\n[fixtures]\nread_unit_status = "ok"\n'
                         'restart_unit = "ok"\nmystery = "x"\n',
            "script.json": STATUS_SCRIPT,
        },
        "b-none": {"task.toml": '[agent]\nkind = "none"\n[fixtures]\nrestart_unit = "ok"\n',
                   "repo/run_tests.sh": "exit 0\n"},
        "c-cannot-fail": {"task.toml": "", "script.json": STATUS_SCRIPT},
    })  # fmt: skip
    out = runner.invoke(app, ["lint", str(root)])
    assert out.exit_code == 0, out.output
    assert out.output.splitlines() == [
        f"warning: {root}/tasks/a-scripted/task.toml: fixtures.restart_unit: script.json never calls "
        "'restart_unit': this fixture is never used",
        f"warning: {root}/tasks/a-scripted/task.toml: fixtures.mystery: 'mystery' is not a tool in contract.json: "
        "no call can reach this fixture",
        f"warning: {root}/tasks/b-none/task.toml: fixtures.restart_unit: the agent is kind 'none' and calls no "
        "tool: this fixture for 'restart_unit' is never used",
        f"warning: {root}/tasks/c-cannot-fail/task.toml: expect_tools: no predicate (repo/run_tests.sh) and no "
        "expect_tools or forbid_tools: only must_finish and the contract checks can fail this task",
        "suite s: 0 error(s), 4 warning(s)",
    ]


def test_tools_json_is_only_required_when_a_task_can_call_shell(tmp_path: Path) -> None:
    task = {"task.toml": 'expect_tools = ["read_unit_status"]\n', "script.json": STATUS_SCRIPT}
    no_shell = _suite(tmp_path / "no-shell", {"t": task}, tools_json=False)
    out = runner.invoke(app, ["lint", str(no_shell)])
    assert out.exit_code == 0, out.output

    shell_script = json.dumps([{"tool_calls": [{"name": "shell", "args": {"argv": ["ls"]}}]}, {"content": "x"}])
    scripted = _suite(tmp_path / "scripted", {"t": task, "u": {**task, "script.json": shell_script}},
                      tools_json=False)  # fmt: skip
    out = runner.invoke(app, ["lint", str(scripted)])
    assert out.exit_code == 2
    assert out.output.endswith(f"Error: {scripted.resolve()}/tools.json: missing (task 'u' can call shell)\n")
    assert len(out.output.splitlines()) == 1

    # an agent that picks its own calls can call shell whenever the contract declares it
    command = _suite(tmp_path / "command", {"t": {**task, "task.toml": '[agent]\nkind = "command"\n'
                                                   'command = ["true"]\nexpect_tools = ["shell"]\n'}},
                     tools_json=False)  # fmt: skip
    out = runner.invoke(app, ["lint", str(command)])
    assert out.exit_code == 2 and "tools.json: missing (task 't' can call shell)" in out.output
