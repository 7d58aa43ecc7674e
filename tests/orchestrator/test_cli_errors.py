"""``guarded``: both error trees (crosshost's and the runner's) become one line and DESIGN's exit code."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from agent_runner import errors as runner_errors
from orchestrator import errors
from orchestrator.cli import app, guarded


def _app_raising(exc: BaseException) -> typer.Typer:
    demo = typer.Typer()

    @demo.command()
    @guarded
    def boom() -> int:
        raise exc

    return demo


@pytest.mark.parametrize(
    ("exc", "code", "line"),
    [
        (
            runner_errors.ContractError("c.json: tools[0]: no name"),
            2,
            "InputError: c.json: tools[0]: no name",
        ),
        (runner_errors.TraceError("t.jsonl:3: not JSON"), 2, "InputError: t.jsonl:3: not JSON"),
        (runner_errors.RunnerError("workspace left behind"), 3, "RunnerError: workspace left behind"),
        (
            errors.SuiteError("suite.toml: repeat: not a number"),
            2,
            "SuiteError: suite.toml: repeat: not a number",
        ),
        (errors.RunnerCrashed("box-b", "exit 139"), 3, "box-b: RunnerCrashed: exit 139"),
    ],
)
def test_errors_of_both_trees_are_one_line_with_their_exit_code(exc: Exception, code: int, line: str) -> None:
    res = CliRunner().invoke(_app_raising(exc), [])
    assert (res.exit_code, res.stdout, res.stderr) == (code, "", line + "\n")


def test_check_with_a_missing_contract_is_exit_2_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "contract.json"
    res = CliRunner().invoke(
        app, ["check", str(missing), str(tmp_path / "t.jsonl"), str(tmp_path / "fp.json")]
    )
    assert res.exit_code == 2
    assert res.stderr.startswith(f"InputError: {missing}") and res.stderr.count("\n") == 1
