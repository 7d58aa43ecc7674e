"""The built-in file tools open what they checked, never what a link put there since: the runner serves
them as root while the attempt's own processes run and may swap a name for a link between the check
(``ToolBox._path``) and the open. Each race is played deterministically: the swap happens right after
the check."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_runner.tools import ToolBox

CONTRACT = {"contract_id": "c", "tools": [{"name": n} for n in ("read_file", "write_file", "list_dir")]}


def _toolbox(work: Path, swap: tuple[Path, Path] | None) -> ToolBox:
    """A toolbox on ``work`` whose path check is followed, once, by ``swap``: (name, target) - the
    name (a directory) moved aside and made a link to the target, as an attempt's process would."""
    box = ToolBox(CONTRACT, {}, {}, work, {"PATH": "/usr/bin:/bin"})
    checked = box._path

    def check_then_swap(raw: object) -> Path:
        path = checked(raw)  # type: ignore[arg-type]
        if swap is not None:
            name, target = swap
            name.rename(name.with_name(name.name + ".aside"))
            name.symlink_to(target)
        return path

    box._path = check_then_swap  # type: ignore[method-assign]
    return box


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    work, outside = tmp_path / "work", tmp_path / "outside"
    (work / "d").mkdir(parents=True)
    (work / "d" / "f").write_text("inside\n")
    outside.mkdir()
    (outside / "f").write_text("secret\n")
    return work, outside


def test_a_write_through_a_name_swapped_for_a_link_is_refused(layout: tuple[Path, Path]) -> None:
    work, outside = layout
    said = _toolbox(work, (work / "d", outside)).call("write_file", {"path": "d/f", "content": "owned"}, 5)
    assert said.error is not None, said
    assert (outside / "f").read_text() == "secret\n"


def test_a_new_file_through_a_name_swapped_for_a_link_is_not_made(layout: tuple[Path, Path]) -> None:
    work, outside = layout
    said = _toolbox(work, (work / "d", outside)).call("write_file", {"path": "d/new", "content": "x"}, 5)
    assert said.error is not None, said
    assert not (outside / "new").exists()


def test_a_read_through_a_name_swapped_for_a_link_is_refused(layout: tuple[Path, Path]) -> None:
    work, outside = layout
    said = _toolbox(work, (work / "d", outside)).call("read_file", {"path": "d/f"}, 5)
    assert said.error is not None and "secret" not in said.observation, said


def test_a_listing_through_a_name_swapped_for_a_link_is_refused(layout: tuple[Path, Path]) -> None:
    work, outside = layout
    (outside / "only-outside").touch()
    said = _toolbox(work, (work / "d", outside)).call("list_dir", {"path": "d"}, 5)
    assert said.error is not None and "only-outside" not in said.observation, said


def test_without_a_swap_the_tools_work_links_inside_included(layout: tuple[Path, Path]) -> None:
    """A link inside the workspace to a file inside it is read through, as before; parents are made."""
    work, _ = layout
    (work / "link").symlink_to(work / "d" / "f")
    box = _toolbox(work, None)
    assert box.call("read_file", {"path": "link"}, 5).observation == "inside\n"
    assert box.call("write_file", {"path": "new/deeper/g", "content": "g"}, 5).error is None
    assert (work / "new" / "deeper" / "g").read_text() == "g"
    assert box.call("list_dir", {"path": "."}, 5).observation.split("\n") == ["d/", "link", "new/"]
    assert box.call("read_file", {"path": "new"}, 5).error is not None  # a directory is no file


def test_a_fifo_is_refused_not_waited_on(layout: tuple[Path, Path]) -> None:
    work, _ = layout
    os.mkfifo(work / "pipe")
    said = _toolbox(work, None).call("read_file", {"path": "pipe"}, 5)
    assert said.error is not None and "regular file" in said.error, said
