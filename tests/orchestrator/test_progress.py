"""The replay's progress lines off a terminal, printed without rich: the characters ``terminal.say`` prints."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from rich.console import Console

from orchestrator import terminal
from orchestrator.progress import PlainLines, ProgressView, draws_on

LINES = [
    "       box-b  run",
    "box-b: RunnerCrashed: [/] [bold]boom[/bold] [red]",  # markup stays text
    ":smile: :warning: exit 1",  # emoji codes stay text
    "\x1b[31mred\x1b[0m and \x1b]0;title\x07 gone",  # ANSI dropped
    "a\rb\x00c\x7f\x9b",  # control characters shown as \xNN
    "tab\there",  # rich expands it by cells
    "wide 漢字\tx",
    "two\nlines",
    "trailing spaces   ",
    "x" * 500,  # never wrapped
    "é\u0301 \u200b zero width, http://example.invalid/a?b=1 1.5 True None",
]


@pytest.mark.parametrize("text", LINES)
def test_a_plain_line_is_what_rich_prints_off_a_terminal(text: str) -> None:
    plain, rich = io.StringIO(), io.StringIO()
    PlainLines(plain)(text)
    terminal.say(Console(file=rich), text)
    assert plain.getvalue() == rich.getvalue()


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [False, True])
@pytest.mark.parametrize("compatible", [None, "", "0", "1", "yes"])
@pytest.mark.parametrize("force", [None, "", "0", "1"])
def test_draws_on_says_what_rich_decides(
    monkeypatch: pytest.MonkeyPatch, tty: bool, compatible: str | None, force: str | None
) -> None:
    for name, value in (("TTY_COMPATIBLE", compatible), ("FORCE_COLOR", force)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    stream = _Stream(tty)
    assert draws_on(stream) == Console(file=stream).is_terminal


def test_off_a_terminal_the_view_prints_the_lines_a_rich_console_would(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    events = [("box-b", "connect", ""), ("box-b", "retry", "refused"), ("box-b", "run", ""),
              ("box-b", "failed", "box-b: RunnerCrashed: [/] [bold]x\tz")]  # fmt: skip
    stderr, console_file = _Stream(False), io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    with ProgressView(["box-b"]) as plain:
        for event in events:
            plain(*event)
    with ProgressView(["box-b"], Console(file=console_file)) as rich:
        for event in events:
            rich(*event)
    assert plain.live is None and stderr.getvalue() == console_file.getvalue()
    assert "box-b  failed: box-b: RunnerCrashed: [/] [bold]x" in stderr.getvalue()


def test_the_view_off_a_terminal_does_not_import_rich() -> None:
    code = (
        "import sys\n"
        "from orchestrator.progress import ProgressView\n"
        "with ProgressView(['box-b']) as view:\n"
        "    view('box-b', 'run', '')\n"
        "print(sorted(m for m in ('rich', 'orchestrator.ui', 'orchestrator.terminal') if m in sys.modules))\n"
    )
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]" and done.stderr == "       box-b  run\n"
