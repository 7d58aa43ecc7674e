"""What a shard is: ``crosshost replay --shard K/N`` (or ``auto``) replays one part of one run.

Shard K of N replays the tasks at positions K-1, K-1+N, K-1+2N, ... of the selection (suite order)
on every host, the reference included. So each shard is a complete comparison of its tasks: a held
model is recorded and followed inside the shard, and no shard waits for another, in whatever order
or place the engine starts them. ``--shard auto`` reads the engine's index (a Slurm job array, a
Kubernetes Indexed Job, a GitLab ``parallel`` job). Each shard writes ``<out>/<run_id>.shard-K-of-N/``,
marked in its manifest as shard K of N of run ``run_id``; ``crosshost merge`` (``commands/merge.py``)
joins them. Why by task and not by host, and the recipes per engine: docs/scale.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import InputError
from orchestrator.store.records import ShardRecord

#: a run id given for shards: it names directories here and workspaces on every host
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$")
MAX_SHARDS = 10_000
#: where the environment names the run when none is given (Kubernetes: see docs/scale.md)
RUN_ID_ENV = "CROSSHOST_RUN_ID"


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count`` of run ``run_id``."""

    run_id: str
    index: int
    count: int

    @property
    def label(self) -> str:
        return f"shard {self.index}/{self.count}"

    @property
    def dir_name(self) -> str:
        return f"{self.run_id}.shard-{self.index}-of-{self.count}"

    def take(self, tasks: Sequence[str]) -> list[str]:
        """This shard's tasks: every ``count``-th of ``tasks`` from position ``index - 1``."""
        return list(tasks[self.index - 1 :: self.count])

    def record(self, tasks: Sequence[str]) -> ShardRecord:
        return ShardRecord(run_id=self.run_id, index=self.index, count=self.count, by="task", tasks=list(tasks))


# ------------------------------------------------------------------------------ --shard and the engine


def _int(value: str | None, what: str) -> int:
    if value is None or not value.strip().isdigit():
        raise InputError(f"--shard auto: {what} is {value!r}, not a whole number")
    return int(value)


def engine_index(environ: Mapping[str, str]) -> tuple[str, int, int | None, str | None]:
    """(engine, 1-based index, count or None, the run id it implies or None) from the environment a
    job engine gives each of its tasks; InputError when none is there."""
    if "SLURM_ARRAY_TASK_ID" in environ:
        task = _int(environ.get("SLURM_ARRAY_TASK_ID"), "SLURM_ARRAY_TASK_ID")
        count = _int(environ.get("SLURM_ARRAY_TASK_COUNT"), "SLURM_ARRAY_TASK_COUNT")
        low = _int(environ.get("SLURM_ARRAY_TASK_MIN", "0"), "SLURM_ARRAY_TASK_MIN")
        high = _int(environ.get("SLURM_ARRAY_TASK_MAX", str(low + count - 1)), "SLURM_ARRAY_TASK_MAX")
        step = _int(environ.get("SLURM_ARRAY_TASK_STEP", "1"), "SLURM_ARRAY_TASK_STEP")
        if step != 1 or high - low + 1 != count:
            raise InputError(
                f"--shard auto: the Slurm array is not one range of {count} task(s) "
                f"(SLURM_ARRAY_TASK_MIN={low}, MAX={high}, STEP={step}); submit it as --array=0-{count - 1}"
            )
        job = environ.get("SLURM_ARRAY_JOB_ID", "")
        cluster = environ.get("SLURM_CLUSTER_NAME", "")
        run_id = "-".join(p for p in ("slurm", cluster, job) if p) if job else None
        return "Slurm", task - low + 1, count, run_id
    if "JOB_COMPLETION_INDEX" in environ:  # a Kubernetes Indexed Job: the count is the Job's spec only
        return "Kubernetes", _int(environ.get("JOB_COMPLETION_INDEX"), "JOB_COMPLETION_INDEX") + 1, None, None
    if "CI_NODE_INDEX" in environ:  # GitLab CI `parallel: N`: 1-based
        pipeline = environ.get("CI_PIPELINE_ID")
        return (
            "GitLab CI",
            _int(environ.get("CI_NODE_INDEX"), "CI_NODE_INDEX"),
            _int(environ.get("CI_NODE_TOTAL"), "CI_NODE_TOTAL"),
            f"gitlab-{pipeline}" if pipeline else None,
        )
    raise InputError(
        "--shard auto: no job engine's index in the environment (SLURM_ARRAY_TASK_ID, JOB_COMPLETION_INDEX, "
        "CI_NODE_INDEX); give --shard K/N"
    )


def parse_shard(text: str, run_id: str | None, environ: Mapping[str, str]) -> Shard:
    """``--shard K/N``, ``auto`` or ``auto/N`` with ``--run-id`` (else ``CROSSHOST_RUN_ID``, else the
    engine's job id) as a Shard; InputError naming the flag otherwise."""
    spec = text.strip()
    head, _, tail = spec.partition("/")
    count: int | None = None
    if tail:
        if not tail.isdigit() or int(tail) < 1:
            raise InputError(f"--shard {text}: N must be a whole number from 1 (--shard K/N, auto or auto/N)")
        count = int(tail)
    if count is not None and count > MAX_SHARDS:
        raise InputError(f"--shard {text}: at most {MAX_SHARDS} shards")
    implied: str | None = None
    if head == "auto":
        engine, index, engine_count, implied = engine_index(environ)
        if engine_count is None and count is None:
            raise InputError(
                f"--shard auto: {engine} gives this task's index but not the number of shards; "
                "give --shard auto/N (N: the Job's completions)"
            )
        if engine_count is not None and count is not None and engine_count != count:
            raise InputError(f"--shard {text}: {engine} runs {engine_count} task(s), not {count}")
        count = count if count is not None else engine_count
    elif head.isdigit() and count is not None:
        index = int(head)
    else:
        raise InputError(f"--shard {text}: expected K/N (shard K of N, from 1), auto or auto/N")
    assert count is not None
    if not 1 <= index <= count:
        raise InputError(f"--shard {text}: shard {index} of {count} does not exist (K runs from 1 to N)")
    rid = run_id or environ.get(RUN_ID_ENV) or implied
    if not rid:
        raise InputError(
            f"--shard {text}: every shard of one run needs the same run id: give --run-id ID "
            f"(or set {RUN_ID_ENV}) with the same value in every shard"
        )
    if not _RUN_ID.match(rid) or ".shard-" in rid:
        raise InputError(
            f"--run-id {rid!r}: letters, digits, '.', '_' and '-' only, at most 80, starting with a letter or "
            "digit (it names the run's directory and each host's workspace)"
        )
    return Shard(rid, index, count)


def shard_tasks(shard: Shard, tasks: Sequence[str], out: Path) -> list[str]:
    """The shard's part of the selected ``tasks``; InputError when the split or its directory cannot be."""
    if len(tasks) < shard.count:
        raise InputError(
            f"--shard {shard.index}/{shard.count}: the selection has {len(tasks)} task(s); "
            f"split it into at most {len(tasks)} shard(s)"
        )
    place = out / shard.dir_name
    if place.exists():
        raise InputError(
            f"{place}: {shard.label} of run {shard.run_id} was written already; a shard runs once: "
            "remove that directory to run it again, or give the whole run another --run-id"
        )
    return shard.take(tasks)
