"""The crosshost command line. Thin: each command parses, calls one function, renders.

Rendering is ``orchestrator/ui.py``'s; a command's exit code is ``orchestrator/exit_policy.py``'s and
is returned; ``guarded`` maps an error to one line and its exit code (docs/errors-and-exit-codes.md).
The app, ``guarded``, ``app_for`` and the shared options are ``orchestrator/cli_app.py``'s. Add a
command as a small function below; keep logic in the modules it calls.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from agent_runner import collector
from agent_runner.textguard import printable
from orchestrator.cli_app import ExcludeOpt, HostsOpt, TagsOpt, TasksOpt, app, app_for, guarded, loads_first
from orchestrator.errors import CrosshostError
from orchestrator.exit_policy import OK


def main() -> None:
    """Console entry point. The process ends without the interpreter's finalisation
    (orchestrator/exiting.py)."""
    from orchestrator.exiting import end_process

    collector.pause()  # until the command has loaded (agent_runner/collector.py)
    try:
        app_for(sys.argv[1:])()
    except SystemExit as exc:  # how typer ends every command
        end_process(exc.code)
    end_process(0)


@app.command()
@guarded
def version() -> int:
    """Print the crosshost version."""
    from orchestrator import __version__

    typer.echo(__version__)
    return 0


@app.command("replay")
@guarded
@loads_first
def replay_cmd(
    suite: Annotated[Path, typer.Argument(help="The suite directory (suite.toml, tasks/).")],
    inventory: Annotated[Path, typer.Option("-i", "--inventory", help="The hosts.toml to use.")] = Path("hosts.toml"),
    hosts: HostsOpt = None,
    tasks: TasksOpt = None,
    exclude: ExcludeOpt = None,
    tags: TagsOpt = None,
    repeat: Annotated[int | None, typer.Option("--repeat", min=1, help="Attempts per task per host.")] = None,
    out: Annotated[Path, typer.Option("--out", help="Where run directories are written.")] = Path("runs"),
    jobs: Annotated[int | None, typer.Option("--jobs", min=1, help="Hosts at once (default: all, up to 64).")] = None,
    gate: Annotated[float | None, typer.Option("--gate", min=0, max=1, help="Flip-rate gate (default: the suite's).")] = None,
    accept_new: Annotated[bool, typer.Option("--accept-new", help="Trust unknown host keys (first use).")] = False,
    compare_last: Annotated[
        bool, typer.Option("--compare-last", help="Exit 1 when a task newly flips against the previous run.")
    ] = False,
    reference: Annotated[
        str | None,
        typer.Option("--reference", help="The host the others are compared with (default: the first selected)."),
    ] = None,
    slots: Annotated[
        int | None,
        typer.Option("--slots", min=1, help="Attempts at once on every host (default: each host's slots, 1)."),
    ] = None,
    hold_model: Annotated[
        bool | None,
        typer.Option(
            "--hold-model/--no-hold-model",
            help="A live model: answer every host from the reference's model record (default: the suite's).",
        ),
    ] = None,
    explain: Annotated[
        bool, typer.Option("--explain", help="Then explain every flipped task (crosshost explain).")
    ] = False,
    scheduled: Annotated[
        bool,
        typer.Option(
            "--scheduled",
            help="A run crosshost schedule started: a failure before it starts is recorded for crosshost history.",
        ),
    ] = False,
    until_decided: Annotated[
        bool,
        typer.Option(
            "--until-decided",
            help="Rounds of attempts only for tasks still undecided (a sequential rule at alpha, docs/statistics.md).",
        ),
    ] = False,
    max_repeat: Annotated[
        int | None,
        typer.Option("--max-repeat", min=1, max=1000, help="--until-decided: at most this many attempts per host (default 32)."),
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(
            "--shard",
            help="Replay shard K of N of the tasks on every host (K/N, from 1), or the job engine's index "
            "(auto: Slurm array; auto/N: Kubernetes Indexed Job); crosshost merge joins the shards.",
        ),
    ] = None,
    run_id: Annotated[
        str | None,
        typer.Option(
            "--run-id", envvar="CROSSHOST_RUN_ID",
            help="With --shard: the run's id, the same in every shard (default under Slurm: the array's job id).",
        ),
    ] = None,
) -> int:
    """Replay SUITE on every host of the inventory and write runs/<run_id>/.

    Exit 0: valid and within the gate. 1: invalid, over the gate, or a new flip
    (--compare-last). 2: bad input. 3: a host failed or a verdict is error.
    4: inconclusive (tasks left undecided). 130: interrupted.
    """
    from orchestrator.commands.replay import (
        ReplayRequest,
        planned_hosts,
        replay_command,
        until_decided_budget,
    )
    from orchestrator.commands.shards import parse_shard
    from orchestrator.errors import InputError
    from orchestrator.progress import ProgressView
    from orchestrator.selection import split_list

    if shard is not None and explain:
        raise InputError("--explain with --shard: explain the merged run (crosshost explain RUN_DIR)")
    if shard is not None and until_decided:
        raise InputError("--until-decided with --shard: a shard is part of a run; replay the run unsharded")

    def split(v: str | None, flag: str) -> list[str] | None:
        return list(split_list(v, flag)) or None

    request = ReplayRequest(
        suite_dir=suite, inventory_path=inventory, hosts=split(hosts, "--hosts"), tasks=split(tasks, "--tasks"),
        repeat=repeat, out=out, jobs=jobs, gate=gate, accept_new=accept_new, compare_last=compare_last,
        reference=reference, slots=slots,
        exclude=split(exclude, "--exclude"), tags=split(tags, "--tags"), hold_model=hold_model,
        until_decided=until_decided_budget(until_decided, max_repeat),
        shard=parse_shard(shard, run_id, os.environ) if shard is not None else None,
    )  # fmt: skip
    rounds = None
    if request.until_decided is not None:  # the rounds' module (and the analysis it needs) loads only then
        from orchestrator.commands.rounds import replay_until_decided

        rounds = replay_until_decided
    try:
        with ProgressView(planned_hosts(request)) as view:
            outcome = replay_command(request, on_event=view, rounds=rounds)
    except CrosshostError as exc:
        if scheduled:  # no run directory holds it: the one line goes where `history` shows it
            from orchestrator.store.failures import record_failure

            record_failure(out, suite, exc)
        raise
    from orchestrator import ui  # loaded while the hosts ran (commands/replay.py _AFTER_THE_HOSTS)

    code = ui.render_replay(outcome, causes=not explain)
    if not explain or outcome.report is None or not outcome.report.flipped:
        return code
    from orchestrator.commands.explain import ExplainRequest
    from orchestrator.commands.explain import explain as explain_run
    from orchestrator.exit_policy import explain_exit

    explained = explain_run(
        ExplainRequest(run_dir=outcome.run_dir.path, inventory_path=inventory, accept_new=accept_new)
    )
    ui.render_explain(explained)
    return explain_exit(explained.errors, code)


@app.command("merge")
@guarded
def merge_cmd(
    shards: Annotated[list[Path], typer.Argument(help="Every shard directory of one run (replay --shard).")],
    out: Annotated[
        Path | None, typer.Option("--out", help="Where the merged run directory is written (default: beside the shards).")
    ] = None,
) -> int:
    """Join the shards of one run into runs/<run_id>/, analyse it and exit as its unsharded replay would.

    Shards of different runs (run id, suite, pins, reference, hosts, held model), a shard missing or
    given twice: exit 2 with one line. Else as replay: 0 valid and within the gate, 1 a finding,
    3 a host failed or a verdict is error.
    """
    from orchestrator import ui
    from orchestrator.commands.merge import merge_shards

    return ui.render_replay(merge_shards(shards, out))


@app.command("lint")
@guarded
def lint_cmd(
    suite: Annotated[Path, typer.Argument(help="The suite directory (suite.toml, tasks/).")],
) -> int:
    """Check a suite: tools the contract lacks (error), unused fixtures, tasks that cannot fail (warning)."""
    from orchestrator.commands.lint import lint_lines, lint_suite
    from orchestrator.exit_policy import lint_exit

    report = lint_suite(suite)
    for line in lint_lines(report):
        typer.echo(printable(line))  # a suite's names: control characters shown, never obeyed
    return lint_exit(len(report.errors))


@app.command("hosts")
@guarded
def hosts_cmd(
    inventory: Annotated[Path, typer.Option("-i", "--inventory", help="The hosts.toml to use.")] = Path("hosts.toml"),
    accept_new: Annotated[
        bool, typer.Option("--accept-new", help="Record unknown host keys in the tool-owned known_hosts.")
    ] = False,
    suite: Annotated[
        Path | None,
        typer.Option("--suite", help="Digest as a replay of this suite does (with its tools' versions)."),
    ] = None,
) -> int:
    """Per host: reachable, python version, fingerprint digest (as a replay records it), isolation findings."""
    from orchestrator import ui
    from orchestrator.commands.probe import probe
    from orchestrator.exit_policy import probe_exit

    results = probe(inventory, accept_new=accept_new, suite=suite)
    ui.render_probe(results, inventory)
    return probe_exit(r.error for r in results)


@app.command("history")
@guarded
def history_cmd(
    suite: Annotated[str | None, typer.Argument(help="Only runs of this suite.")] = None,
    last: Annotated[int, typer.Option("--last", min=1, help="Show the newest N runs.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    rebuild: Annotated[
        bool, typer.Option("--rebuild", help="Recreate the index from the run directories first.")
    ] = False,
    out: Annotated[Path, typer.Option("--out", help="The runs directory (holds index.sqlite).")] = Path("runs"),
    wide: Annotated[
        bool, typer.Option("--wide", help="Every column: start time, kind, repeat, tasks, fingerprints.")
    ] = False,
) -> int:
    """One row per run (run, suite, flip rate, valid, pass rate per host; fits 80 columns), then what
    changed, starting with what makes two runs different measurements (hosts, tasks, repeat, fingerprints)."""
    from orchestrator import ui
    from orchestrator.store.history import history_listing

    listing = history_listing(out, suite, last, rebuild_index=rebuild)
    return ui.render_history(listing, as_json=as_json, wide=wide)


@app.command("schedule")
@guarded
def schedule_cmd(
    suite: Annotated[Path, typer.Argument(help="The suite directory to replay on a schedule.")],
    every: Annotated[str, typer.Option("--every", help="Interval: 30m, 6h, 1d, ...")] = "6h",
    inventory: Annotated[Path, typer.Option("-i", "--inventory", help="The hosts.toml to replay on.")] = Path(
        "hosts.toml"
    ),
    out: Annotated[Path, typer.Option("--out", help="The runs directory the replays write to.")] = Path("runs"),
    install: Annotated[
        bool, typer.Option("--install", help="Write the systemd user units (and say how to enable them).")
    ] = False,
    cron: Annotated[bool, typer.Option("--cron", help="A crontab line even where systemd runs.")] = False,
    systemd: Annotated[bool, typer.Option("--systemd", help="systemd units even where systemd is absent.")] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Then run the scheduled replay once, in the unit's own environment.")
    ] = False,
) -> int:
    """Print (or --install) a systemd user timer+service, or a crontab line, running replay --compare-last;
    the credentials the run needs go into an environment file (mode 0600) the unit reads."""
    from orchestrator.commands.schedule import schedule

    return schedule(suite, every, inventory, out, install_units=install, cron=cron, systemd=systemd, check=check)


# --- analysis: flips, check, report, diff --------------------------------------------------------


@app.command("flips")
@guarded
def flips_cmd(
    results: Annotated[Path, typer.Argument(help="A results.jsonl: one JSON row per line with task, env, attempt, and verdict or passed.")],
    env_a: Annotated[str, typer.Argument(help="The reference env (host).")],
    env_b: Annotated[str, typer.Argument(help="The env compared with it.")],
    attempt: Annotated[int, typer.Option("--attempt", min=0, help="Which attempt to compare.")] = 0,
    gate: Annotated[float | None, typer.Option("--gate", min=0.0, help="Highest flip rate that passes (default 0.10).")] = None,
) -> int:
    """The attempt-paired flip table of two envs: `<task> <a> <b> [<- flip]`, then the totals; exit 1 above the gate.

    It compares attempt --attempt on A with the same attempt on B. For a sampled agent that pairing means nothing: `crosshost report RUN` judges each host on its pass count with Fisher's exact test (docs/statistics.md)."""
    from orchestrator.analysis.flips import flips_table, format_flips
    from orchestrator.exit_policy import flips_exit

    table = flips_table(results, env_a, env_b, attempt, gate)
    typer.echo(printable(format_flips(table)))  # task and env names from the file: shown, never obeyed
    return flips_exit(table.within_gate)


@app.command("check")
@guarded
def check_cmd(
    contract: Annotated[Path, typer.Argument(help="contract.json")],
    trace: Annotated[Path, typer.Argument(help="A trace (.jsonl), or a JSON {\"tool_calls\": [{\"name\": ..., \"args\": ...}]} document.")],
    fingerprint: Annotated[Path, typer.Argument(help="fingerprint.json (or a JSON list of fingerprints).")],
) -> int:
    """Check a trace against a contract and host fingerprints: PASS, or FAIL and one reason a line."""
    import sys

    from agent_runner.checker import check_files

    return check_files(str(contract), str(trace), str(fingerprint), sys.stdout)


@app.command("report")
@guarded
def report_cmd(
    run: Annotated[Path, typer.Argument(help="A run directory, runs/<run_id>/.")],
    fmt: Annotated[str, typer.Option("--format", help="table, md, json or junit.")] = "table",
    gate: Annotated[float | None, typer.Option("--gate", min=0.0, help="Override the suite's gate.")] = None,
    tasks: TasksOpt = None,
    exclude: ExcludeOpt = None,
    tags: TagsOpt = None,
) -> int:
    """Re-analyse a run, rewrite report.json/report.md/junit.xml, print one; exit as its replay did (0 valid and within the gate, 1 a finding, 3 a host failed, 4 inconclusive).

    With --tasks/--exclude/--tags only those tasks are analysed and printed; the run's report files
    are left as they are."""
    from orchestrator import ui
    from orchestrator.errors import InputError
    from orchestrator.exit_policy import HOST_FAILURE, judged_exit
    from orchestrator.report import FORMATS, analyse_and_write
    from orchestrator.selection import TaskSelection

    if fmt not in (*FORMATS, "table"):
        raise InputError(f"--format {fmt!r}: choose table, md, json or junit")
    result = analyse_and_write(run, gate, TaskSelection.of(tasks, exclude, tags))
    ui.print_report(result, fmt)
    code, why = judged_exit(result)
    if code == HOST_FAILURE:  # a flip or an invalid run the report itself says; which host failed, not so plainly
        ui.say(ui.err_console(), f"exit {code}: {why}")
    return code


@app.command("compare")
@guarded
def compare_cmd(
    run_a: Annotated[Path, typer.Argument(help="A run directory: the first agent (A).")],
    run_b: Annotated[Path, typer.Argument(help="A run of the same suite on the same hosts with another agent (B).")],
    fmt: Annotated[str, typer.Option("--format", help="md or json.")] = "md",
    alpha: Annotated[
        float | None, typer.Option("--alpha", min=0.0, max=1.0, help="Significance level (default: run A's).")
    ] = None,
) -> int:
    """The model gap on the reference host beside each run's host differences; exit 0 when the gap exceeds the box's flips, 1 otherwise, 2 when the runs differ in more than the agent."""
    from orchestrator import report as _report
    from orchestrator.analysis.compare import compare_runs
    from orchestrator.errors import InputError

    renderers = {"md": _report.render_compare_markdown, "json": _report.render_compare_json}
    if fmt not in renderers:
        raise InputError(f"--format {fmt!r}: choose md or json")
    result = compare_runs(run_a, run_b, alpha)
    typer.echo(printable(renderers[fmt](result)), nl=False)
    return result.exit_code


@app.command("diff")
@guarded
def diff_cmd(
    run: Annotated[Path, typer.Argument(help="A run directory, runs/<run_id>/.")],
    hosts: Annotated[
        str | None,
        typer.Option("--hosts", help="a,b: a against b (one name: the reference against it; default: the "
                     "reference against each other host)."),
    ] = None,
    tasks: TasksOpt = None,
    exclude: ExcludeOpt = None,
    tags: TagsOpt = None,
    task: Annotated[str | None, typer.Option("--task", help="Only this task (as --tasks NAME).")] = None,
) -> int:
    """Tool-call shapes (tool, argument keys, value types) as a unified diff; exit 1 when shapes differ."""
    from orchestrator.analysis.diff import run_diff
    from orchestrator.exit_policy import diff_exit
    from orchestrator.selection import TaskSelection, split_list

    selection = TaskSelection.of(tasks or task, exclude, tags)
    result = run_diff(run, split_list(hosts, "--hosts"), selection)
    for line in result.lines:
        typer.echo(printable(line))  # tool names and argument keys from hosts' traces
    return diff_exit(result.differs, result.problems)


@app.command("view")
@guarded
def view_cmd(
    run: Annotated[Path, typer.Argument(help="A run directory, runs/<run_id>/.")],
    serve: Annotated[
        bool, typer.Option("--serve", help="Serve the run directory on 127.0.0.1 (a free port) until Ctrl-C.")
    ] = False,
) -> int:
    """Print the path of the run's report.html (written now if the run predates it), or --serve it."""
    from orchestrator import ui
    from orchestrator.commands import view

    if serve:
        return view.serve(run, lambda url: ui.say_serving(run, url))
    ui.say(ui.out_console(), str(view.ensure_report(run)))
    return OK


export_app = typer.Typer(no_args_is_help=True, help="Send a run to other tools.")
app.add_typer(export_app, name="export")


@export_app.command("otel")
@guarded
def export_otel_cmd(
    run: Annotated[Path, typer.Argument(help="A run directory, runs/<run_id>/.")],
    endpoint: Annotated[
        str | None, typer.Option("--endpoint", help="OTLP/HTTP receiver, e.g. http://127.0.0.1:4318/v1/traces.")
    ] = None,
    file: Annotated[Path | None, typer.Option("--file", help="Append OTLP/JSON lines to this file.")] = None,
    content: Annotated[
        bool, typer.Option("--content", help="Add tool-call arguments (as the trace holds them, redacted).")
    ] = False,
) -> int:
    """The run as OpenTelemetry GenAI traces: invoke_agent per attempt, chat and execute_tool children."""
    from orchestrator import ui
    from orchestrator.commands.otel import export_run

    ui.render_export(export_run(run, endpoint=endpoint, file=file, with_content=content))
    return OK


@app.command("explain")
@guarded
def explain_cmd(
    run: Annotated[Path, typer.Argument(help="The run directory (runs/<run_id>).")],
    task: Annotated[
        list[str] | None, typer.Option("--task", help="A flipped task to explain (repeatable; default: every one).")
    ] = None,
    inventory: Annotated[Path, typer.Option("-i", "--inventory", help="The hosts.toml.")] = Path("hosts.toml"),
    accept_new: Annotated[bool, typer.Option("--accept-new", help="Trust unknown host keys (recorded).")] = False,
) -> int:
    """Why each flipped task flipped: replay it once more and with one environment fact changed."""
    from orchestrator import ui
    from orchestrator.commands.explain import ExplainRequest, explain

    outcome = explain(ExplainRequest(run_dir=run, inventory_path=inventory, tasks=task, accept_new=accept_new))
    ui.render_explain(outcome)
    return outcome.exit_code


@app.command("repro")
@guarded
def repro_cmd(
    trace: Annotated[Path, typer.Argument(help="The recorded trace (.jsonl), or a JSON {\"tool_calls\": [...]} document.")],
    host: Annotated[str, typer.Option("--host", help="The host the incident happened on (inventory name).")],
    inventory: Annotated[Path, typer.Option("-i", "--inventory", help="The hosts.toml.")] = Path("hosts.toml"),
    against: Annotated[
        str | None, typer.Option("--against", help="The good host to compare with (default: the reference).")
    ] = None,
    fixtures_from_trace: Annotated[
        bool, typer.Option("--fixtures-from-trace", help="Answer every tool from the recorded observations.")
    ] = False,
    suite: Annotated[
        Path | None, typer.Option("--suite", help="Take the contract and tools.json from this suite.")
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="The runs directory.")] = Path("runs"),
    accept_new: Annotated[bool, typer.Option("--accept-new", help="Trust unknown host keys (recorded).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print repro.json instead of the table.")] = False,
    run_commands: Annotated[
        bool, typer.Option("--run-commands", help="Run the shell commands the trace recorded (listed without it).")
    ] = False,
    on_local: Annotated[
        bool, typer.Option("--on-local", help="Also run them on a transport = \"local\" host (this machine).")
    ] = False,
) -> int:
    """Replay a recorded trace on HOST and a good host; show the first step where they part."""
    import json as _json

    from orchestrator import ui
    from orchestrator.commands import repro as _repro

    outcome = _repro.repro(
        _repro.ReproRequest(
            trace=trace,
            host=host,
            inventory_path=inventory,
            against=against,
            fixtures_from_trace=fixtures_from_trace,
            suite_dir=suite,
            out=out,
            accept_new=accept_new,
            run_commands=run_commands,
            on_local=on_local,
        )
    )
    if as_json:
        typer.echo(_json.dumps(outcome.record.to_json() if outcome.record is not None else {}, indent=2))
    else:
        ui.render_repro(outcome)
    return outcome.exit_code


cache_app = typer.Typer(no_args_is_help=True, help="The local bundle cache ($XDG_CACHE_HOME/crosshost/bundles).")
app.add_typer(cache_app, name="cache")


@cache_app.command("prune")
@guarded
def cache_prune_cmd() -> int:
    """Empty the local bundle cache (a replay rebuilds what it needs)."""
    from orchestrator.hosts.bundle import user_bundle_cache
    from orchestrator.hosts.bundle_cache import empty_local_cache

    cache = user_bundle_cache()
    count, size = empty_local_cache(cache)
    typer.echo(f"removed {count} file(s), {size / 1e6:.1f} MB, from {cache}")
    return 0


if __name__ == "__main__":
    main()
