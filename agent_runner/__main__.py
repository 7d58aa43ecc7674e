"""``python -m agent_runner`` (and ``python3 runner.pyz``): fingerprint, run, check, normalise, version.

Exit codes: 0 ok/PASS, 1 FAIL (check), 2 bad input (the message names file/key), 3 internal failure.
"""

from __future__ import annotations

from . import collector

if __name__ == "__main__":  # a program's start, not an import: before this module's own imports
    collector.pause()  # until the command has loaded (collector.py)

import json
import os
import sys
from types import SimpleNamespace
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Set, Tuple, Union

from . import __version__
from .errors import CrosshostError, InputError, RunnerError

if TYPE_CHECKING:
    import argparse


def _positive_or_none(text: str) -> Optional[int]:
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 1 else None


def _positive(text: str) -> int:
    value = _positive_or_none(text)
    if value is None:
        import argparse

        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return value


#: ``run``'s options, one home for both readers of its command line: (flag, kind, default, help);
#: kind is "required", "text", "int", "positive" or "flag"
_RUN_OPTIONS: Tuple[Tuple[str, str, object, str], ...] = (
    ("--suite", "required", None, "suite directory (suite.toml or suite.json)"),
    ("--out", "required", None, "output directory (fingerprint.json, traces/, results.jsonl)"),
    ("--host", "text", None, "the host's name in results (default: its hostname)"),
    ("--run-id", "text", None, "run id (default: generated)"),
    ("--tasks", "text", None, "comma-separated task ids (default: all)"),
    ("--repeat", "int", None, "attempts per task (default: the suite's repeat)"),
    ("--first-attempt", "int", 0, "the number of the first attempt (default 0; a later round goes on numbering)"),
    ("--workspace-root", "text", None, "where disposable attempt workspaces go (default: a temp dir)"),
    ("--env-allow", "text", None, "comma-separated environment keys the agent may see (default: PATH,LANG,LC_ALL,TZ)"),
    ("--trace-files", "flag", False, "run every process of an attempt (agent, tools, predicate) under strace "
     "where it exists and keep the paths they touched"),
    ("--slots", "positive", 1, "attempts at once, each in its own workspace, HOME, TMPDIR and budget (default 1)"),
    ("--attempts-on-disk", "flag", False, "keep the attempts' directories on the workspace root's file system "
     "(default, as root: in a tmpfs of the run's own over the workspace root)"),
    ("--trace-stream", "flag", False, "write the attempts' traces as frames of one file, out/traces.stream, "
     "which crosshost splits into traces/ when it brings out/ home (default: one file each)"),
    ("--reaped", "text", None, "make PATH when the run ends and no process of any attempt can be left "
     "(pidns+uid, with no child process left); the workspace's removal then does not look for them"),
)
_RUN_FLAGS = {option[0]: option for option in _RUN_OPTIONS}


def _quick_run_args(argv: Sequence[str]) -> Optional[SimpleNamespace]:
    """``run``'s command line as argparse reads it, without argparse: its import and its first regular
    expressions are a few milliseconds of every host's run. Only the plain form the
    controller writes is read here (``--option value`` and ``--flag``, of known options); anything
    else (help, ``--option=value``, an abbreviation, a value that starts with ``-``, a bad number, a
    missing option) is None, and argparse reads it and says what is wrong."""
    if not argv or argv[0] != "run":
        return None
    values: Dict[str, object] = {"command": "run"}
    values.update((flag[2:].replace("-", "_"), default) for flag, _, default, _ in _RUN_OPTIONS)
    given: Set[str] = set()
    at = 1
    while at < len(argv):
        option = _RUN_FLAGS.get(argv[at])
        if option is None:
            return None
        flag, kind, _, _ = option
        dest = flag[2:].replace("-", "_")
        given.add(flag)
        if kind == "flag":
            values[dest] = True
            at += 1
            continue
        if at + 1 == len(argv) or argv[at + 1].startswith("-"):
            return None
        text = argv[at + 1]
        if kind == "int":
            try:
                values[dest] = int(text)
            except ValueError:
                return None
        elif kind == "positive":
            values[dest] = _positive_or_none(text)
            if values[dest] is None:
                return None
        else:
            values[dest] = text
        at += 2
    if any(kind == "required" and flag not in given for flag, kind, _, _ in _RUN_OPTIONS):
        return None
    return SimpleNamespace(**values)


def _parser() -> argparse.ArgumentParser:
    import argparse  # here: a run's plain command line is read without it (_quick_run_args)

    parser = argparse.ArgumentParser(prog="agent_runner", description="The crosshost runner (stdlib only).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    fp = sub.add_parser("fingerprint", help="print this host's fingerprint as JSON")
    fp.add_argument("--cwd", help="the working directory to describe (default: the current one)")
    fp.add_argument("--tools", help="tools.json: record the versions of the commands it allows")
    fp.add_argument("--suite", help="a suite directory: record the versions of the commands its tools allow")
    fp.add_argument("--attempts-on-disk", action="store_true",
                    help="describe the directory as it is (default, as root: as a run's attempts get it, in a "
                    "tmpfs of its own when it is empty)")

    run = sub.add_parser("run", help="replay a suite's tasks on this host")
    for flag, kind, default, text in _RUN_OPTIONS:
        if kind == "flag":
            run.add_argument(flag, action="store_true", help=text)
        elif kind == "required":
            run.add_argument(flag, required=True, help=text)
        elif kind == "int":
            run.add_argument(flag, type=int, default=default, help=text)
        elif kind == "positive":
            run.add_argument(flag, type=_positive, default=default, help=text)
        else:
            run.add_argument(flag, default=default, help=text, metavar="PATH" if flag == "--reaped" else None)

    check = sub.add_parser("check", help="check a trace against a contract: PASS or FAIL, one reason a line")
    check.add_argument("contract")
    check.add_argument("trace")
    check.add_argument("fingerprint", help="fingerprint JSON (an object, or a list of them)")

    norm = sub.add_parser("normalise", help="print a suite directory as the normalised suite.json")
    norm.add_argument("suite")

    mcp = sub.add_parser("mcp", help="serve a task's contract tools over MCP on stdio (for an exec agent)")
    mcp.add_argument("--suite", required=True)
    mcp.add_argument("--task", required=True)
    mcp.add_argument("--workspace", required=True, help="the attempt's workspace (tools are confined to it)")
    mcp.add_argument("--turns", help="append each tool call here (JSON lines) for the attempt's trace")
    mcp.add_argument("--env-keys", default="", help="comma-separated environment keys the tools see")

    sub.add_parser("version", help="print the runner version and runner_source_sha (the digest of its sources)")
    return parser


def _dispatch(args: Union["argparse.Namespace", SimpleNamespace]) -> int:
    if args.command == "fingerprint":
        where = args.cwd or os.getcwd()
        if not args.attempts_on_disk and os.path.isdir(where):  # as a run's attempts get it (attempt_memory)
            from .attempt_memory import mount_over

            mount_over(where)
        from .fingerprint import collect, commands_of
        from .tools import load_policy

        commands: List[str] = commands_of(load_policy(args.tools)) if args.tools else []
        if args.suite:
            from .suite import load_suite

            commands = sorted(set(commands) | set(commands_of(load_suite(args.suite).tools)))
        fingerprint = collect(cwd=args.cwd, allowed_commands=commands)
        print(json.dumps(fingerprint.to_json(), indent=2, sort_keys=True))
        return 0
    if args.command == "check":
        from .checker import check_files

        return check_files(args.contract, args.trace, args.fingerprint, sys.stdout)
    if args.command == "normalise":
        from .suite import normalise_suite

        print(json.dumps(normalise_suite(args.suite), indent=2, sort_keys=True))
        return 0
    if args.command == "mcp":
        from .mcp_server import serve_mcp

        return serve_mcp(args.suite, args.task, args.workspace, args.turns,
                         [k for k in args.env_keys.split(",") if k])
    if args.command == "version":
        from .pins import runner_source_sha

        print(json.dumps({"version": __version__, "runner_source_sha": runner_source_sha()}))
        return 0
    if args.command == "run":
        from .isolation_probe import detect_soon

        if args.workspace_root and not args.attempts_on_disk:  # before any thread: see attempt_memory
            from .attempt_memory import mount_over

            mount_over(args.workspace_root)
        if os.geteuid() == 0:  # before any child: an orphan of this run then stays this process's
            from .privs import make_subreaper

            make_subreaper()
            from .zygote import start_forks

            start_forks()  # before any thread: the zygotes are forks of this small process's
        if os.geteuid() != 0 or args.slots > 1:  # one slot as root: its zygote answers (run_suite)
            detect_soon()  # the isolation probe's processes run while the runner is imported
        from .runner import RunOptions, run_suite

        collector.settle()  # loaded: frozen, and the collector on for the attempts
        options = RunOptions(
            suite=args.suite, out=args.out, host=args.host, run_id=args.run_id,
            tasks=[t for t in args.tasks.split(",") if t] if args.tasks else None,
            repeat=args.repeat, first_attempt=args.first_attempt, workspace_root=args.workspace_root,
            env_allow=[k for k in args.env_allow.split(",") if k] if args.env_allow is not None else None,
            slots=args.slots, trace_files=args.trace_files, trace_stream=args.trace_stream,
            reaped=args.reaped,
        )
        return run_suite(options)
    raise RunnerError(f"unknown command {args.command!r}")


def main(argv: Optional[List[str]] = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    args = _quick_run_args(given) or _parser().parse_args(given)
    if args.command != "run":  # ``run`` turns it on itself, once it has loaded the runner
        collector.resume()
    try:
        return _dispatch(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except CrosshostError as exc:
        print(f"runner error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # the last line of defence: one line plus the traceback on stderr
        import traceback  # here: every run would pay its imports (tokenize, linecache, textwrap)

        traceback.print_exc(file=sys.stderr)
        print(f"runner internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
