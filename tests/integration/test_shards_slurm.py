"""Shards under a real job engine: a 4-task Slurm job array (tests/support/slurm.py) whose tasks each
run ``crosshost replay --shard auto`` against real sshd hosts, then ``crosshost merge``, judged
against the unsharded replay of the same suite; shards of two different runs are refused.

Kept small: eight deterministic triage tasks, one attempt each, on local and two sshd hosts.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.fleet import SshdHosts
from tests.support.slurm import slurm_cluster

pytestmark = pytest.mark.sshd

REPO = Path(__file__).resolve().parents[2]
TRIAGE = REPO / "examples" / "suites" / "triage"
CROSSHOST = Path(sys.executable).with_name("crosshost")
#: deterministic agents; locale-probe flips on the sshd hosts (their sessions have no LANG)
TASKS = [
    "fix-nginx-config", "healthy-no-writes", "label-honest-bug", "locale-probe",
    "metrics-retry-budget", "restart-unhealthy-only", "shape-shifter", "unknown-unit",
]  # fmt: skip
SHARDS = 4


def _replay_args(inventory: Path, out: Path) -> list[str]:
    return ["replay", str(TRIAGE), "-i", str(inventory), "--out", str(out), "--tasks", ",".join(TASKS),
            "--repeat", "1"]  # fmt: skip


def _crosshost(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CROSSHOST), *args], capture_output=True, text=True, timeout=300)


def _report(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "report.json").read_text()))


def _judged(report: dict[str, Any]) -> dict[str, Any]:
    return {
        "classifications": {t["task"]: t["classification"] for t in report["tasks"]},
        "flips": {t["task"]: t["flip"] for t in report["tasks"]},
        "verdicts": {t["task"]: t["verdicts"] for t in report["tasks"]},
        "flip_rate": report["flip_rate"],
        "stats": report["stats"],
        "valid": report["valid"],
    }


def test_a_slurm_array_of_shards_merges_into_the_unsharded_run(sshd_hosts: SshdHosts, tmp_path: Path) -> None:
    inventory = sshd_hosts.inventory_path
    whole = _crosshost(*_replay_args(inventory, tmp_path / "whole"))
    whole_dir = next(p for p in (tmp_path / "whole").iterdir() if (p / "manifest.json").is_file())
    assert whole.returncode in (0, 1), whole.stderr  # no host failed

    shards = tmp_path / "shards"
    work = tmp_path / "slurm"
    work.mkdir()
    script = tmp_path / "shard.sh"
    command = shlex.join([str(CROSSHOST), *_replay_args(inventory, shards), "--shard", "auto"])
    script.write_text(f"#!/bin/sh\nexec {command}\n")
    script.chmod(0o755)
    with slurm_cluster() as cluster:
        job = cluster.run_array(script, SHARDS, workdir=work, env=dict(os.environ), timeout_s=280)
    run_id = f"slurm-crosshost-{job}"
    shard_dirs = sorted(shards.iterdir())
    assert [p.name for p in shard_dirs] == [f"{run_id}.shard-{k}-of-{SHARDS}" for k in range(1, SHARDS + 1)]
    replayed = []
    for k, shard_dir in enumerate(shard_dirs, start=1):
        manifest = json.loads((shard_dir / "manifest.json").read_text())
        assert (manifest["shard"]["index"], manifest["shard"]["count"]) == (k, SHARDS)
        assert list(manifest["hosts"]) == ["local", "box-a", "box-b"]  # every shard on every host
        replayed += manifest["tasks"]
    assert sorted(replayed) == TASKS

    merged = _crosshost("merge", *map(str, shard_dirs), "--out", str(tmp_path / "merged"))
    merged_dir = tmp_path / "merged" / run_id
    assert merged.returncode == whole.returncode, merged.stdout + merged.stderr
    assert _judged(_report(merged_dir)) == _judged(_report(whole_dir))
    assert _report(merged_dir)["flipped"] >= 1  # locale-probe: a comparison that found something

    # a shard of another run (same suite, same hosts) does not complete this one
    other = _crosshost(*_replay_args(inventory, tmp_path / "other"), "--shard", f"2/{SHARDS}", "--run-id", "other")
    assert other.returncode == 0, other.stderr
    mixed = [shard_dirs[0], tmp_path / "other" / f"other.shard-2-of-{SHARDS}", *shard_dirs[2:]]
    refused = _crosshost("merge", *map(str, mixed), "--out", str(tmp_path / "mixed"))
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "run id 'other', not" in refused.stderr
    assert not (tmp_path / "mixed").exists() or not any((tmp_path / "mixed").iterdir())
