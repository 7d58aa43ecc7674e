"""The openai agent is a plugin: a suite of built-in kinds runs without importing it (or urllib)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRIAGE = REPO / "examples" / "suites" / "triage"

_PROBE = """
import sys
from agent_runner.__main__ import main
code = main(sys.argv[1:])
print("openai_agent loaded:", "agent_runner.openai_agent" in sys.modules)
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


def test_a_suite_of_built_in_kinds_never_loads_the_openai_plugin(tmp_path: Path) -> None:
    done = _run(tmp_path, "run", "--suite", str(TRIAGE), "--out", str(tmp_path / "out"), "--host", "h")
    assert "openai_agent loaded: False" in done.stdout, done.stderr
    assert (tmp_path / "out" / "results.jsonl").read_text().count("\n") >= 12


def test_the_openai_kind_is_still_found_when_asked_for() -> None:
    from agent_runner import agents

    agents.check_available("openai")  # loads the plugin on demand; raises if it cannot
    assert "openai" in agents._REGISTRY
