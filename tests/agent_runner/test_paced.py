"""The runner's lines to the controller go out a second's worth at a time, and every one of them
goes out: the same text as writing each line at once, in fewer writes (each write is an SSH packet
the controller reads in Python)."""

from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path

import pytest

from agent_runner import paced
from agent_runner.digests import MARKER
from tests.support.runner import TRIAGE, records, run_runner


class _Counted(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


LINES = [f"{MARKER} {i:064x} traces/t{i}.0.jsonl" for i in range(40)]


@pytest.mark.parametrize("every_s", [0.0, 60.0])
def test_paced_lines_are_the_lines_written_one_at_a_time(monkeypatch: pytest.MonkeyPatch, every_s: float) -> None:
    """0 is the plain way (every line written and flushed alone), the reference; 60 holds them."""
    monkeypatch.setattr(paced, "EVERY_S", every_s)
    stream = _Counted()
    lines = paced.PacedLines(lambda: stream)
    for line in LINES:
        lines.line(line)
    lines.flush()
    assert stream.getvalue() == "".join(line + "\n" for line in LINES)
    # the first line at once, then (held) the other 39 together
    assert stream.writes == (len(LINES) if every_s == 0 else 2)


def test_a_line_after_the_interval_goes_out_with_what_was_held(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(paced.time, "monotonic", lambda: now[0])
    stream = _Counted()
    lines = paced.PacedLines(lambda: stream)
    lines.line("a")  # the first: at once
    now[0] += 0.4
    lines.line("b")  # held
    assert stream.getvalue() == "a\n"
    now[0] += paced.EVERY_S
    lines.line("c")  # a second on: b and c together
    assert stream.getvalue() == "a\nb\nc\n" and stream.writes == 2


def test_a_runs_digests_and_progress_lines_all_reach_its_streams_by_its_end(tmp_path: Path) -> None:
    """A real run (a child process, its streams pipes, as on a host): every file of out/ announced
    with the sha256 of its bytes, one progress line per attempt, in the order the attempts ran."""
    out, ws = tmp_path / "out", tmp_path / "ws"
    done = run_runner("run", "--suite", str(TRIAGE), "--out", str(out), "--host", "local", "--run-id", "r1",
                      "--workspace-root", str(ws))
    assert done.returncode == 0, done.stderr
    said = dict(reversed(line.split()[1:]) for line in done.stdout.splitlines() if line.startswith(MARKER))
    files = {p.relative_to(out).as_posix(): p for p in out.rglob("*") if p.is_file()}
    assert set(said) == set(files)
    assert all(said[rel] == hashlib.sha256(path.read_bytes()).hexdigest() for rel, path in files.items())
    progress = [m.groups() for m in re.finditer(r"^\[local\] (\S+)\.(\d+) (pass|fail|error) ", done.stderr, re.M)]
    rows = records(out / "results.jsonl")
    assert [(task, int(attempt)) for task, attempt, _ in progress] == [(r["task"], r["attempt"]) for r in rows]
