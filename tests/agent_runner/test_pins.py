"""Pins describe what was shipped: caches an agent or interpreter writes beside it never move them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from agent_runner.pins import tree_sha
from tests.support.runner import TRIAGE, run_runner


def test_tree_sha_ignores_caches_but_not_content(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text("print('hi')\n")
    before = tree_sha(tmp_path)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "agent.cpython-311.pyc").write_bytes(b"\x00compiled")
    (tmp_path / "stray.pyc").write_bytes(b"\x00")
    assert tree_sha(tmp_path) == before
    (tmp_path / "agent.py").write_text("print('changed')\n")
    assert tree_sha(tmp_path) != before


def test_a_command_agent_importing_a_module_keeps_its_pin_across_attempts(tmp_path: Path) -> None:
    """The triage command agents import protocol.py: nothing of the run (agent/__pycache__) is written
    into the suite (on a host, the bundle cache), and attempt 1's agent_sha equals attempt 0's, or the
    run is declared invalid for 'pins differ' on a host that changed nothing."""
    suite = tmp_path / "triage"
    shutil.copytree(TRIAGE, suite, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "out"
    done = run_runner("run", "--suite", str(suite), "--out", str(out), "--tasks", "leaky-workdir", "--repeat", "2")
    assert done.returncode == 0, done.stderr
    assert not (suite / "agent" / "__pycache__").exists()
    shas = {
        json.loads((out / "traces" / f"leaky-workdir.{n}.jsonl").read_text().splitlines()[0])["pins"]["agent_sha"]
        for n in (0, 1)
    }
    assert len(shas) == 1
