"""Attempt numbers and tasks come from what a host sent; the manifest bounds them.

A 40-byte trace named ``t.3000000.jsonl`` (or a results row saying attempt 3000000) must not make
the analysis build millions of rows: it is a problem, not a row. Memory is measured in a fresh
interpreter (its peak RSS), so the number is the analysis's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from orchestrator.analysis import analyse_run
from tests.support.rundirs import Attempt, RunSpec, build_run, two_hosts

ANALYSE = "import sys; from pathlib import Path; from orchestrator.analysis import analyse_run; analyse_run(Path(sys.argv[1]))"
# The peak is read by a small parent of the analysis: a process's own ru_maxrss starts from what the
# process it was forked from (pytest, with scipy loaded) held, not from zero.
MEASURE = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:])
print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
"""


def _bombed(tmp_path: Path) -> Path:
    spec = RunSpec(hosts=two_hosts(), attempts={(h, "t", 0): Attempt() for h in two_hosts()})
    run = build_run(tmp_path, spec)
    traces = run / "hosts" / "box-b" / "traces"
    (traces / "t.3000000.jsonl").write_text('{"type": "header", "task": "t"}\n')  # 40 bytes
    (traces / "ghost.0.jsonl").write_text('{"type": "header", "task": "ghost"}\n')
    row = json.loads((run / "results.jsonl").read_text().splitlines()[0])
    with (run / "results.jsonl").open("a") as f:
        f.write(json.dumps({**row, "attempt": 2_999_999}) + "\n")
    return run


def test_an_attempt_number_bomb_is_a_problem_not_three_million_rows(tmp_path: Path) -> None:
    run = _bombed(tmp_path)
    argv = [sys.executable, "-c", MEASURE, sys.executable, "-c", ANALYSE, str(run)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    code, peak_mb = (int(w) for w in done.stdout.split())
    assert code == 0, done.stderr
    assert peak_mb < 100, f"the analysis peaked at {peak_mb} MB"

    report = analyse_run(run)
    (task,) = [t for t in report.tasks if t.task == "t"]
    assert all(len(verdicts) == 1 for verdicts in task.verdicts.values())
    assert "ghost" not in [t.task for t in report.tasks]
    said = "\n".join(report.problems)
    assert "t.3000000.jsonl: attempt 3000000 of t is past the run's 1 attempt(s)" in said
    assert "ghost.0.jsonl: task 'ghost' is not one the run asked for" in said
    assert "attempt 2999999 of t is past" in said
