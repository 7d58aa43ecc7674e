"""The real CLI on bad input: one line naming the file, exit 2, never an internal error or traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRIAGE = REPO / "examples" / "suites" / "triage"


def _crosshost(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    code = "from orchestrator.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(cwd), "XDG_CACHE_HOME": str(cwd)},
    )  # fmt: skip


def _local_inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text('[[hosts]]\nname = "a"\ntransport = "local"\n')
    return path


def test_replay_out_that_is_a_file_is_bad_input(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "runs"
    not_a_dir.write_text("a file, not a directory\n")
    done = _crosshost("replay", str(TRIAGE), "-i", str(_local_inventory(tmp_path)), "--out", str(not_a_dir), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    assert str(not_a_dir) in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_run_dir_under_a_file_is_an_input_error(tmp_path: Path) -> None:
    import pytest

    from orchestrator.errors import InputError
    from orchestrator.store.rundir import RunDir

    (tmp_path / "f").write_text("")
    with pytest.raises(InputError, match="check --out"):
        RunDir.create(tmp_path / "f" / "runs")


def test_results_jsonl_that_is_not_utf8_is_a_trace_error(tmp_path: Path) -> None:
    import pytest

    from orchestrator.errors import TraceError
    from orchestrator.store.jsonl import read_jsonl

    path = tmp_path / "results.jsonl"
    path.write_bytes(b'{"task": "t"}\n\xff\xfe\n')
    with pytest.raises(TraceError, match="results.jsonl"):
        read_jsonl(path)
