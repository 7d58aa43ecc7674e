"""``attempts_in_memory`` in the inventory reaches the host's runner: a replay on two local hosts, one
keeping the default (its attempts in a tmpfs of the run's own) and one set to ``false`` (on the
workspace root's file system), each predicate saying what its attempt's directory is on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.commands.replay import ReplayRequest, replay_command
from tests.support.runner import (
    ATTEMPTS_ROOT_MOUNT_SH,
    own_machine_python,
    passable_to_attempts,
    predicate_suite,
)

pytestmark = pytest.mark.root

PREDICATE = ATTEMPTS_ROOT_MOUNT_SH + 'echo "attempts on: ${fs:-none}"\n'


def test_the_inventory_key_decides_where_each_hosts_attempts_live(tmp_path: Path) -> None:
    passable_to_attempts(tmp_path)
    suite = predicate_suite(tmp_path, PREDICATE, tasks=1)
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(
        "".join(f'[[hosts]]\nname = "{n}"\ntransport = "local"\nworkspace_root = "{tmp_path}/roots/{n}"\n'
                f'python = "{own_machine_python(tmp_path / "machines", n)}"\n' for n in ("mem", "disk"))
        + "attempts_in_memory = false\n"  # the last host's
    )  # fmt: skip
    outcome = replay_command(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs",
                                           cache_dir=tmp_path / "cache"))
    assert outcome.errors == {}  # (the run itself is invalid: one machine, one fingerprint, twice)
    [run_dir] = [p for p in (tmp_path / "runs").iterdir() if p.is_dir() and not p.name.startswith(".")]
    said = {}
    for host in ("mem", "disk"):
        [trace] = (run_dir / "hosts" / host / "traces").glob("*.jsonl")
        last = json.loads(trace.read_text().splitlines()[-1])
        said[host] = last["predicate_output"]
    assert said == {"mem": "attempts on: tmpfs", "disk": "attempts on: none"}
