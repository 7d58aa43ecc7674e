"""The runner's own cost per attempt, on no-op tasks, at two suite sizes.

The suite is the grid's (``bench.gen_suite`` at S = 0), as a host receives it in its bundle (its
``suite.json`` in place of the TOML files' ``suite.toml``, so the runner reads no TOML): half predicate-only tasks whose
``run_tests.sh`` is ``exit 0`` (one sandboxed start: namespaces, the uid change, ``sh``), half scripted
tasks calling three fixture tools (no process at all). The runner runs as crosshost starts it on a
host (``env -i`` with PATH only, its own workspace root, its traces as frames of one file
(``--trace-stream``, ``agent_runner/trace_stream.py``), as this machine's user: ``pidns+uid`` as
root, the attempts' directories then in a tmpfs of the run's own, ``agent_runner/attempt_memory.py``),
and the whole command is timed. Per attempt = (wall(T) - wall(1)) / (T - 1): the interpreter's
start, the isolation probe and the fingerprint are paid once per run and cancel out. Medians of
``reps`` runs, interleaved so both sizes see the same load.

The start-up is wall(1) itself, the median of a 1-task run: once from the source tree (its bytecode
cached, as in a checkout) and once from ``runner.pyz`` where a host keeps a pushed bundle
(``bundles/<sha>/runner.pyz``), run as there (``python3 runner.pyz run ...``, nothing on PYTHONPATH),
after one run that leaves the compiled copy a later run of the same bundle finds
(``orchestrator/hosts/runner_boot.py``; as root only).

``--network open`` runs the suites with ``network = "open"`` (no network namespace per attempt), so
the two runs side by side give what the attempt's own network costs.

Usage: ``python -m bench.runner_bench [--tasks 100,1000] [--reps 3] [--network isolated|open]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.gen_suite import generate_suite
from orchestrator.hosts.bundle import build_suite_tar, read_suite
from orchestrator.hosts.runner_zipapp import runner_zipapp_bytes

REPO = Path(__file__).resolve().parents[1]
TARGET_MS = 5.0
#: "flat": the larger suite's cost per attempt within this factor (or half a millisecond) of the smaller's
FLAT_FACTOR = 1.25


def _run(suite: Path, scratch: Path, zipapp: Path | None = None) -> float:
    """Wall seconds of one run of ``suite``: from the source tree, or from ``zipapp`` as a host runs it."""
    out, ws = scratch / "out", scratch / "ws"
    shutil.rmtree(out, ignore_errors=True)
    env = {"PATH": os.environ.get("PATH", os.defpath)}
    if zipapp is None:
        env["PYTHONPATH"] = str(REPO)
    runner = [sys.executable, str(zipapp)] if zipapp is not None else [sys.executable, "-m", "agent_runner"]
    started = time.perf_counter()
    done = subprocess.run([*runner, "run", "--suite", str(suite), "--out", str(out),
                           "--workspace-root", str(ws), "--host", "bench", "--trace-stream"],
                          env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"runner exited {done.returncode}: {done.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    bad = [r for r in rows if r["verdict"] != "pass"]
    if bad:
        raise RuntimeError(f"{len(bad)} attempt(s) did not pass: {bad[0]}")
    return wall


def shipped(suite: Path, dest: Path) -> Path:
    """``suite`` as a bundle ships it to a host (``bundle.build_suite_tar``), unpacked at ``dest``."""
    tar, _sha = build_suite_tar(suite, read_suite(suite).data, dest.parent)
    with tarfile.open(tar) as fh:
        fh.extractall(dest)
    tar.unlink()
    return dest


def measure(sizes: tuple[int, ...] = (100, 1000), reps: int = 3, network: str = "isolated") -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="crosshost-runner-bench-"))
    scratch.chmod(0o755)  # the attempts' own uid reaches its workspace, as on a host (else: pidns)
    try:
        suites = {t: generate_suite(scratch / f"suite-{t}", t, 0).root for t in (1, *sizes)}
        if network == "open":
            for suite in suites.values():  # a top-level key: before the first table
                toml = suite / "suite.toml"
                toml.write_text('network = "open"\n' + toml.read_text())
        suites = {t: shipped(suite, scratch / f"shipped-{t}") for t, suite in suites.items()}
        data = runner_zipapp_bytes()
        bundle = scratch / "bundles" / hashlib.sha256(data).hexdigest()
        bundle.mkdir(parents=True)
        zipapp = bundle / "runner.pyz"
        zipapp.write_bytes(data)
        _run(suites[1], scratch / "run", zipapp)  # the first run of a pushed bundle on a host
        walls: dict[int, list[float]] = {t: [] for t in suites}
        zipapp_walls: list[float] = []
        for _ in range(reps):
            for t, suite in suites.items():
                walls[t].append(_run(suite, scratch / "run"))
            zipapp_walls.append(_run(suites[1], scratch / "run", zipapp))
        isolation = json.loads((scratch / "run" / "out" / "fingerprint.json").read_text()).get("isolation")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    base = statistics.median(walls[1])
    per = {t: (statistics.median(walls[t]) - base) / (t - 1) * 1000 for t in sizes}
    small, large = per[sizes[0]], per[sizes[-1]]
    flat = large <= max(small * FLAT_FACTOR, small + 0.5)
    return {
        "sizes": list(sizes), "reps": reps, "isolation": isolation,
        "wall_s": {str(t): w for t, w in walls.items()},
        # the runner's fixed cost per run (interpreter, imports, isolation probe, fingerprint, stray walk)
        "start_ms": {"source": round(base * 1000, 1), "zipapp": round(statistics.median(zipapp_walls) * 1000, 1)},
        "per_attempt_ms": {str(t): round(v, 2) for t, v in per.items()},
        "target_ms": TARGET_MS, "flat": flat,
        "met": all(v <= TARGET_MS for v in per.values()) and flat,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="100,1000", help="suite sizes, comma-separated")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--network", choices=("isolated", "open"), default="isolated")
    args = parser.parse_args(argv)
    out = measure(tuple(int(x) for x in args.tasks.split(",")), args.reps, args.network)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
