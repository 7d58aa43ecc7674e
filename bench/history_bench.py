"""A replay's cost after its hosts with a long history: the analysis, the reports (report.html's
trend reads the history index) and recording the run in the index, with 1 run in the index and
with 500, alternately in one process; the ratio is the cost of the history's length.

Usage: ``python -m bench.history_bench [--runs 500] [--tasks 100] [--reps 7]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.analysis_bench import RunShape, make_run_dir

TARGET_RATIO = 1.5  # flat but for drawing 60 trend points where one run draws one, and the noise


def _run_with_history(root: Path, runs: int, shape: RunShape) -> Path:
    """A finished run under ``root`` whose index holds ``runs`` runs of its suite, itself included."""
    from orchestrator.report import analyse_and_write
    from orchestrator.store import history
    from orchestrator.store.run_row import read_run

    run = make_run_dir(root, shape.traces * 8, shape)
    analyse_and_write(run)
    row = read_run(run)
    with history._connect(root) as conn, history._write(conn):  # the store's own writer, one transaction
        for i in range(runs - 1):
            at = f"2024-01-01T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}.000000+00:00"
            history._insert(conn, dataclasses.replace(row, run_id=f"20240101T000000Z-{i:06x}", started=at))
    history.record_run(root, run)
    with history._connect(root) as conn:
        (indexed,) = conn.execute("SELECT count(*) FROM runs").fetchone()
    if indexed != runs:
        raise RuntimeError(f"{history.index_path(root)}: {indexed} runs indexed, {runs} written")
    return run


def _after_hosts(run: Path) -> float:
    """What a replay does once its hosts are done: analyse, write the reports, record the run."""
    from orchestrator.report import analyse_and_write
    from orchestrator.store.history import after_replay

    t0 = time.perf_counter()
    report = analyse_and_write(run)
    after = after_replay(run, report=report)
    elapsed = time.perf_counter() - t0
    if after.warning:
        raise RuntimeError(after.warning)
    return elapsed


def measure(runs: int = 500, tasks: int = 100, reps: int = 7) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="crosshost-bench-history-"))
    try:
        shape = RunShape(hosts=2, tasks=tasks, attempts=1)
        sizes = (1, runs)
        dirs = {n: _run_with_history(scratch / f"index-{n}", n, shape) for n in sizes}
        times: dict[int, list[float]] = {n: [] for n in sizes}
        for rep in range(reps):
            for n in sizes if rep % 2 == 0 else sizes[::-1]:  # alternate: neither size always goes first
                times[n].append(_after_hosts(dirs[n]))
        small, large = (statistics.median(times[n]) for n in sizes)
        ratio = large / small
        return {
            "runs": runs, "tasks": tasks, "hosts": shape.hosts, "reps": reps,
            "one_run_median_ms": round(small * 1000, 1), "many_runs_median_ms": round(large * 1000, 1),
            "ratio": round(ratio, 2), "target_ratio": TARGET_RATIO, "met": ratio <= TARGET_RATIO,
        }  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def markdown(out: dict[str, Any] | None) -> list[str]:
    """The numbers as make bench's Markdown table (nothing when skipped)."""
    if not out:
        return []
    return [
        "",
        f"| a replay after its hosts ({out['tasks']} tasks x {out['hosts']} hosts) | index of 1 run ms "
        f"| index of {out['runs']} runs ms | ratio | ≤ {out['target_ratio']} |",
        "|---|---|---|---|---|",
        f"| analyse, write the reports, record (median of {out['reps']}) | {out['one_run_median_ms']:.1f} "
        f"| {out['many_runs_median_ms']:.1f} | {out['ratio']:.2f}× | {'yes' if out['met'] else 'NO'} |",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=500)
    p.add_argument("--tasks", type=int, default=100)
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args(argv)
    out = measure(args.runs, args.tasks, args.reps)
    print(json.dumps(out, indent=2))
    return 0 if out["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
