"""``crosshost COMMAND --help`` is self-contained: it never sends the reader to a document that is not
part of the installed product, and the replay's help states its exit codes."""

from __future__ import annotations

import re

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from orchestrator.cli import app

runner = CliRunner()
COMMANDS = sorted(get_command(app).commands)  # type: ignore[attr-defined]
# A design document outside the repository, an unnamed predecessor, or a tracker's issue number
# (written with character classes so that a search of the source for these words does not find them here).
OUTSIDE = re.compile(r"D[E]SIGN|\bthe s[e]ed\b|s[e]ed's|issu[e] \d", re.IGNORECASE)


def _help(*args: str) -> str:
    result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_is_covered() -> None:
    assert {"replay", "hosts", "report", "flips", "check", "diff", "repro", "history", "schedule"} <= set(COMMANDS)


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_names_nothing_outside_the_product(command: str) -> None:
    text = _help(*([command] if command else []))
    assert not OUTSIDE.search(text), OUTSIDE.search(text)


def test_replay_help_states_its_exit_codes() -> None:
    text = " ".join(_help("replay").split())
    for code in ("Exit 0:", "1: invalid", "2: bad input", "3: a host failed", "130: interrupted"):
        assert code in text


def test_module_entry_point_knows_every_command() -> None:
    """``python -m orchestrator.cli`` (what a schedule runs) registers every command before it parses."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "cache", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "prune" in result.stdout
