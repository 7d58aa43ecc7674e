"""The cyclic collector is paused from ``cli.main`` until a command has loaded: no collector pass
walks the start's imports, and every command runs with the collector on (a replay from the point
it turns it on itself, before any host is touched)."""

from __future__ import annotations

import gc
import subprocess
import sys

from agent_runner import collector

PROBE = """
import gc, sys
from agent_runner import collector
from orchestrator import cli
from orchestrator.cli_app import guarded, loads_first

passes = []
gc.callbacks.append(lambda phase, info: passes.append(1) if phase == "start" else None)


def probe() -> int:
    print(len(passes), gc.isenabled())
    return 0


def loading() -> int:
    print(gc.isenabled(), end=" ")
    collector.resume()
    print(gc.isenabled())
    return 0


cli.app.command("probe-gc")(guarded(probe))
cli.app.command("loading-gc")(guarded(loads_first(loading)))
passes.clear()
sys.argv = ["crosshost", sys.argv[1]]
cli.main()
"""


def _run(command: str) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE, command], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_command_starts_without_collector_passes_and_runs_with_the_collector_on() -> None:
    passes, enabled = _run("probe-gc").split()
    assert enabled == "True"
    assert passes == "0"  # typer's parse, pydantic's import with it: no pass over them


def test_a_command_that_loads_first_turns_the_collector_on_itself() -> None:
    assert _run("loading-gc") == "False True"


def test_resume_does_nothing_where_pause_did_not_turn_it_off() -> None:
    assert gc.isenabled()
    gc.disable()
    try:
        collector.pause()  # already off: not ours to turn back on
        collector.resume()
        assert not gc.isenabled()
    finally:
        gc.enable()
