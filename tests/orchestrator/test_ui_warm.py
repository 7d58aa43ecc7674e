"""``ui.warm`` loads what rich loads on its first table: a replay calls it while its hosts run, and
the summary and report tables it draws after them then load nothing more."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.rundirs import Attempt, RunSpec, build_run, two_hosts

DRAW = (
    "import io, sys\n"
    "from pathlib import Path\n"
    "from rich.console import Console\n"
    "from orchestrator import ui\n"
    "from orchestrator.analysis import analyse_run\n"
    "report = analyse_run(Path(sys.argv[1]))\n"
    "import orchestrator.report, orchestrator.analysis.attribution\n"
    "if sys.argv[2] == 'warm':\n"
    "    ui.warm()\n"
    "before = set(sys.modules)\n"
    "ui.print_report(report, console=Console(file=io.StringIO(), width=100))\n"
    "print(sorted(set(sys.modules) - before))\n"
)


def test_after_the_warm_up_the_first_report_table_loads_nothing(tmp_path: Path) -> None:
    attempts = {("local", "t1", 0): Attempt("pass"), ("box-b", "t1", 0): Attempt("fail", why="predicate exit 1")}
    run = build_run(tmp_path, RunSpec(hosts=two_hosts(), attempts=attempts))
    root = Path(__file__).resolve().parents[2]

    def loaded(mode: str) -> str:
        done = subprocess.run([sys.executable, "-c", DRAW, str(run), mode], capture_output=True, text=True,
                              timeout=120, cwd=root)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert loaded("cold") != "[]"  # rich loads some of itself on its first table
    assert loaded("warm") == "[]"
