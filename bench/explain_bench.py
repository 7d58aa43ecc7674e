"""explain's cost on the demo: ``crosshost explain`` of the demo's three flipped tasks against a replay
of those three tasks, on this machine and a real sshd host (box-b).

The demo's setting (the triage suite; box-b's own /opt holds the feature flag, box-b runs without
LANG while local pins C.UTF-8), with one change: the stale wheel is planted in box-b's own /tmp, not
in this machine's shared /tmp, so stale-wheel-probe flips the other way at the same cost and
nothing else running here sees it. One replay of the whole suite finds the flipped tasks; then,
``--reps`` times and interleaved (so both see the same load), a replay of only those tasks (the
suite's repeat) and an explain of the run. The target: explain within 3 x that replay + 2 s.

Usage: ``python -m bench.explain_bench [--reps 3]``; part of ``make bench``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tools/ is a plain directory, not an installed package
from tools.testhosts import Fleet, free_port  # noqa: E402

TRIAGE = REPO / "examples" / "suites" / "triage"
STATE = Path("/var/tmp/crosshost-bench-explain")
FLIPPED = ["feature-flag-probe", "locale-probe", "stale-wheel-probe"]


def _inventory(fleet: Fleet, path: Path) -> Path:
    fleet.write_inventory(path, ["box-b"])
    text = path.read_text()
    text = text.replace('transport = "local"', 'transport = "local"\nenv = { LANG = "C.UTF-8" }', 1)
    text = text.replace('name = "box-b"', 'name = "box-b"\nenv = { TZ = "UTC" }', 1)
    path.write_text(text)
    return path


def measure(reps: int = 3, port: int | None = None) -> dict[str, Any]:
    from orchestrator.commands.explain import ExplainRequest, explain
    from orchestrator.commands.replay import ReplayRequest, replay

    fleet = Fleet(STATE)
    fleet.down()
    scratch = Path(tempfile.mkdtemp(prefix="crosshost-bench-explain-"))
    try:
        fleet.up(["box-b"], [port or free_port()])
        host_dir = fleet.hosts["box-b"].dir
        (host_dir / "opt" / "crosshost-demo").mkdir(parents=True, exist_ok=True)
        (host_dir / "opt" / "crosshost-demo" / "feature.flag").touch()
        (host_dir / "tmp" / "crosshost-demo" / "wheels").mkdir(parents=True, exist_ok=True)
        (host_dir / "tmp" / "crosshost-demo" / "wheels" / "triage_tools-0.9-py3-none-any.whl").touch()
        inventory = _inventory(fleet, scratch / "hosts.toml")
        runs = scratch / "runs"
        full = replay(ReplayRequest(suite_dir=TRIAGE, inventory_path=inventory, out=runs))
        assert full.report is not None
        flipped = sorted(t.task for t in full.report.tasks if t.flip)
        if flipped != FLIPPED:
            raise RuntimeError(f"the demo's flips are {FLIPPED}, this replay's {flipped}")
        replay_s: list[float] = []
        explain_s: list[float] = []
        printed: list[str] = []
        for _ in range(reps):
            started = time.monotonic()
            replay(ReplayRequest(suite_dir=TRIAGE, inventory_path=inventory, out=runs, tasks=flipped))
            replay_s.append(time.monotonic() - started)
            started = time.monotonic()
            out = explain(ExplainRequest(run_dir=full.run_dir.path, inventory_path=inventory))
            explain_s.append(time.monotonic() - started)
            if out.exit_code != 0 or out.report is None:
                raise RuntimeError(f"explain exited {out.exit_code}: {out.errors}")
            printed.append(out.report.explain or "")
        replay_med, explain_med = statistics.median(replay_s), statistics.median(explain_s)
        bound = 3 * replay_med + 2
        return {
            "tasks": flipped,
            "replay_s": [round(s, 2) for s in replay_s],
            "explain_s": [round(s, 2) for s in explain_s],
            "replay_median_s": round(replay_med, 2),
            "explain_median_s": round(explain_med, 2),
            "bound_s": round(bound, 2),
            "met": explain_med <= bound,
            "explain_says": printed,
        }
    finally:
        fleet.down()
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(STATE, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--port", type=int, default=None, help="box-b's port (default: a free one)")
    args = parser.parse_args(argv)
    out = measure(args.reps, args.port)
    print(json.dumps(out, indent=2))
    return 0 if out["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
