"""The terminal's primitives every renderer shares, and the one module that imports ``rich``: the consoles, untrusted text as a table cell, a
title or a line (shown as it is, never read as Rich markup), and a table whose first column is never
cut. ``orchestrator/ui.py`` draws with them once a command is over, ``orchestrator/progress.py``
while a replay runs."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.markup import escape as _markup_escape
from rich.measure import Measurement
from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

from agent_runner.textguard import printable

if TYPE_CHECKING:
    from rich.live import Live

__all__ = [
    "Console", "Group", "RenderableType", "Table", "Text", "WholeColumn", "box", "err_console", "escape",
    "live_view", "out_console", "plain", "say",
]  # fmt: skip


def plain(text: object, style: str = "") -> Text:
    """Untrusted text as a table cell: shown as it is, never parsed as markup (titles and column
    headers, which Rich styles itself, are ``escape``d instead)."""
    return Text(printable(text), style=style)


def escape(text: str) -> str:
    """A title or column header from untrusted text: control characters shown, markup escaped."""
    return _markup_escape(printable(text))


def out_console() -> Console:
    """stdout; not a terminal (CI logs, ``make demo | tee``): wide enough that fingerprints are not cut."""
    return Console() if Console().is_terminal else Console(width=120)


def live_view(console: Console, renderable: Callable[[], RenderableType]) -> Live:
    """A live display on ``console`` that draws ``renderable()`` at each refresh (a terminal only;
    ``rich.live`` is loaded here, when one is drawn)."""
    from rich.live import Live

    return Live(console=console, get_renderable=renderable, refresh_per_second=8, transient=False)


def err_console() -> Console:
    return Console(stderr=True)


def say(console: Console, text: str) -> None:
    """One line of untrusted text, as it is: no markup, no emoji codes, no highlighting, never cut."""
    console.print(printable(text), markup=False, emoji=False, highlight=False, soft_wrap=True)


class WholeColumn:
    """A table whose first column holds identifiers a user pastes back (a task's id into ``--tasks``):
    never cut with "…". Where the table is wider than the terminal, the first column keeps its longest
    value and the others give way down to their longest word. Where even that does not fit (many hosts
    side by side), the table is drawn as several, one under the other: each has the first column and
    as many of the others, in their order, as fit whole (``parts``). Where the first column cannot stay
    whole beside any other, it gets what is left and folds onto more lines. No column is ever cut."""

    def __init__(self, table: Table, measured: dict[int, list[tuple[int, int]]] | None = None) -> None:
        self.table = table
        self.laid_out = [(c.width, c.overflow) for c in table.columns]
        #: by width: each column's narrowest and widest measure, as the table this one is part of
        #: measured them (``ranges``)
        self._measured: dict[int, list[tuple[int, int]]] = measured or {}

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for part in self.parts(console, options):
            yield from part.draw(console, options)

    def draw(self, console: Console, options: ConsoleOptions) -> RenderResult:
        """This table, laid out for ``options`` (``lay_out``), its cells each drawn once."""
        highs = self.lay_out(console, options)
        if highs is not None and self.table.show_header and not self.table.show_footer:
            # every column whole at its longest: the widths rich would measure every cell again for
            # (the header and the cells, as lay_out measured them), given so that it does not
            for column, high in zip(self.table.columns, highs, strict=True):
                column.width = high
        # the table draws through the console's every method, render_lines remembered per cell
        yield from self.table.__rich_console__(cast(Console, _SameCells(console)), options)

    def ranges(self, console: Console, options: ConsoleOptions) -> list[tuple[int, int]]:
        """Each column's narrowest and widest measure (header and cells) as the table was built."""
        columns = self.table.columns
        for column, (width, overflow) in zip(columns, self.laid_out, strict=True):  # as built, at every width
            column.width, column.overflow = width, overflow
        ranges = self._measured.get(options.max_width)  # a measure is capped at the width
        if ranges is None:  # measured at each drawing, never kept: rows may be added before the next
            ranges = []
            for column in columns:
                cells = [Measurement.get(console, options, c) for c in [column.header, *column.cells] if c is not None]
                ranges.append((max((m.minimum for m in cells), default=1), max((m.maximum for m in cells), default=1)))
        return ranges

    def parts(self, console: Console, options: ConsoleOptions) -> list[WholeColumn]:
        """The tables this one is drawn as at ``options``' width: itself where it fits with its other
        columns at their narrowest, or where its first column cannot stay whole beside any other;
        else one table per run of the other columns that fits whole beside the first."""
        ranges = self.ranges(console, options)
        width, longest, others = options.max_width, ranges[0][1], ranges[1:]
        if len(others) < 2 or _fits(longest, [low for low, _ in others], width) or not _fits(
            longest, [min(high for _, high in others)], width
        ):
            return [WholeColumn(self.table, {width: ranges})]  # measured once for this drawing
        runs: list[list[int]] = [[]]
        for i, (_, high) in enumerate(others, start=1):
            if runs[-1] and not _fits(longest, [ranges[j][1] for j in runs[-1]] + [high], width):
                runs.append([])
            runs[-1].append(i)
        return [self._part(run, ranges, width, first=k == 0, last=k == len(runs) - 1)
                for k, run in enumerate(runs)]  # fmt: skip

    def _part(
        self, indexes: list[int], ranges: list[tuple[int, int]], width: int, *, first: bool, last: bool
    ) -> WholeColumn:
        """The first column and the columns at ``indexes`` as a table of their own (the title above the
        first part, the caption under the last)."""
        table = copy.copy(self.table)
        chosen = [0, *indexes]
        table.columns = [dataclasses.replace(self.table.columns[i], _index=n) for n, i in enumerate(chosen)]
        table.title = table.title if first else None
        table.caption = table.caption if last else None
        return WholeColumn(table, {width: [ranges[i] for i in chosen]})

    def lay_out(self, console: Console, options: ConsoleOptions) -> list[int] | None:
        """The columns' widths and overflow for ``options``' width; where the table fits, every column's
        longest value (the widths are then rich's own), else None."""
        columns = self.table.columns
        ranges = self.ranges(console, options)
        room = options.max_width - _overhead(len(columns))
        longest, lows, highs = ranges[0][1], [r[0] for r in ranges[1:]], [r[1] for r in ranges[1:]]
        if _fits(longest, highs, options.max_width):
            return [longest, *highs]
        if _fits(longest, lows, options.max_width):
            first = longest  # whole: the others give way
        else:  # folded anyway: the others keep what they need, the first at least a few words
            first = max(1, min(room - sum(lows), max(min(longest, 16), room - sum(highs))))
        widths = [first, *lows]
        spare = room - sum(widths)
        # what is left goes first to the columns it makes whole with the least
        for i in sorted(range(1, len(widths)), key=lambda i: highs[i - 1] - widths[i]):
            more = max(0, min(spare, highs[i - 1] - widths[i]))
            widths[i] += more
            spare -= more
        for column, width in zip(columns, widths, strict=True):
            column.width, column.overflow = width, "fold"
        return None


def _overhead(columns: int) -> int:
    """A table's characters beside its cells: its borders, and one space of padding each side of a cell."""
    return columns + 1 + 2 * columns


def _fits(first: int, others: list[int], width: int) -> bool:
    """A table of a first column this wide and ``others`` this wide fits ``width`` characters."""
    return first + sum(others) + _overhead(len(others) + 1) <= width


class _SameCells:
    """The console a table is drawn through, where a cell drawn once is not drawn again: a cell of the
    same text, styles, padding and layout as one drawn before in this table takes that one's lines
    (a report's rows repeat a few verdict and classification cells; rich draws each of them through
    its padding, wrapping and cropping). Everything else is the console's own."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._drawn: dict[tuple[Any, ...], list[list[Segment]]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._console, name)

    def render_lines(
        self,
        renderable: RenderableType,
        options: ConsoleOptions | None = None,
        *,
        style: Style | None = None,
        pad: bool = True,
        new_lines: bool = False,
    ) -> list[list[Segment]]:
        key = _cell_key(renderable, options, style, pad, new_lines)
        drawn = self._drawn.get(key) if key is not None else None
        if drawn is None:
            drawn = self._console.render_lines(renderable, options, style=style, pad=pad, new_lines=new_lines)
            if key is not None:
                self._drawn[key] = drawn
        return [list(line) for line in drawn]  # the caller's own lists: rich reshapes them


def _cell_key(
    renderable: RenderableType, options: ConsoleOptions | None, style: Style | None, pad: bool, new_lines: bool
) -> tuple[Any, ...] | None:
    """Everything a padded text cell's lines depend on; None for anything else (drawn as it comes)."""
    if type(renderable) is not Padding or options is None:
        return None
    inner = renderable.renderable
    if type(inner) is Text:
        what: Any = (inner.plain, tuple(inner.spans), inner.style, inner.justify, inner.overflow, inner.no_wrap,
                     inner.end, inner.tab_size)  # fmt: skip
    elif type(inner) is str:
        what = inner
    else:
        return None
    key = (what, renderable.top, renderable.right, renderable.bottom, renderable.left, renderable.style,
           renderable.expand, *vars(options).values(), style, pad, new_lines)  # fmt: skip
    try:
        hash(key)
    except TypeError:  # a value rich allows that cannot be a key: drawn as it comes
        return None
    return key
