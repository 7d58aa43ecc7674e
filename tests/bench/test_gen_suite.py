import subprocess
import sys
import time
from pathlib import Path

from agent_runner.suite import load_suite
from bench.gen_suite import generate_suite


def test_suite_loads_with_both_kinds_of_task(tmp_path: Path) -> None:
    bench = generate_suite(tmp_path / "s", tasks=7, sleep_ms=50)
    suite = load_suite(tmp_path / "s")
    kinds = {t.id: t.agent.kind for t in suite.tasks}
    assert sorted(kinds) == bench.tasks
    assert [k for k in bench.tasks if kinds[k] == "none"] == bench.predicate_tasks
    assert len(bench.predicate_tasks) == 4 and len(bench.scripted_tasks) == 3
    assert all(kinds[t] == "scripted" for t in bench.scripted_tasks)


def test_predicate_sleeps_the_given_time_and_passes(tmp_path: Path) -> None:
    bench = generate_suite(tmp_path / "s", tasks=1, sleep_ms=120)
    script = bench.root / "tasks" / bench.predicate_tasks[0] / "repo" / "run_tests.sh"
    start = time.perf_counter()
    proc = subprocess.run([str(script)])
    assert proc.returncode == 0
    assert time.perf_counter() - start >= 0.12


def test_runner_passes_every_generated_task(tmp_path: Path) -> None:
    generate_suite(tmp_path / "s", tasks=4, sleep_ms=0)
    proc = subprocess.run([sys.executable, "-m", "agent_runner", "run", "--suite", str(tmp_path / "s"),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rows = (tmp_path / "out" / "results.jsonl").read_text().splitlines()
    assert len(rows) == 4
    assert all('"verdict": "pass"' in r for r in rows), rows
