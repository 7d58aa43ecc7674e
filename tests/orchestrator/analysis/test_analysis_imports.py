"""The analysis of a run without a held model does without the held model's module and the model
APIs it imports: a replay loads the analysis while its hosts run, on the controller's CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.rundirs import Attempt, RunSpec, build_run, two_hosts

ANALYSE = (
    "import sys\n"
    "from pathlib import Path\n"
    "from orchestrator.analysis import analyse_run\n"
    "report = analyse_run(Path(sys.argv[1]))\n"
    "print(len(report.tasks), 'orchestrator.model.hold' in sys.modules)\n"
)


def test_a_run_without_a_held_model_is_analysed_without_its_module(tmp_path: Path) -> None:
    attempts = {("local", "t1", 0): Attempt("pass"), ("box-b", "t1", 0): Attempt("fail", why="predicate exit 1")}
    run = build_run(tmp_path, RunSpec(hosts=two_hosts(), attempts=attempts))
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", ANALYSE, str(run)], capture_output=True, text=True, timeout=120,
                          cwd=root)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "False"]
    (run / "model_hold.json").write_text("{}")  # a held model's run: the module loads and reads it
    done = subprocess.run([sys.executable, "-c", ANALYSE, str(run)], capture_output=True, text=True, timeout=120,
                          cwd=root)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "True"]
