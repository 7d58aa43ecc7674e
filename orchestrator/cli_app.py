"""The typer app every crosshost command registers on, and what runs it: ``guarded`` (a command's
int is its exit code, an error one line and its code), ``app_for`` (only the named command built),
the options every command shares. The commands themselves are ``orchestrator/cli.py``'s."""

from __future__ import annotations

import copy
import datetime as _dt
import functools
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ParamSpec

import typer
import typer.main

from agent_runner import collector
from agent_runner.textguard import printable
from orchestrator.errors import CrosshostError
from orchestrator.exit_policy import INTERNAL_ERROR, INTERRUPTED

P = ParamSpec("P")

# One syntax for picking tasks and hosts in every command (orchestrator/selection.py).
TasksOpt = Annotated[
    str | None, typer.Option("--tasks", help="Only these tasks: names or globs, comma-separated ('net-*,dns')."),
]
ExcludeOpt = Annotated[str | None, typer.Option("--exclude", help="Leave out these tasks: names or globs.")]
TagsOpt = Annotated[str | None, typer.Option("--tags", help="Only tasks with one of these tags (task.toml tags).")]
HostsOpt = Annotated[str | None, typer.Option("--hosts", help="Only these hosts, comma-separated (a,b).")]

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Replay a pinned agent-eval suite on several hosts and see which verdicts moved.",
)


def _debug_log(exc: BaseException) -> Path:
    """Write an unexpected error's traceback where the user can find it, and say where."""
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "crosshost"
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError:
        base = Path(tempfile.gettempdir())
    path = base / f"debug-{_dt.datetime.now().strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
    path.write_text("".join(traceback.format_exception(exc)))
    return path


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot raise BrokenPipeError again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def loads_first(fn: Callable[P, int]) -> Callable[P, int]:
    """Mark a command that turns the cyclic collector back on itself once it has loaded what it needs
    (``collector.resume``), rather than ``guarded`` before it runs: a replay's imports happen inside it."""
    fn.loads_first = True  # type: ignore[attr-defined]
    return fn


def guarded(fn: Callable[P, int]) -> Callable[P, None]:
    """Wrap a command: its int result becomes the exit code; an error becomes one line and its code.

    The one root (``CrosshostError``, runner and controller alike) carries its exit code; Ctrl-C is
    130, a closed pipe 141, anything else an internal error (``INTERNAL_ERROR``, 70) with its traceback logged."""

    resumes_itself = getattr(fn, "loads_first", False)

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        if not resumes_itself:
            collector.resume()  # the start is over: the command runs with the collector on
        try:
            rv = fn(*args, **kwargs)
        except CrosshostError as exc:
            typer.echo(printable(exc.one_line()), err=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(INTERRUPTED) from None
        except typer.Exit:
            raise
        except BrokenPipeError:
            # `crosshost history --json | head`: the reader left; say nothing more, as cat(1) does.
            _silence_stdout()
            raise typer.Exit(141) from None
        except Exception as exc:  # the last line of defence: log it, say where
            path = _debug_log(exc)
            typer.echo(printable(f"internal error: {type(exc).__name__}: {exc} (traceback in {path})"), err=True)
            raise typer.Exit(INTERNAL_ERROR) from None
        raise typer.Exit(rv or 0)

    return wrapper


@app.callback()
def _root() -> None:
    """crosshost: the same suite on several hosts; which verdicts moved when only the host changed."""


def app_for(args: list[str]) -> typer.Typer:
    """``app`` with only the command ``args`` names: typer reads every command's parameters (their
    annotations evaluated) before it parses one, ~30 ms of every start spent on commands not run.
    Its help, options, errors and exit codes are the whole app's (tests/orchestrator/test_cli_one_command.py);
    no command, an option first, a group (``export``, ``cache``) or an unknown name: the whole app."""
    name = args[0] if args else ""
    named = [
        c for c in app.registered_commands
        if c.callback is not None and (c.name or typer.main.get_command_name(c.callback.__name__)) == name
    ]  # fmt: skip
    if len(named) != 1:
        return app
    one = copy.copy(app)
    one.registered_commands = named
    one.registered_groups = []
    return one
