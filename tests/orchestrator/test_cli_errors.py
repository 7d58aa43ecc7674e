"""``guarded``: every error of the one tree (runner and controller alike) becomes one line and its exit code."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

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
            errors.ContractError("c.json: tools[0]: no name"),
            2,
            "ContractError: c.json: tools[0]: no name",
        ),
        (errors.TraceError("t.jsonl:3: not JSON"), 2, "TraceError: t.jsonl:3: not JSON"),
        (
            errors.InputError("--format 'x': choose table, md, json or junit"),
            2,
            "InputError: --format 'x': choose table, md, json or junit",
        ),
        (errors.RunnerError("workspace left behind"), 3, "RunnerError: workspace left behind"),
        (
            errors.CrosshostError("runs/x: run directory exists already"),
            1,
            "CrosshostError: runs/x: run directory exists already",
        ),
        (
            errors.SuiteError("suite.toml: repeat: not a number"),
            2,
            "SuiteError: suite.toml: repeat: not a number",
        ),
        (errors.RunnerCrashed("box-b", "exit 139"), 3, "box-b: RunnerCrashed: exit 139"),
    ],
)
def test_an_error_is_one_line_with_its_exit_code(exc: Exception, code: int, line: str) -> None:
    res = CliRunner().invoke(_app_raising(exc), [])
    assert (res.exit_code, res.stdout, res.stderr) == (code, "", line + "\n")


def test_check_with_a_missing_contract_is_exit_2_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "contract.json"
    res = CliRunner().invoke(
        app, ["check", str(missing), str(tmp_path / "t.jsonl"), str(tmp_path / "fp.json")]
    )
    assert res.exit_code == 2
    assert res.stderr.startswith(f"ContractError: {missing}") and res.stderr.count("\n") == 1


def test_a_reader_that_leaves_early_is_not_an_internal_error(tmp_path: Path) -> None:
    """`crosshost history --json | head`: the pipe closes under a long print. cat(1) goes quiet with
    141; an 'internal error' line and a debug log would be noise."""
    import os
    import subprocess
    import sys

    script = (
        "import typer\n"
        "from orchestrator.cli import guarded\n"
        "app = typer.Typer()\n"
        "@app.command()\n"
        "@guarded\n"
        "def long() -> int:\n"
        "    for _ in range(200_000):\n"
        "        typer.echo('x' * 80)\n"
        "    return 0\n"
        "app()\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(100)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert err == ""
    assert not (tmp_path / "cache").exists()  # no debug log written
