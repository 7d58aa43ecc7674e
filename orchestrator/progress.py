"""A replay's per-host progress: a live table on a terminal, one line per event otherwise (CI, pipes).

Apart from ``orchestrator/ui.py`` (the tables drawn once a command is over) because it starts before
the first host is reached: where stderr is not a terminal it prints its lines without ``rich``,
whose import (and the tables') then happens while the hosts run, off the replay's wall time. The
lines are the ones ``terminal.say`` prints (tests/orchestrator/test_progress.py holds them side by
side); a terminal, or a line with a tab (which ``rich`` expands by cell width), goes through ``rich``.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from agent_runner.textguard import printable

if TYPE_CHECKING:
    from orchestrator.terminal import Console, Live, Table


def draws_on(stream: TextIO) -> bool:
    """Whether ``rich`` takes ``stream`` for a terminal (its ``Console.is_terminal``), without importing
    it. Where it might (an interpreter that fakes a tty aside), this says True and ``rich`` decides."""
    compatible = os.environ.get("TTY_COMPATIBLE", "")
    if compatible in ("0", "1"):
        return compatible == "1"
    force = os.environ.get("FORCE_COLOR")
    if force is not None:
        return force != ""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except ValueError:  # a closed stream
        return False


class PlainLines:
    """``terminal.say`` to a stream that is not a terminal, without ``rich``: the same characters."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._console: Console | None = None

    def __call__(self, text: str) -> None:
        line = printable(text)
        if "\t" in line:  # rich expands a tab to the next 8-cell stop, wide characters counted
            from orchestrator import terminal

            if self._console is None:
                self._console = terminal.Console(file=self.stream)
            terminal.say(self._console, text)
            return
        self.stream.write(line + "\n")
        self.stream.flush()


class ProgressView:
    """Per-host progress: a live table on a terminal, one line per event otherwise (CI, pipes).

    ``console``: a ``rich`` console to draw on (tests); by default stderr, through ``rich`` only
    where it is a terminal."""

    def __init__(self, hosts: list[str], console: Console | None = None) -> None:
        from orchestrator.hosts.workspace import STAGES  # here: the transport is not every command's import

        self.stages = STAGES
        self.hosts = hosts
        self.console = console
        self.state: dict[str, tuple[str, str]] = {h: ("waiting", "") for h in hosts}
        self.retries: dict[str, int] = dict.fromkeys(hosts, 0)
        self.failed_at: dict[str, str] = {}
        self.lock = threading.Lock()
        self.live: Live | None = None
        self._say = self._line_sink()

    def _line_sink(self) -> Callable[[str], None]:
        if self.console is None and not draws_on(sys.stderr):
            return PlainLines(sys.stderr)
        from orchestrator import terminal

        console = self.console = self.console or terminal.err_console()
        return lambda line: terminal.say(console, line)

    def __enter__(self) -> ProgressView:
        if self.console is not None and self.console.is_terminal:
            from orchestrator import terminal

            # The table is built when the display refreshes, from the state then: an event only
            # records its stage (a table per event is hosts x events of work, all under the lock the
            # hosts' workers wait on).
            self.live = terminal.live_view(self.console, self._locked_table)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)  # its last refresh draws the final state

    def __call__(self, host: str, stage: str, detail: str) -> None:
        with self.lock:
            if stage == "retry":
                self.retries[host] = self.retries.get(host, 0) + 1
            elif host in self.state:
                if stage in self.stages and stage != "clean":
                    self.failed_at[host] = stage  # where a failure reported later happened
                self.state[host] = (stage, detail)
            if self.live is not None:
                return
        # printed outside the lock: a host's next stage never waits for another host's line
        self._say(f"{host:>12}  {stage}" + (f": {detail}" if detail else ""))

    def _locked_table(self) -> Table:
        with self.lock:
            return self._table()

    def _table(self) -> Table:
        from orchestrator.terminal import Table, plain

        table = Table(title="replay", show_edge=False)
        table.add_column("host")
        for stage in self.stages:
            table.add_column(stage, justify="center")
        table.add_column("note", overflow="fold")
        for host in self.hosts:
            stage, detail = self.state[host]
            failed = stage == "failed"
            at = self.failed_at.get(host, "connect") if failed else stage
            reached = self.stages.index(at) if at in self.stages else (len(self.stages) if at == "done" else -1)
            cells = []
            for i, _ in enumerate(self.stages):
                if i < reached:
                    cells.append(plain("✓", style="green"))
                elif i == reached:
                    cells.append(plain("✗", style="red") if failed else plain("…", style="yellow"))
                else:
                    cells.append(plain(""))
            note = detail
            if self.retries.get(host):
                note = f"{self.retries[host]} connect retr{'y' if self.retries[host] == 1 else 'ies'}; {note}"
            table.add_row(plain(host), *cells, plain(note))
        return table
