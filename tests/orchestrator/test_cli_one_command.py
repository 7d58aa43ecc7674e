"""`crosshost NAME ...` builds only NAME's command (cli.app_for): what the user sees of it — help,
a bad option, a missing argument, their exit codes — is what the whole app shows."""

from __future__ import annotations

import pytest
import typer.main
import typer.models
from typer.testing import CliRunner

from orchestrator import cli


def _name(c: typer.models.CommandInfo) -> str:
    assert c.callback is not None
    return c.name or typer.main.get_command_name(c.callback.__name__)


NAMES = sorted(_name(c) for c in cli.app.registered_commands)


def _seen(app: typer.Typer, args: list[str]) -> tuple[int, str]:
    got = CliRunner().invoke(app, args, prog_name="crosshost")
    return got.exit_code, got.output


def test_every_command_is_found_and_nothing_else_is_built() -> None:
    assert {"replay", "report", "hosts", "version", "repro"} <= set(NAMES)
    for name in NAMES:
        one = cli.app_for([name, "--help"])
        assert [_name(c) for c in one.registered_commands] == [name] and one.registered_groups == []
    assert cli.app.registered_groups and len(cli.app.registered_commands) == len(NAMES)  # app untouched
    for args in ([], ["--help"], ["export", "otel", "--help"], ["cache"], ["no-such-command"], ["Replay"]):
        assert cli.app_for(args) is cli.app


@pytest.mark.parametrize("name", NAMES)
def test_a_command_alone_says_what_the_whole_app_says(name: str) -> None:
    for args in ([name, "--help"], [name, "--no-such-option"], [name, "--help", "--no-such-option"]):
        assert _seen(cli.app_for(args), args) == _seen(cli.app, args), args


def test_a_missing_argument_reads_the_same() -> None:
    for args in (["replay"], ["report"], ["repro"], ["merge"]):
        whole = _seen(cli.app, args)
        assert whole[0] == 2 and _seen(cli.app_for(args), args) == whole
