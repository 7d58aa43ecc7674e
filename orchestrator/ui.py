"""Everything crosshost draws on a terminal once a command is over (a replay's live progress is
``orchestrator/progress.py``'s, which uses ``rich`` only where stderr is a terminal).

The commands compute; this module renders what they return. Text that comes from a host, an
inventory, a suite or a trace (host names, task ids, stderr, errors) is never read as Rich markup:
table cells are ``Text`` objects, lines are printed with ``markup=False`` and ``emoji=False``, so a
``[`` in it can neither crash the output nor style it, and ``:warning:`` stays those characters.

The analysis and report modules are imported by the functions that draw a report, not here; a
replay loads this module, and them, while its hosts run.
"""

from __future__ import annotations

import io
import json
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_runner.textguard import printable
from orchestrator.exit_policy import undecided_line
from orchestrator.hosts.fingerprint import run_workspace
from orchestrator.terminal import (
    Console,
    Group,
    RenderableType,
    Table,
    Text,
    WholeColumn,
    box,
    err_console,
    escape,
    out_console,
    plain,
    say,
)

if TYPE_CHECKING:
    from orchestrator.analysis.models import RunReport
    from orchestrator.commands.explain import ExplainOutcome
    from orchestrator.commands.otel import ExportSummary
    from orchestrator.commands.probe import ProbeResult
    from orchestrator.commands.replay import ReplayOutcome
    from orchestrator.commands.repro import ReproOutcome
    from orchestrator.store.history import HistoryEntry, HistoryListing
    from orchestrator.store.records import Manifest
    from orchestrator.store.run_changes import Changes, FieldChange


# ------------------------------------------------------------------------------------------ replay


def summary_table(outcome: ReplayOutcome) -> Table:
    """One row per host: reachable, fingerprint, python, verdict counts, retries, cleanup, error."""
    m = outcome.manifest
    table = Table(title=escape(f"run {m.run_id}  suite {m.suite_name}  ({len(m.tasks)} task(s) x {m.repeat})"))
    for col in ("host", "reachable", "fingerprint", "python", "pass", "fail", "error", "retries", "cleaned"):
        table.add_column(
            col, justify="right" if col in {"pass", "fail", "error", "retries"} else "left",
            no_wrap=col in {"host", "fingerprint", "python"},
        )  # fmt: skip
    table.add_column("problem", overflow="fold")
    for name, rec in m.hosts.items():
        rows = [r for r in outcome.results if r.env == name]
        count = {v: sum(1 for r in rows if r.verdict == v) for v in ("pass", "fail", "error")}
        retries = sum(1 for r in m.retries if r.get("host") == name)
        label = f"{name} (ref)" if name == m.reference else name
        cleaned = {True: plain("yes"), False: plain("NO", "red"), None: plain("-")}[rec.workspace_removed]
        table.add_row(
            plain(label),
            plain("yes") if rec.reachable else plain("no", "red"),
            plain(rec.fingerprint or "-"),
            plain((rec.python or "-").removeprefix("CPython ")),
            str(count["pass"]),
            str(count["fail"]),
            str(count["error"]),
            str(retries),
            cleaned,
            plain(rec.error or ""),
        )
    return table


def interrupted_line(manifest: Manifest) -> str:
    """After Ctrl-C: exactly which hosts' workspaces were removed and which were not."""
    hosts = manifest.hosts.items()
    removed = [h for h, rec in hosts if rec.workspace_removed is True]
    left = [h for h, rec in hosts if rec.workspace_removed is False]
    never = [h for h, rec in hosts if rec.workspace_removed is None]  # not connected: nothing made there
    said = ["interrupted: partial results written"]
    if removed:
        said.append(f"workspace removed on {', '.join(removed)}")
    if left:
        roots = {h.get("name"): h.get("workspace_root") for h in manifest.inventory.get("hosts", [])}
        where = "; ".join(
            f"{h}: {run_workspace(roots.get(h) or '<workspace_root>', manifest.run_id, h)}" for h in left
        )
        said.append(f"workspace NOT removed on {', '.join(left)} (remove by hand, {where})")
    if not removed and not left:
        said.append("no remote workspace was created")
    elif never:
        said.append(f"none created on {', '.join(never)}")
    return "; ".join(said)


def warm() -> None:
    """Draw a small table once, to nowhere: what ``rich`` loads on its first table (its emoji codes,
    its Unicode width data) then loads here. A replay calls this while its hosts run, so its first
    table after them does not wait for that (tests/orchestrator/test_ui_warm.py)."""
    table = Table(title=escape("warm · ✓"))
    table.add_column("✓ … ✗")
    table.add_row(plain("…"), plain("✓"))
    Console(file=io.StringIO(), width=80).print(Group(table, plain("✗")))


def render_replay(
    outcome: ReplayOutcome, *, out: Console | None = None, err: Console | None = None, causes: bool = True
) -> int:
    """What ``crosshost replay`` prints once the run is over: the summary and report on stdout,
    errors and notes on stderr, then the run directory and the exit code with its reason.
    ``causes=False`` (``--explain`` follows and says each flip's cause with its evidence) leaves
    out the report's cause lines, so each cause is said once."""
    out = out or out_console()
    err = err or err_console()
    out.print(WholeColumn(summary_table(outcome)))
    if outcome.report is not None:
        out.print(report_table(outcome.report, causes=causes))
    elif not outcome.manifest.interrupted:
        out.print("analysis not available: the run directory is complete, reports are not written", markup=False)
    for line in outcome.errors.values():
        if line != "interrupted":
            say(err, line)
    if outcome.manifest.interrupted:
        err.print(interrupted_line(outcome.manifest), markup=False, emoji=False)
    for note in outcome.notes:
        say(err, note)
    why = f": {outcome.exit_reason}" if outcome.exit_reason else ""
    say(out, f"run directory: {outcome.run_dir.path}  (exit {outcome.exit_code}{why})")
    return outcome.exit_code


# ------------------------------------------------------------------------------------------ report


_VERDICT_STYLE = {"pass": "green", "fail": "red", "error": "yellow"}
COMPACT_AFTER = 4  # attempts shown as words; more are shown as letters


CAUSE_WIDTH = 160  # characters of a flipped task's cause line under the report table


def report_table(report: RunReport, *, causes: bool = True) -> RenderableType:
    """Tasks × hosts with flips marked, classification and action; then validity and the gate, and
    each flipped task's cause unless ``causes`` is False."""
    from orchestrator.analysis.attribution import cut_words
    from orchestrator.analysis.flips import flipped_attempts
    from orchestrator.report import (
        burn_lines,
        errors_line,
        gate_verdict,
        outside_workspace_lines,
        rate_text,
        rates_legend,
        validity_line,
        weak_line,
    )

    hosts = report.host_names()
    table = Table(title=escape(f"crosshost run {report.run_id}" + (f" · suite {report.suite}" if report.suite else "")))
    table.add_column("task")
    for host in hosts:
        table.add_column(escape(host + (" (ref)" if host == report.reference else "")))
    table.add_column("flip")
    table.add_column("classification")
    table.add_column("action")
    for task in report.tasks:
        cells: list[Text] = [plain(task.task)]
        rates = {r.host: r for r in task.rates}
        for host in hosts:
            flipped = flipped_attempts(task, host, report.reference)
            cell = Text()
            seq = task.verdicts.get(host, [])
            compact = len(seq) > COMPACT_AFTER  # P/F/E letters: eight words a host do not fit a terminal
            for i, verdict in enumerate(seq):
                if i and not compact:
                    cell.append(" ")
                style = _VERDICT_STYLE.get(verdict, "")
                shown = verdict[0].upper() if compact else verdict
                cell.append(shown + ("*" if i in flipped else ""), style=style + (" bold" if i in flipped else ""))
            if host in rates and task.evidence == "statistical":  # deterministic: 0% or 100%, said above
                rate = rates[host]
                cell.append("\n" + rate_text(rate, with_p=True), style="bold" if rate.differs else "dim")
            cells.append(cell)
        cells += [plain("<- flip" if task.flip else ""), plain(task.classification), plain(task.action)]
        table.add_row(*cells)
    validity = plain(validity_line(report), style="green" if report.valid else "bold red")
    gate = plain(gate_verdict(report), style="green" if report.within_gate else "bold red")
    parts: list[RenderableType] = [WholeColumn(table), validity, gate]
    undecided = undecided_line(report)
    if undecided:
        parts.append(plain(undecided, style="bold yellow" if report.inconclusive else "yellow"))
    parts += [plain(line, style="yellow") for line in burn_lines(report)]
    parts += [plain(line, style="yellow") for line in outside_workspace_lines(report)]
    weak = weak_line(report)
    if weak:
        parts.append(plain(weak, style="dim"))
    parts += [plain(f"note: {note}", style="dim") for note in report.notes]
    if report.error_attempts:
        parts.append(plain(errors_line(report), style="yellow"))
    if any(t.flip and t.evidence == "deterministic" for t in report.tasks):
        parts.append(plain("* = verdict differs from the reference's on the same attempt", style="dim"))
    for task in report.tasks if causes else ():
        if task.flip and task.cause:  # one line each; report.md has the whole evidence
            parts.append(plain(cut_words(f"cause {task.task}: {task.cause}", CAUSE_WIDTH)))
    for task in report.tasks:
        for line in task.model_hold:
            if not line.startswith("model held"):  # a divergence is news; a full hold is in report.md
                parts.append(plain(f"{task.task}: {line}", "yellow"))
    whole = sum(all(x.startswith("model held") for x in t.model_hold) for t in report.tasks if t.model_hold)
    if whole:
        parts.append(plain(f"held model: every request answered from the reference's record in {whole} task(s)", "dim"))
    if any(t.evidence == "statistical" for t in report.tasks):
        parts.append(plain(rates_legend(report), style="dim"))
    return Group(*parts)


def print_report(report: RunReport, fmt: str = "table", console: Console | None = None) -> None:
    """``crosshost report``: the table, or the text of one of the report files (``report.FORMATS``)."""
    if fmt == "table":
        (console or out_console()).print(report_table(report))
        return
    import sys

    from orchestrator.report import FORMATS

    sys.stdout.write(FORMATS[fmt](report))
    sys.stdout.flush()


# ----------------------------------------------------------------------------------------- history


def _when(ts: str | None) -> str:
    return ts.replace("T", " ")[:16] if ts else "?"


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}" if x in (0, 1) else f"{x:.1%}"


WIDE_HISTORY = 140  # columns `history --wide` lays its table out in, at least


def history_table(entries: list[HistoryEntry], console: Console, *, wide: bool = False) -> None:
    """A table of runs, oldest first, then what changed in each run against its predecessor.

    The default fits 80 columns: the run id (it starts with the UTC start time), the suite, the flip
    rate, validity, and one ``host:rate`` word per host, wrapped between hosts. ``wide`` adds the
    start time, the kind, repeat, task count and each host's fingerprint."""
    table = Table(
        title="crosshost history", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True
    )
    if wide:
        table.add_column("when (UTC)", no_wrap=True)
    table.add_column("run", no_wrap=True)
    table.add_column("suite", overflow="fold")
    if wide:
        table.add_column("kind")
        table.add_column("repeat", justify="right")
        table.add_column("tasks", justify="right")
    table.add_column("flips", justify="right", no_wrap=True)
    table.add_column("valid", no_wrap=True)
    table.add_column("pass rate per host" + (" (fingerprint)" if wide else ""), overflow="fold")
    for e in entries:
        r = e.row
        names = [str(h["name"]) for h in r.hosts] + [h for h in r.pass_rate if h not in {h["name"] for h in r.hosts}]
        fps = {str(h["name"]): h.get("fingerprint") for h in r.hosts}
        rates = [
            f"{h}:{_rate(r.pass_rate.get(h))}" + (f" ({str(fps.get(h) or '-')[:8]})" if wide else "") for h in names
        ]
        suite = r.suite or "?"
        cells = [plain(_when(r.started or r.finished))] if wide else []
        cells.append(plain(r.run_id))
        cells.append(plain(suite if wide or r.kind == "replay" else f"{suite} ({r.kind})"))
        if wide:
            cells += [plain(r.kind), plain("?" if r.repeat is None else str(r.repeat)), plain(str(len(r.tasks)))]
        cells += [
            plain(_rate(r.flip_rate)),
            {True: plain("yes", "green"), False: plain("no", "red"), None: plain("?")}[r.valid],
            plain(("\n" if wide else "  ").join(rates)),
        ]
        table.add_row(*cells)
    console.print(table)
    for e in entries:
        c = e.changes
        if c is None:
            continue
        head = f"{e.row.run_id} vs {c.previous} ({e.row.suite}):"
        if c.empty:
            say(console, f"{head} no change")
            continue
        say(console, head)
        for line in history_change_lines(c):
            # wrapped at the terminal's width, continuation lines indented like the first
            for part in textwrap.wrap(line, console.width, initial_indent="  ", subsequent_indent="  ",
                                      break_on_hyphens=False):  # fmt: skip
                say(console, part)
    failed = [(e.row.run_id, h) for e in entries for h in e.row.hosts if h.get("error")]
    if failed:
        say(console, "hosts that failed in a run:")
    for run_id, h in failed:
        for part in textwrap.wrap(f"{run_id} {h.get('name')}: {h.get('error')}", console.width,
                                  initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False):  # fmt: skip
            say(console, part)


def history_change_lines(c: Changes) -> list[str]:
    """What moved between two runs; first what makes them different measurements."""
    lines: list[str] = []
    if c.hosts_added or c.hosts_removed:
        lines.append("hosts differ: " + _plus_minus(c.hosts_added, c.hosts_removed))
    if c.tasks_added or c.tasks_removed:
        lines.append("tasks differ: " + _plus_minus(c.tasks_added, c.tasks_removed) + " (compared on the tasks both ran)")
    if c.repeat:
        lines.append(f"repeat differs: {c.repeat['old']} -> {c.repeat['new']} attempts per task")
    for f in c.fingerprints_changed:
        fields = f.get("fields")
        if fields:
            lines.append(f"fingerprint of {f['host']} changed: {f['old']} -> {f['new']}:")
            lines += [f"  {said}" for said in fingerprint_field_lines(fields)]
            continue
        python = ""
        if f.get("python_old") != f.get("python_new"):
            python = f" (python {f.get('python_old') or '?'} -> {f.get('python_new') or '?'})"
        lines.append(f"fingerprint of {f['host']} changed: {f['old']} -> {f['new']}{python}")
    if c.newly_flipping:
        lines.append(f"newly flipping: {', '.join(c.newly_flipping)}")
    if c.stopped_flipping:
        lines.append(f"stopped flipping: {', '.join(c.stopped_flipping)}")
    for moved in c.pins_moved:
        lines.append(f"pin moved: {moved['pin']}: {moved['old']} -> {moved['new']}")
    return lines


def fingerprint_field_lines(fields: list[FieldChange]) -> list[str]:
    """``+ /var/run/docker.sock (burn)``, ``- env VIRTUAL_ENV``, ``locale.LANG C.UTF-8 → C``."""
    lines: list[str] = []
    for f in fields:
        if "added" in f:
            what = "" if f["field"] == "findings" else "env " if f["field"] == "env_keys" else f"{f['field']} "
            lines += [f"+ {what}{x}" for x in f.get("added", [])] + [f"- {what}{x}" for x in f.get("removed", [])]
        else:
            lines.append(f"{f['field']} {_fact(f.get('old'))} → {_fact(f.get('new'))}")
    return lines


def _fact(value: Any) -> str:
    return "unset" if value is None else value if isinstance(value, str) else json.dumps(value)


NAMES_SHOWN = 4  # names listed per "+"/"-" in a history change line; the rest are counted


def _plus_minus(added: list[str], removed: list[str]) -> str:
    def some(names: list[str]) -> str:
        more = f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
        return ", ".join(names[:NAMES_SHOWN]) + more

    return "; ".join(part for part in (f"+ {some(added)}" if added else "", f"- {some(removed)}" if removed else "") if part)


def render_history(
    listing: HistoryListing, *, as_json: bool = False, wide: bool = False, console: Console | None = None
) -> int:
    """``crosshost history``: what the index rebuild said (stderr), then the runs as JSON or a table."""
    import sys

    for note in listing.notes:
        print(note, file=sys.stderr)
    if as_json:
        rows: list[Mapping[str, object]] = [
            {**e.row.to_json(), "changes": e.changes and e.changes.to_json()} for e in listing.entries
        ]
        rows += [f.to_json() for f in listing.failures]
        rows.sort(key=lambda r: str(r.get("started") or r.get("at") or r.get("finished") or ""))
        print(json.dumps(rows, indent=2))
        return 0
    if console is None:
        # --wide asks for every column: lay them out unfolded even where the terminal is narrower
        console = Console(width=max(Console().width, WIDE_HISTORY)) if wide else Console()
    if not listing.entries:
        say(console, f"no runs recorded in {listing.runs_dir}" + (f" for suite {listing.suite}" if listing.suite else ""))
    else:
        history_table(listing.entries, console, wide=wide)
    if listing.failures:
        say(console, "scheduled runs that failed before they started:")
    for f in listing.failures:
        line = f"{_when(f.at)} {f.suite}: scheduled run failed (exit {f.exit_code}): {f.reason}"
        for part in textwrap.wrap(line, console.width, initial_indent="  ", subsequent_indent="    ",
                                  break_on_hyphens=False):  # fmt: skip
            say(console, part)
    return 0


# ------------------------------------------------------------------------------------------- hosts


def _findings_text(findings: list[dict[str, str]]) -> str:
    if not findings:
        return "none"
    return "\n".join(
        f"{f.get('action', '?')}: {f.get('kind', '?')}" + (f" ({f['detail']})" if f.get("detail") else "")
        for f in findings
    )


def render_probe(
    results: Iterable[ProbeResult], inventory_path: Path, *, out: Console | None = None, err: Console | None = None
) -> None:
    """``crosshost hosts``: one row per host on stdout, each host's error on stderr."""
    results = list(results)
    table = Table(title=escape(f"hosts in {inventory_path}"))
    for col in ("host", "transport", "reachable", "hostname", "python", "fingerprint", "isolation findings"):
        table.add_column(col, overflow="fold", no_wrap=col in {"host", "python", "fingerprint"})
    for r in results:
        table.add_row(
            plain(r.name),
            plain(r.transport),
            plain("yes") if r.reachable else plain("no", "red"),
            plain(r.hostname or "-"),
            plain((r.python or "-").removeprefix("CPython ")),
            plain(r.fingerprint or "-"),
            plain(_findings_text(r.findings)) if r.error is None else plain(r.error, "red"),
        )
    (out or out_console()).print(table)
    err = err or err_console()
    for r in results:
        if r.error:
            say(err, r.error)
    for r in results:  # ssh_config directives crosshost does not follow: once per host
        for note in r.notes:
            say(err, f"{r.name}: {note}")


# ------------------------------------------------------------------------------------------- repro


def render_repro(outcome: ReproOutcome, console: Console | None = None) -> None:
    """What a person reads: where the hosts parted, both observations side by side, fingerprint diff."""
    console = console or out_console()

    def line(text: str) -> None:
        console.print(printable(text), markup=False, emoji=False, highlight=False)

    for h, error in outcome.errors.items():
        line(f"{h}: {error}")
    cmp = outcome.comparison
    if cmp is None:
        say(console, f"no comparison: a host produced no trace (run dir {outcome.run_dir})")
        return
    if not cmp.parted:
        verdict = "/".join(str(v) for v in cmp.verdicts.values())
        line(
            f"{cmp.host} and {cmp.against} behaved the same over {cmp.steps_compared} steps "
            f"(verdicts {verdict}); run dir {outcome.run_dir}"
        )
        return
    div = cmp.divergence
    if div is None:
        line(f"{cmp.host} and {cmp.against} took the same steps but their verdicts differ: {cmp.verdicts}")
    else:
        call = div.host if div.host.tool is not None else div.against
        line(
            f"{cmp.host} parts from {cmp.against} at step {div.step} ({div.what}): "
            f"{call.tool} {json.dumps(call.args, sort_keys=True)}"
        )
        table = Table(show_lines=True)
        table.add_column("", no_wrap=True)
        table.add_column(escape(cmp.host), overflow="fold")
        table.add_column(escape(cmp.against), overflow="fold")
        if div.what in ("tool call", "length"):
            table.add_row(
                "call",
                *(
                    plain(f"{s.tool} {json.dumps(s.args, sort_keys=True)}" if s.tool else "(no step)")
                    for s in (div.host, div.against)
                ),
            )
        table.add_row("obs_fp", plain(div.host.obs_fp), plain(div.against.obs_fp))
        if div.host.error or div.against.error:
            table.add_row("error", plain(div.host.error), plain(div.against.error))
        table.add_row(
            "observation",
            plain(div.host.observation or "(not recorded)"),
            plain(div.against.observation or "(not recorded)"),
        )
        console.print(table)
        if outcome.recorded_match:
            line(f"the recorded trace matches {', '.join(outcome.recorded_match)} at that step")
    if cmp.fingerprint_diff:
        fp_table = Table(title="fingerprint fields that differ")
        fp_table.add_column("field", no_wrap=True)
        fp_table.add_column(escape(cmp.host), overflow="fold")
        fp_table.add_column(escape(cmp.against), overflow="fold")
        for name, (a, b) in cmp.fingerprint_diff.items():
            fp_table.add_row(plain(name), plain(json.dumps(a)), plain(json.dumps(b)))
        console.print(fp_table)
    line(f"run dir {outcome.run_dir}")


# ------------------------------------------------------------------------------------- view, export


def say_serving(run_dir: Path, url: str) -> None:
    """``view --serve``: where the run directory is served, and how to stop."""
    say(out_console(), f"serving {run_dir} at {url} (Ctrl-C to stop)")


def render_export(summary: ExportSummary) -> None:
    """``export otel``: what went where; each attempt left out on stderr."""
    for line in summary.skipped:
        say(err_console(), f"skipped {line}")
    say(
        out_console(),
        f"exported {summary.spans} span(s) of {summary.attempts} attempt(s) to {summary.destination} "
        f"in {summary.requests} request(s)",
    )


# ----------------------------------------------------------------------------------------- explain


def render_explain(outcome: ExplainOutcome, console: Console | None = None) -> None:
    """Per flipped task its cause (explain's evidence first), then what explain spent."""
    from orchestrator.analysis.attribution import path_line, trial_line

    console = console or out_console()

    def line(text: str) -> None:
        say(console, text)

    for host, error in outcome.errors.items():
        line(f"{host}: {error}")
    report = outcome.report
    if report is None or not outcome.record.tasks:
        line(f"nothing to explain: no flipped task in {outcome.run_dir}")
        return
    reference = report.reference or ""
    explained = {e.task for e in outcome.record.tasks}
    for task in report.tasks:
        if task.task not in explained or task.explain is None:
            continue
        line(f"{task.task}: {task.cause}")
        for cf in task.explain.counterfactuals:
            line(f"  {trial_line(cf, reference)}")
        for evidence in task.explain.paths:
            said = path_line(evidence)
            if said not in (task.cause or ""):  # the cause line names it already
                line(f"  {said}")
        for note in task.explain.not_collected:
            line(f"  {note}")
    if report.explain:
        line(report.explain)
    line(f"evidence: {outcome.run_dir / 'explain.json'}; report.md and report.json carry it")
