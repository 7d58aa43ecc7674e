"""The cyclic garbage collector while a program starts: paused from its entry point until the
command has loaded what it needs. The controller (``crosshost``) and the runner share it.

A start imports a program's modules: tens (the runner) to hundreds (the controller: typer, pydantic,
paramiko) of thousands of objects and next to no garbage cycles, and each collector pass walks more
of them (a replay: ~90 passes, 30-45 ms of its CPU before the first connect; a runner on a host:
~20 passes, 5-7 ms of every run). ``pause`` is called by a program's entry point only
(``cli.main``; the runner's zipapp boot, ``orchestrator/hosts/runner_boot.py``, and its ``__main__``
run as ``-m``; never by an import or a ``main()`` called in-process: a test process keeps its
collector). ``resume`` is called by ``guarded`` before a command runs, or by the
command itself where it has loaded (``cli_app.loads_first``); ``settle`` by the replay and the
runner's ``run``, which also freeze what they have loaded.
"""

from __future__ import annotations

import gc

_paused = False


def pause() -> None:
    """Turn the collector off for the start, unless something else already did."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    """Turn the collector back on if ``pause`` turned it off; a no-op otherwise (and the second time)."""
    global _paused
    if _paused:
        _paused = False
        gc.enable()


def settle() -> None:
    """The start is over: what is loaded by now (modules, classes, the suite) lives as long as the
    process, so it is frozen out of the collector's sight (its full passes then walk only what the
    command makes; frozen garbage is never freed, one start's worth at most), and the collector runs
    again. Only where ``pause`` turned it off: an in-process caller's objects are not frozen."""
    if _paused:
        gc.freeze()
        resume()
