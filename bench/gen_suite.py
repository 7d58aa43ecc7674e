"""Generate a benchmark suite in the suite format of docs/suites.md.

Two kinds of task, alternating so that any prefix of the suite holds both:

- ``pred-NNN``: predicate only (``[agent] kind = "none"``); ``repo/run_tests.sh`` sleeps S ms and
  exits 0. This is the work the "limit" baseline also does.
- ``scr-NNN``: a scripted agent calling fixture tools (no predicate, no process started by a tool):
  pure harness overhead, which the limit does not pay at all.

Usage: ``python -m bench.gen_suite OUT --tasks T --sleep-ms S``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

FIXTURE_TOOLS = ("read_unit_status", "http_get_health", "list_open_ports")


@dataclass
class BenchSuite:
    """What the benchmark needs to know about a generated suite."""

    root: Path
    sleep_ms: int
    predicate_tasks: list[str] = field(default_factory=list)
    scripted_tasks: list[str] = field(default_factory=list)

    @property
    def tasks(self) -> list[str]:
        return sorted(self.predicate_tasks + self.scripted_tasks)


def run_tests_sh(sleep_ms: int) -> str:
    """The predicate: sleep S ms, succeed. S = 0 starts no sleep process at all."""
    body = f"sleep {sleep_ms / 1000:.3f}\n" if sleep_ms > 0 else ""
    return "#!/bin/sh\n# benchmark predicate: the task's own work\n" + body + "exit 0\n"


def _contract() -> dict[str, object]:
    return {
        "contract_id": "bench.fixture.v1",
        "tools": [
            {"name": name, "required_args": ["unit"], "forbidden_args": ["ssh_identity"],
             "result_shape": []}
            for name in FIXTURE_TOOLS
        ],
        "invariants": ["no_absolute_local_paths", "no_home_directory_strings", "no_hostname_in_tool_args"],
    }


def _script(index: int) -> list[dict[str, object]]:
    calls = [{"name": name, "args": {"unit": f"svc-{index}.service"}} for name in FIXTURE_TOOLS]
    return [{"tool_calls": calls[:2]}, {"tool_calls": calls[2:]},
            {"content": f"task {index}: all probes answered", "finish": "stop"}]


def generate_suite(out: Path, tasks: int, sleep_ms: int, name: str = "bench") -> BenchSuite:
    """Write a fresh suite with ``tasks`` tasks (half predicate-only, half scripted) under ``out``."""
    if tasks < 1:
        raise ValueError("tasks must be >= 1")
    if sleep_ms < 0:
        raise ValueError("sleep_ms must be >= 0")
    if out.exists():
        shutil.rmtree(out)
    (out / "tasks").mkdir(parents=True)
    (out / "suite.toml").write_text(
        f'name = "{name}"\nrepeat = 1\ncontract = "contract.json"\ntools = "tools.json"\n\n'
        '[agent]\nkind = "scripted"\n\n'
        "[budget]\nmax_steps = 8\nmax_bytes = 32768\ntimeout_s = 60\n\n"
        "[gate]\nflip_rate = 0.10\n"
    )
    (out / "contract.json").write_text(json.dumps(_contract(), indent=1) + "\n")
    (out / "tools.json").write_text(json.dumps({"allow": [], "deny": []}) + "\n")

    suite = BenchSuite(root=out, sleep_ms=sleep_ms)
    for i in range(tasks):
        if i % 2 == 0:
            task_id = f"pred-{i:03d}"
            tdir = out / "tasks" / task_id
            (tdir / "repo").mkdir(parents=True)
            (tdir / "task.toml").write_text(
                'expect_tools = []\nforbid_tools = []\nmust_finish = "stop"\n\n[agent]\nkind = "none"\n'
            )
            (tdir / "prompt.md").write_text(f"Predicate-only benchmark task {i}.\n")
            script = tdir / "repo" / "run_tests.sh"
            script.write_text(run_tests_sh(sleep_ms))
            script.chmod(0o755)
            suite.predicate_tasks.append(task_id)
        else:
            task_id = f"scr-{i:03d}"
            tdir = out / "tasks" / task_id
            tdir.mkdir(parents=True)
            fixtures = "".join(f'{t} = "{t}: ok for svc-{i}"\n' for t in FIXTURE_TOOLS)
            (tdir / "task.toml").write_text(
                f"expect_tools = {json.dumps(list(FIXTURE_TOOLS))}\nforbid_tools = []\n"
                f'must_finish = "stop"\n\n[fixtures]\n{fixtures}'
            )
            (tdir / "prompt.md").write_text(f"Probe the services of benchmark task {i}.\n")
            (tdir / "script.json").write_text(json.dumps(_script(i), indent=1) + "\n")
            suite.scripted_tasks.append(task_id)
    return suite


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--sleep-ms", type=int, default=0)
    args = parser.parse_args(argv)
    suite = generate_suite(args.out, args.tasks, args.sleep_ms)
    print(f"{suite.root}: {len(suite.predicate_tasks)} predicate + {len(suite.scripted_tasks)} scripted tasks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
