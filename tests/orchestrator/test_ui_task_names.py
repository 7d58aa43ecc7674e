"""A task's id is what a user pastes into --tasks: no terminal table cuts it, at 80 columns either."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator import ui
from orchestrator.analysis import analyse_run
from tests.support.rundirs import Attempt, RunSpec, build_run, fingerprint, two_hosts

_BOX = re.compile(r"[│┃]")


def _report_at(tmp_path: Path, names: list[str], width: int) -> list[str]:
    attempts: dict[tuple[str, str, int], Attempt] = {}
    for name in names:
        for n in (0, 1):
            attempts[("local", name, n)] = Attempt("pass")
            attempts[("box-b", name, n)] = Attempt("fail", why="predicate exit 1")
    report = analyse_run(build_run(tmp_path, RunSpec(hosts=two_hosts(), attempts=attempts)))
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None, force_terminal=True)
    ui.print_report(report, console=console)
    return console.export_text().splitlines()


def _task_cells(lines: list[str]) -> list[str]:
    """The task column's text, row by row (a wrapped name's lines joined)."""
    cells: list[str] = []
    for line in lines:
        if not line.startswith("│"):
            continue
        cell = _BOX.split(line)[1].strip()
        cells.append(cell)
    return cells


@pytest.mark.parametrize("name", ["deploy-missing-version", "restart-unhealthy-only"])
def test_a_task_name_stays_whole_on_its_row_at_80_columns(tmp_path: Path, name: str) -> None:
    lines = _report_at(tmp_path, [name, "short"], 80)
    assert max(len(line) for line in lines if line.startswith(("│", "┃", "┏", "└"))) <= 80
    row = next(line for line in lines if name[:5] in line)
    assert name in row, "\n".join(lines)


def test_a_name_longer_than_the_terminal_is_wrapped_never_cut(tmp_path: Path) -> None:
    name = "a-very-long-task-identifier-" + "x" * 70
    lines = _report_at(tmp_path, [name], 80)
    assert "…" not in "\n".join(_task_cells(lines))
    assert "".join(_task_cells(lines)).startswith(name)


def test_a_table_printed_narrow_then_wide_is_laid_out_for_each_width(tmp_path: Path) -> None:
    name = "a-task-name-that-folds-at-sixty-columns"
    attempts = {("local", name, 0): Attempt("pass"), ("box-b", name, 0): Attempt("fail", why="predicate exit 1")}
    report = analyse_run(build_run(tmp_path, RunSpec(hosts=two_hosts(), attempts=attempts)))
    table = ui.report_table(report)
    for width in (60, 200):
        console = Console(file=io.StringIO(), width=width, record=True, color_system=None, force_terminal=True)
        console.print(table)
        lines = console.export_text().splitlines()
        assert max(len(line) for line in lines) <= width
    assert any(name in line and "<- flip" in line for line in lines), "\n".join(lines)  # whole at 200


def _many_hosts_report_at(tmp_path: Path, hosts: int, tasks: list[str], width: int) -> tuple[list[str], list[str]]:
    names = ["local", *(f"box-{i:02d}" for i in range(1, hosts))]
    fingerprints = {n: fingerprint(n, f"{i:016x}") for i, n in enumerate(names)}
    attempts = {(h, t, 0): Attempt("fail" if (h, t) == ("box-07", tasks[0]) else "pass", why="w")
                for h in names for t in tasks}  # fmt: skip
    report = analyse_run(build_run(tmp_path, RunSpec(hosts=fingerprints, attempts=attempts)))
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None, force_terminal=True)
    ui.print_report(report, console=console)
    return console.export_text().splitlines(), names


def test_many_hosts_side_by_side_are_drawn_as_several_tables_each_with_every_task_whole(tmp_path: Path) -> None:
    """32 hosts do not fit 120 columns even at their narrowest: the table is drawn as several, each
    with the task column whole and a run of hosts in order; every host's header once, no line wider
    than the terminal (folded into one-character columns, no task's id could be read)."""
    tasks = ["deploy-missing-version", "restart-unhealthy-only", "short"]
    lines, hosts = _many_hosts_report_at(tmp_path, 32, tasks, 120)
    drawn = [line for line in lines if line.startswith(("│", "┃", "┏", "└", "┡"))]
    assert max(len(line) for line in drawn) <= 120, "\n".join(lines)
    headers = [cell.strip() for line in lines if line.startswith("┃") for cell in _BOX.split(line)[1:-1]]
    parts = headers.count("task")
    assert parts > 1
    assert [h for h in headers if h.startswith(("local", "box-"))] == ["local (ref)", *hosts[1:]]
    for task in tasks:
        assert len([cell for cell in _task_cells(lines) if cell == task]) == parts, "\n".join(lines)
    assert headers[-3:] == ["flip", "classification", "action"]  # the last part, once


def test_a_table_that_fits_is_one_table(tmp_path: Path) -> None:
    lines, _ = _many_hosts_report_at(tmp_path, 3, ["a-task"], 120)
    assert sum(line.startswith("┏") for line in lines) == 1
