"""The one error tree: every class a user can meet is documented with the exit code it really ends with."""

from __future__ import annotations

import re
from pathlib import Path

import typer

import agent_runner.errors
from orchestrator import errors

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors-and-exit-codes.md"


def _tree() -> list[type[errors.CrosshostError]]:
    found, todo = [], [errors.CrosshostError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in found if c.__module__ in ("agent_runner.errors", "orchestrator.errors")]


def test_the_runner_and_the_controller_share_one_root() -> None:
    assert errors.CrosshostError is agent_runner.errors.CrosshostError
    assert errors.SuiteError is agent_runner.errors.SuiteError
    assert issubclass(errors.HostUnreachable, agent_runner.errors.CrosshostError)
    assert not issubclass(errors.InputError, errors.RunnerError)  # bad input is exit 2, never 3


def test_every_error_is_documented_with_its_exit_code() -> None:
    rows = dict(re.findall(r"^\| `(\w+)` \| (\d) \|", DOC.read_text(), flags=re.MULTILINE))
    tree = _tree()
    assert len(tree) == 20
    assert {cls.__name__: str(cls.exit_code) for cls in tree} == rows


def test_every_error_says_in_one_line_when_it_is_raised() -> None:
    for cls in _tree():
        doc = cls.__dict__.get("__doc__") or ""
        assert doc.strip() and "\n" not in doc.strip(), cls.__name__


def test_a_host_error_names_its_host_and_others_do_not() -> None:
    assert errors.WorkspaceLeft("box-b", "/w is still there").one_line() == "box-b: WorkspaceLeft: /w is still there"
    assert errors.one_line(errors.SecretVisible("X_TOKEN visible")) == "SecretVisible: X_TOKEN visible"
    assert errors.one_line(ValueError("bad")) == "ValueError: bad"


def test_every_command_has_its_exit_codes_documented() -> None:
    from orchestrator.cli import app

    def name(info: typer.models.CommandInfo) -> str:
        return info.name or (info.callback.__name__ if info.callback else "")

    commands = {name(c) for c in app.registered_commands}
    for group in app.registered_groups:
        assert group.typer_instance is not None
        commands |= {f"{group.name} {name(c)}" for c in group.typer_instance.registered_commands}
    rows = re.findall(r"^\| (`[\w ]+`(?:, `[\w ]+`)*) \|", DOC.read_text(), flags=re.M)
    documented = set(re.findall(r"`([\w ]+)`", " ".join(rows)))
    assert "export otel" in commands and commands <= documented, commands - documented
