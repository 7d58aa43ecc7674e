"""Analysis benchmark: ``analyse_run`` on a run of N trace lines against json-parsing the same lines.

``make_run_dir`` writes a run directory through the product's own records (manifest via
``orchestrator.store.rundir``; traces, results rows and fingerprints via ``agent_runner.records``) with several hosts, tasks and attempts; a few
tasks differ between hosts in shape or argument values so the diff paths run too, and one task flips.
Each measurement runs in a fresh child process so its peak RSS (``ru_maxrss``) is its own.

Usage: ``python -m bench.analysis_bench [--lines 1000000] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_runner.records import Fingerprint, ResultRow, TraceFinish, TraceHeader, TraceTurn
from agent_runner.trace import fp

TOOLS = ("read_unit_status", "http_get_health", "list_open_ports")
PINS = {"prompt_sha": "a" * 16, "tools_sha": "b" * 16, "predicate_sha": "c" * 16, "contract_sha": "d" * 16,
        "runner_source_sha": "e" * 16, "budget": {"max_steps": 100000, "max_bytes": 1 << 30, "timeout_s": 120}}


@dataclass(frozen=True)
class RunShape:
    hosts: int = 4
    tasks: int = 25
    attempts: int = 2

    @property
    def traces(self) -> int:
        return self.hosts * self.tasks * self.attempts


def _turn_line(step: int, tool: str, args: dict[str, object]) -> str:
    record = TraceTurn(step=step, tool=tool, args=args, args_fp=fp(args), obs_fp=fp(f"{tool}: ok"), latency_ms=1)
    return json.dumps(record.to_json()) + "\n"


def make_run_dir(root: Path, lines: int, shape: RunShape = RunShape()) -> Path:
    """Write ``root/<run_id>/`` holding exactly ``lines`` trace lines; return the run directory."""
    from orchestrator.store.records import HostRecord, Manifest, SuiteRef
    from orchestrator.store.rundir import RunDir, utc_now

    per_trace = lines // shape.traces
    if per_trace < 3:
        raise ValueError(f"{lines} lines are too few for {shape.traces} traces")
    extra = lines - per_trace * shape.traces  # the first traces get one more turn each
    hosts = [f"host-{i}" for i in range(shape.hosts)]
    tasks = [f"task-{i:03d}" for i in range(shape.tasks)]
    run = RunDir.create(root, "bench-analysis")
    fingerprints = {h: f"{i + 1:016x}" for i, h in enumerate(hosts)}
    manifest = Manifest(
        run_id=run.run_id, started=utc_now(), finished=utc_now(),
        suite=SuiteRef(name="bench-analysis", sha="f" * 64, path="bench"),
        gate=0.10, tasks=tasks, repeat=shape.attempts, pins={t: PINS for t in tasks},
        inventory={"hosts": [{"name": h, "transport": "ssh"} for h in hosts]},
        reference=hosts[0], crosshost_version="bench",
    )
    manifest.hosts = {h: HostRecord(reachable=True, fingerprint=fingerprints[h]) for h in hosts}
    run.write_manifest(manifest)
    contract = {"contract_id": "bench.analysis.v1",
                "tools": [{"name": t, "required_args": ["unit"], "forbidden_args": [], "result_shape": []}
                          for t in TOOLS],
                "invariants": ["no_absolute_local_paths", "no_home_directory_strings", "no_hostname_in_tool_args"]}
    run.write_contract(json.dumps(contract).encode())

    rows: list[ResultRow] = []
    index = 0
    for h_i, host in enumerate(hosts):
        hdir = run.host_dir(host)
        (hdir / "traces").mkdir(parents=True)
        fingerprint = Fingerprint(fingerprint=fingerprints[host], hostname=f"bench-{h_i}", python="CPython 3.11.2",
                                  platform="Linux", home="/home/bench", cwd=f"/tmp/bench-{h_i}")
        (hdir / "fingerprint.json").write_text(json.dumps(fingerprint.to_json(), indent=2, sort_keys=True))
        for t_i, task in enumerate(tasks):
            # Rotating per-task patterns; task 1 takes another tool on the last host (a shape
            # difference), task 2 passes other argument values there, task 3 fails there (a flip).
            base = [_turn_line(0, TOOLS[(t_i + k) % 3], {"unit": f"svc-{t_i}-{k % 7}.service"}) for k in range(21)]
            odd_host = h_i == shape.hosts - 1
            for attempt in range(shape.attempts):
                n_turns = per_trace - 2 + (1 if index < extra else 0)
                index += 1
                path = hdir / "traces" / f"{task}.{attempt}.jsonl"
                verdict = "fail" if (odd_host and t_i == 3) else "pass"
                with path.open("w", encoding="utf-8") as out:
                    header = TraceHeader(run_id=run.run_id, host=host, task=task, attempt=attempt,
                                         fingerprint=fingerprints[host], pins=PINS, env_sha=fingerprints[host],
                                         agent="scripted")
                    out.write(json.dumps(header.to_json()) + "\n")
                    chunk = []
                    for step in range(1, n_turns + 1):
                        if odd_host and t_i == 1 and step == n_turns // 2:
                            line = _turn_line(step, TOOLS[(t_i + 1) % 3], {"unit": "other.service"})
                        elif odd_host and t_i == 2 and step % 1000 == 0:
                            line = _turn_line(step, TOOLS[(t_i + step) % 3], {"unit": f"moved-{step}.service"})
                        else:
                            # The step number is the only varying field: splice it into a cached line.
                            line = base[step % 21].replace('"step": 0,', f'"step": {step},', 1)
                        chunk.append(line)
                        if len(chunk) >= 4096:
                            out.writelines(chunk)
                            chunk.clear()
                    out.writelines(chunk)
                    finish = TraceFinish(reason="stop", final="done", predicate_exit=0 if verdict == "pass" else 1,
                                         verdict=verdict, why="ok" if verdict == "pass" else "predicate failed",
                                         wall_ms=5, steps=n_turns, findings=[])
                    out.write(json.dumps(finish.to_json()) + "\n")
                row = ResultRow(task=task, env=host, attempt=attempt, verdict=verdict, reason="stop", run_id=run.run_id,
                                env_sha=fingerprints[host], exit_code=0 if verdict == "pass" else 1, wall_ms=5,
                                fingerprint=fingerprints[host], why=finish.why)
                rows.append(row)
    run.write_results(rows)
    return run.path


def count_trace_lines(run_dir: Path) -> int:
    return sum(sum(1 for _ in p.open("rb")) for p in sorted((run_dir / "hosts").glob("*/traces/*.jsonl")))


# Each child prints one JSON line: seconds of the measured call and its peak RSS in MB.
_CHILD_ANALYSE = """
import json, resource, sys, time
from pathlib import Path
from typing import Any
from orchestrator.analysis.run import analyse_run
t0 = time.perf_counter()
report = analyse_run(Path(sys.argv[1]))
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "tasks": len(report.tasks), "flip_rate": report.flip_rate}))
"""

_CHILD_JSON_LIMIT = """
import json, resource, sys, time
from pathlib import Path
from typing import Any
paths = sorted(Path(sys.argv[1]).glob("hosts/*/traces/*.jsonl"))
t0 = time.perf_counter()
n = 0
for p in paths:
    with open(p, encoding="utf-8") as fh:
        for line in fh:
            json.loads(line)
            n += 1
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "lines": n}))
"""


def _child(code: str, run_dir: Path) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", code, str(run_dir)], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent)
    if proc.returncode != 0:
        raise RuntimeError(f"analysis benchmark child failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def measure(run_dir: Path, reps: int = 1) -> dict[str, Any]:
    """Best-of-``reps`` time and peak RSS for analyse_run and for the json-parse limit."""
    analyse = [_child(_CHILD_ANALYSE, run_dir) for _ in range(reps)]
    limit = [_child(_CHILD_JSON_LIMIT, run_dir) for _ in range(reps)]
    a_s = sorted(float(r["seconds"]) for r in analyse)
    l_s = sorted(float(r["seconds"]) for r in limit)
    a_med, l_med = a_s[len(a_s) // 2], l_s[len(l_s) // 2]
    a_rss = max(float(r["peak_rss_mb"]) for r in analyse)
    return {
        "lines": int(limit[0]["lines"]),
        "reps": reps,
        "analyse_s": a_s,
        "json_limit_s": l_s,
        "analyse_median_s": a_med,
        "json_limit_median_s": l_med,
        "ratio": a_med / l_med if l_med > 0 else None,
        "analyse_peak_rss_mb": a_rss,
        "json_limit_peak_rss_mb": max(float(r["peak_rss_mb"]) for r in limit),
        "target_ratio": 2.0,
        "target_rss_mb": 300,
        "met": bool(l_med > 0 and a_med / l_med <= 2.0 and a_rss < 300),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--dir", type=Path, help="where to write the run (default: a temp dir, removed)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-analysis-") as tmp:
        root = args.dir or Path(tmp)
        run_dir = make_run_dir(root, args.lines)
        print(json.dumps(measure(run_dir, args.reps), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
