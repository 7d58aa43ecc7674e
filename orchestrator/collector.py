"""The cyclic garbage collector while a command starts: paused from the console entry point until
the command has loaded what it needs.

A start imports typer, pydantic, paramiko and crosshost's modules: hundreds of thousands of objects
and next to no garbage cycles, and each collector pass walks more of them (a replay: ~90 passes,
30-45 ms of its CPU before the first connect, on a busy machine). ``pause`` is called by
``cli.main`` only (never by an import: a test process keeps its collector), ``resume`` by ``guarded``
before a command runs, or by the command itself where it has loaded (``cli_app.loads_first``: the
replay, once its suite is linted and what it has loaded is frozen).
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
