"""What a replay's controller has not imported by the time its hosts are connected: the retry
library (a connect that succeeds at once needs none) and rich (the progress off a terminal prints
plain lines; the tables load while the hosts run). Each is on every replay's wall time otherwise.
And the cyclic collector, paused while the replay starts, is on again by then."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fleet import SshdHosts

pytestmark = pytest.mark.sshd

SUITE = Path(__file__).resolve().parents[2] / "examples" / "suites" / "triage"

# crosshost replay, with every SSH connect watched: what is imported once it is made
WATCHED = """
import atexit, gc, json, os, sys
import orchestrator.hosts.transport as transport

made = []
real = transport.SshHost


def watched(*args, **kwargs):
    host = real(*args, **kwargs)
    made.append([sorted(m for m in ("rich", "tenacity", "orchestrator.ui") if m in sys.modules), gc.isenabled()])
    return host


transport.SshHost = watched
from orchestrator.cli import main

def write_made():
    with open(os.environ["WATCHED_OUT"], "w") as f:
        json.dump(made, f)


atexit.register(write_made)  # the command's end runs atexit's handlers, then no more Python
sys.argv = ["crosshost", *sys.argv[2:]]
main()
"""


def test_a_replay_connects_its_hosts_before_importing_rich_or_the_retry_library_and_with_the_collector_on(
    sshd_hosts: SshdHosts, tmp_path: Path
) -> None:
    out = tmp_path / "made.json"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
           "XDG_CACHE_HOME": str(tmp_path), "WATCHED_OUT": str(out)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", WATCHED, "-", "replay", str(SUITE), "-i", str(sshd_hosts.inventory_path),
         "--hosts", "box-a,box-b", "--tasks", "healthy-no-writes", "--repeat", "1", "--out", str(tmp_path / "runs")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stdout + done.stderr
    made = json.loads(out.read_text())
    # the first host connected before either import (a later one may connect once the first host's
    # run has started loading the tables), and the collector (paused for the start) on at each
    assert len(made) == 2 and made[0] == [[], True] and all(gc_on for _, gc_on in made)
    assert "box-a  done" in done.stderr and "box-b  done" in done.stderr  # the progress, as plain lines
    assert "run directory:" in done.stdout and "healthy-no-writes" in done.stdout  # the tables, after
