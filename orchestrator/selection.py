"""Which tasks and hosts a command acts on: one syntax, one function, for replay, report and diff.

    --tasks a,b*,c      names or shell-style globs (``fnmatch``: ``*``, ``?``, ``[...]``); default: all
    --exclude 'slow-*'  names or globs taken away from that
    --tags net,disk     only tasks with at least one of these tags (``tags = [...]`` in task.toml)
    --hosts a,b         inventory (or run) host names, comma-separated

A pattern, an exclusion or a tag that matches nothing is bad input naming it and what there is (a
typo never silently selects everything or nothing); so is a selection that leaves no task.
Tasks keep the suite's order, hosts the inventory's.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.errors import InputError


def split_list(value: str | Sequence[str] | None, flag: str = "") -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``; a sequence is taken as already split. A flag given
    but naming nothing (``--hosts ,``) is bad input, never "all"."""
    if value is None:
        return ()
    parts = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(p.strip() for p in parts if p.strip())
    if not names:
        raise InputError(f"{flag or 'a name list'} {value!r}: names nothing; give comma-separated names or leave it out")
    return names


@dataclass(frozen=True)
class TaskSelection:
    tasks: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        tasks: str | Sequence[str] | None = None,
        exclude: str | Sequence[str] | None = None,
        tags: str | Sequence[str] | None = None,
    ) -> TaskSelection:
        return cls(split_list(tasks, "--tasks"), split_list(exclude, "--exclude"), split_list(tags, "--tags"))

    @property
    def everything(self) -> bool:
        return not (self.tasks or self.exclude or self.tags)

    def words(self) -> list[str]:
        """The flags that make this selection again (hints repeat them)."""
        out: list[str] = []
        for flag, values in (("--tasks", self.tasks), ("--exclude", self.exclude), ("--tags", self.tags)):
            if values:
                out += [flag, ",".join(values)]
        return out

    def select(self, tasks: Sequence[str], tags_of: Mapping[str, Sequence[str]] | None, where: str) -> list[str]:
        """The selected tasks of ``tasks``, in their order. ``tags_of``: each task's tags (None: the
        source records no tags, so ``--tags`` cannot be answered); ``where`` names the source."""
        known = ", ".join(tasks) or "none"
        chosen = list(tasks)
        if self.tasks:
            for pattern in self.tasks:
                if not fnmatch.filter(tasks, pattern):
                    raise InputError(f"{where}: --tasks {pattern!r} matches no task (tasks: {known})")
            chosen = [t for t in tasks if any(fnmatch.fnmatchcase(t, p) for p in self.tasks)]
        if self.tags:
            if tags_of is None:
                raise InputError(f"{where}: --tags: no task tags recorded here (a run records them since tags exist)")
            every_tag = sorted({tag for t in tasks for tag in tags_of.get(t, ())})
            for tag in self.tags:
                if tag not in every_tag:
                    raise InputError(f"{where}: --tags {tag!r}: no task has it (tags: {', '.join(every_tag) or 'none'})")
            chosen = [t for t in chosen if set(tags_of.get(t, ())) & set(self.tags)]
        for pattern in self.exclude:
            if not fnmatch.filter(tasks, pattern):
                raise InputError(f"{where}: --exclude {pattern!r} matches no task (tasks: {known})")
            chosen = [t for t in chosen if not fnmatch.fnmatchcase(t, pattern)]
        if not chosen:
            raise InputError(f"{where}: {' '.join(self.words())} selects no task (tasks: {known})")
        return chosen


def select_hosts(hosts: Sequence[str], wanted: Sequence[str], where: str) -> list[str]:
    """``wanted`` of ``hosts``, in ``hosts``' order; an unknown name is bad input naming the known."""
    for name in wanted:
        if name not in hosts:
            raise InputError(f"{where}: no host {name!r} (hosts: {', '.join(hosts) or 'none'})")
    return [h for h in hosts if h in wanted]
