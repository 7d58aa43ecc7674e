"""The Slurm test cluster is a real one: a job array submitted with sbatch runs every task once,
each told its index and the array's size the way a job engine tells `crosshost replay --shard auto`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.slurm import slurm_cluster
from tools.slurmcluster import SlurmError


def test_a_job_array_runs_each_task_once_with_its_index_and_count(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "task.sh"
    script.write_text(
        "#!/bin/sh\n"
        'echo "$SLURM_ARRAY_TASK_ID $SLURM_ARRAY_TASK_COUNT $MARK" > "task-$SLURM_ARRAY_TASK_ID.txt"\n'
    )
    script.chmod(0o755)
    with slurm_cluster() as cluster:
        assert cluster.running() == ["munged", "slurmctld", "slurmd"]
        job = cluster.run_array(script, 4, workdir=work, env={**os.environ, "MARK": "from-the-submitter"})
    assert job > 0 and cluster.running() == []  # stopped with the block: nothing left behind
    lines = sorted(p.read_text().split() for p in work.glob("task-*.txt"))
    assert lines == [[str(i), "4", "from-the-submitter"] for i in range(4)]


def test_a_failing_task_fails_the_array_and_says_which(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "task.sh"
    script.write_text('#!/bin/sh\n[ "$SLURM_ARRAY_TASK_ID" != 2 ] || { echo "task two broke"; exit 7; }\n')
    script.chmod(0o755)
    with slurm_cluster() as cluster, pytest.raises(SlurmError) as failed:
        cluster.run_array(script, 3, workdir=work)
    message = str(failed.value)
    assert "1 of 3 task(s) failed" in message and "task 2: FAILED, exit 7:0" in message
    assert "task two broke" in message
