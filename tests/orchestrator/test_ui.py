"""The terminal rendering: text from hosts, suites and traces is shown as it is, never as Rich markup."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator import ui
from orchestrator.analysis import analyse_run
from orchestrator.commands.probe import ProbeResult
from orchestrator.commands.replay import ReplayOutcome
from orchestrator.progress import ProgressView
from orchestrator.store.records import HostRecord, Manifest, SuiteRef
from orchestrator.store.rundir import ResultRow, RunDir
from tests.support.rundirs import Attempt, RunSpec, build_run, two_hosts

# An unmatched closing tag makes Rich raise MarkupError; "[bold]" would style the text instead.
HOSTILE = "[/] [bold]boom[/bold] [red]"


def _console(terminal: bool = False) -> Console:
    return Console(file=io.StringIO(), width=300, record=True, color_system=None, force_terminal=terminal)


def _outcome(tmp_path: Path) -> ReplayOutcome:
    manifest = Manifest(
        run_id="r1", started="t", suite=SuiteRef(name=f"suite {HOSTILE}", sha="x", path="p"), reference="local",
        crosshost_version="0", tasks=["t1"],
        hosts={"local": HostRecord(reachable=True, fingerprint="1" * 16),
               "box-b": HostRecord(error=f"box-b: RunnerCrashed: {HOSTILE}")},
    )  # fmt: skip
    rows = [ResultRow(env="local", task="t1", attempt=0, verdict="pass")]
    return ReplayOutcome(RunDir(tmp_path / "r1"), manifest, 3, results=rows, errors={"box-b": "b " + HOSTILE},
                         exit_reason=f"why {HOSTILE}", notes=[f"note {HOSTILE}"])  # fmt: skip


def test_replay_summary_errors_and_reason_show_markup_as_text(tmp_path: Path) -> None:
    out, err = _console(), _console()
    assert ui.render_replay(_outcome(tmp_path), out=out, err=err) == 3
    text, errors = out.export_text(), err.export_text()
    assert f"suite {HOSTILE}" in text and f"RunnerCrashed: {HOSTILE}" in text.replace("\n", "")
    assert f"(exit 3: why {HOSTILE})" in text
    assert f"b {HOSTILE}" in errors and f"note {HOSTILE}" in errors
    assert "\x1b[" not in text + errors  # nothing in it was turned into a style


def test_progress_shows_a_hosts_stderr_as_text_live_and_line_by_line() -> None:
    for terminal in (False, True):
        console = _console(terminal)
        with ProgressView(["box-b"], console) as view:
            view("box-b", "run", "")
            view("box-b", "failed", f"box-b: RunnerCrashed: {HOSTILE}")
        assert f"RunnerCrashed: {HOSTILE}" in console.export_text(), terminal


def test_a_hosts_emoji_codes_stay_text_in_progress_lines_and_errors(tmp_path: Path) -> None:
    said = "box-b: RunnerCrashed: :smile: :warning: exit 1"
    console = _console()
    with ProgressView(["box-b"], console) as view:
        view("box-b", "failed", said)
    outcome = _outcome(tmp_path)
    outcome.errors = {"box-b": said}
    err = _console()
    ui.render_replay(outcome, out=_console(), err=err)
    assert said in console.export_text() and said in err.export_text()


def test_report_table_shows_task_ids_as_text(tmp_path: Path) -> None:
    attempts = {
        ("local", "t1", 0): Attempt("pass"),
        ("box-b", "t1", 0): Attempt("fail", why="predicate exit 1"),
    }
    report = analyse_run(build_run(tmp_path, RunSpec(hosts=two_hosts(), attempts=attempts)))
    report.tasks[0].task = f"t1 {HOSTILE}"
    console = _console()
    ui.print_report(report, console=console)
    row = next(line for line in console.export_text().splitlines() if "t1 " in line)
    assert HOSTILE in row and "fail*" in row and "<- flip" in row


def test_report_table_piped_keeps_task_names_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `crosshost report RUN | less` or `> file`: not a terminal, so not the 80 columns Rich guesses
    name = "feature-flag-probe-on-a-long-name"
    attempts = {("local", name, 0): Attempt("pass"), ("box-b", name, 0): Attempt("fail", why="predicate exit 1")}
    report = analyse_run(build_run(tmp_path, RunSpec(hosts=two_hosts(), attempts=attempts)))
    ui.print_report(report)
    row = next(line for line in capsys.readouterr().out.splitlines() if "<- flip" in line)
    assert name in row and "host_coupling" in row and "quarantine the agent" in row


def test_probe_table_shows_errors_as_text(tmp_path: Path) -> None:
    out, err = _console(), _console()
    results = [ProbeResult("box-b", "ssh", error=f"box-b: HostUnreachable: {HOSTILE}")]
    ui.render_probe(results, tmp_path / "hosts.toml", out=out, err=err)
    assert f"HostUnreachable: {HOSTILE}" in out.export_text()
    assert err.export_text().strip() == f"box-b: HostUnreachable: {HOSTILE}"


def test_interrupted_line_names_the_workspace_left_on_each_host() -> None:
    # after Ctrl-C the user removes these by hand: each host's own directory, not the run id alone
    manifest = Manifest(
        run_id="r1", started="t", suite=SuiteRef(name="s", sha="x", path="p"), reference="local",
        crosshost_version="0", tasks=["t1"],
        inventory={"hosts": [{"name": "local", "workspace_root": "/tmp/crosshost"},
                             {"name": "box-b", "workspace_root": "/srv/ch"},
                             {"name": "box-c", "workspace_root": "/tmp/crosshost"}]},
        hosts={"local": HostRecord(reachable=True, workspace_removed=True),
               "box-b": HostRecord(reachable=True, workspace_removed=False),
               "box-c": HostRecord(reachable=True, workspace_removed=False)},
    )  # fmt: skip
    line = ui.interrupted_line(manifest)
    assert "workspace NOT removed on box-b, box-c (" in line, line
    assert "box-b: /srv/ch/runs/r1-box-b" in line and "box-c: /tmp/crosshost/runs/r1-box-c" in line, line
