"""The report table as ``WholeColumn`` draws it (the widths given where the table fits, a cell drawn
once per table and its lines reused) is, byte for byte, the table rich draws itself after the same
layout (the plain way, kept here as the reference): at every width, on a terminal in colour or not,
for a run's report and for the whole of what ``crosshost replay`` prints."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console, ConsoleOptions, RenderResult

from orchestrator import terminal, ui
from orchestrator.analysis import analyse_run
from orchestrator.analysis.models import RunReport
from orchestrator.commands.replay import ReplayOutcome
from orchestrator.store.jsonl import iter_results
from orchestrator.store.rundir import RunDir
from orchestrator.terminal import Table, Text, WholeColumn, plain
from tests.support.rundirs import Attempt, RunSpec, build_run, fingerprint, two_hosts


class PlainWholeColumn(WholeColumn):
    """The same layout, then each of its tables drawn by rich itself: every cell measured and drawn again."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for part in self.parts(console, options):
            part.lay_out(console, options)
            yield part.table


NAMES = ["agree-000", "deploy-missing-version-" + "x" * 40, "[bold]markup[red]-task", "任务-ü-wide", "t\tab"]


def _run(tmp_path: Path, repeat: int) -> Path:
    """Sixty tasks: agreeing, flipping, failing and erroring on both, odd names, and sampled tasks (a
    rate line under their verdicts); more than four attempts are shown as letters."""
    attempts: dict[tuple[str, str, int], Attempt] = {}
    sampled: list[str] = []
    for i in range(60):
        name = f"{NAMES[i % len(NAMES)]}-{i:02d}"
        kind = i % 6
        for n in range(repeat):
            ref, other = {0: ("pass", "pass"), 1: ("pass", "fail"), 2: ("fail", "fail"), 3: ("error", "pass"),
                          4: ("pass", "pass" if n else "fail"), 5: ("pass", "fail" if n % 2 else "pass")}[kind]  # fmt: skip
            attempts[("local", name, n)] = Attempt(ref, why=f"{ref} why")
            attempts[("box-b", name, n)] = Attempt(other, why=f"{other} why")
        if kind == 5:
            sampled.append(name)
    return build_run(tmp_path, RunSpec(hosts=two_hosts(), attempts=attempts, manifest_extra={"sampled": sampled}))


CONSOLES: list[dict[str, Any]] = [
    {"width": 200},
    {"width": 120},
    {"width": 80, "force_terminal": True, "color_system": "truecolor"},
    {"width": 60, "force_terminal": True, "color_system": "standard"},
    {"width": 40},
    {"width": 24, "force_terminal": True, "color_system": "256"},
]


def _drawn(monkeypatch: pytest.MonkeyPatch, cls: type[WholeColumn], draw: Any, **console: Any) -> str:
    monkeypatch.setattr(ui, "WholeColumn", cls)
    out = io.StringIO()
    draw(Console(file=out, **console))
    return out.getvalue()


@pytest.fixture(scope="module", params=[3, 6], ids=["3-attempts", "6-attempts"])
def run(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[tuple[Path, RunReport]]:
    path = _run(tmp_path_factory.mktemp("run"), request.param)
    yield path, analyse_run(path)


@pytest.mark.parametrize("console", CONSOLES, ids=[str(c["width"]) + c.get("color_system", "") for c in CONSOLES])
def test_the_report_table_is_the_one_rich_draws_itself(
    monkeypatch: pytest.MonkeyPatch, run: tuple[Path, RunReport], console: dict[str, Any]
) -> None:
    _, report = run

    def draw(c: Console) -> None:
        ui.print_report(report, console=c)

    plain_text = _drawn(monkeypatch, PlainWholeColumn, draw, **console)
    assert _drawn(monkeypatch, WholeColumn, draw, **console) == plain_text
    if console["width"] >= 120:  # narrower, the words fold across lines and colours
        assert "<- flip" in plain_text and "% [" in plain_text and "infra_error" in plain_text


@pytest.mark.parametrize("console", CONSOLES[:3], ids=["200", "120", "80truecolor"])
def test_what_a_replay_prints_is_what_it_printed(
    monkeypatch: pytest.MonkeyPatch, run: tuple[Path, RunReport], console: dict[str, Any]
) -> None:
    path, report = run
    rd = RunDir(path)
    outcome = ReplayOutcome(rd, rd.read_manifest(), 1, report=report, results=[r for _, r in iter_results(rd.results_path)],
                            exit_reason="1 task(s) flipped")  # fmt: skip

    def draw(c: Console) -> None:
        ui.render_replay(outcome, out=c, err=c)

    assert _drawn(monkeypatch, WholeColumn, draw, **console) == _drawn(monkeypatch, PlainWholeColumn, draw, **console)


def test_a_table_drawn_again_at_another_width_is_drawn_for_that_width() -> None:
    """The same table, narrow then wide then narrow: each drawing is the plain one at its width (the
    widths given for one width, and the cells remembered, never leak into the next drawing)."""
    table = Table(title="t")
    for header in ("task", "a", "b"):
        table.add_column(header)
    for i in range(30):
        spans = Text()  # the same text in other colours: another cell
        spans.append("pass", style=("green", "red", "bold")[i % 3])
        table.add_row(plain(f"task-{i % 3}-" + "n" * (i % 7)), spans, plain("fail" if i % 2 else "pass", "red" if i % 4 else ""))
    fast, reference = WholeColumn(table), PlainWholeColumn(table)
    for width in (30, 120, 25, 200, 60):
        drawn = []
        for renderable in (fast, reference):
            out = io.StringIO()
            Console(file=out, width=width, force_terminal=True, color_system="truecolor").print(renderable)
            drawn.append(out.getvalue())
        assert drawn[0] == drawn[1], width


def test_a_cell_drawn_once_is_not_drawn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """What makes it cheaper: a 100-row table of a few distinct cells draws each of them once."""
    table = Table()
    for header in ("task", "a", "b"):
        table.add_column(header)
    for i in range(100):
        table.add_row(plain(f"task-{i}"), plain("pass"), plain("agree"))
    drawn: list[Any] = []
    real = Console.render_lines

    def counted(self: Console, renderable: Any, *args: Any, **kwargs: Any) -> Any:
        drawn.append(renderable)
        return real(self, renderable, *args, **kwargs)

    monkeypatch.setattr(Console, "render_lines", counted)
    Console(file=io.StringIO(), width=120).print(terminal.WholeColumn(table))
    cells = [r for r in drawn if type(r).__name__ == "Padding"]
    assert len(cells) == 100 + 2 + 3  # every task id, "pass" and "agree" once, the three headers


@pytest.mark.parametrize("console", CONSOLES, ids=[str(c["width"]) + c.get("color_system", "") for c in CONSOLES])
def test_many_hosts_drawn_as_several_tables_are_the_ones_rich_draws_itself(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, console: dict[str, Any]
) -> None:
    """Twenty hosts: at most widths the report is drawn as several tables (``WholeColumn.parts``)."""
    hosts = {"local": fingerprint("devbox-ref", "a" * 16), **{f"box-{i:02d}": fingerprint(f"box-{i:02d}", f"{i:016x}")
                                                              for i in range(1, 20)}}  # fmt: skip
    attempts = {(h, t, n): Attempt("fail" if (h, t, n) == ("box-03", "flaky-1", 1) else "pass", why="w")
                for h in hosts for t in ("flaky-1", "steady-2", NAMES[1]) for n in range(2)}  # fmt: skip
    report = analyse_run(build_run(tmp_path, RunSpec(hosts=hosts, attempts=attempts)))

    def draw(c: Console) -> None:
        ui.print_report(report, console=c)

    plain_text = _drawn(monkeypatch, PlainWholeColumn, draw, **console)
    assert _drawn(monkeypatch, WholeColumn, draw, **console) == plain_text
    if console["width"] == 120:
        assert plain_text.count("┃ task") > 1
