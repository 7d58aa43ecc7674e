"""``run --slots N``: up to N attempts at once, each in its own workspace, HOME, TMPDIR and budget;
results and traces are those of one slot, in the same order; SIGTERM still leaves nothing behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.runner import REPO, clean_env, records, run_runner, write_suite

#: fields that say when or how long, not what happened
# timing, and the attempt's own directories (each attempt gets new ones, in any slot)
_TIMING = {"wall_ms", "ts", "t_ms", "elapsed_ms", "started", "finished", "duration_ms", "dirs"}


def _suite(tmp_path: Path, log: Path, n: int = 8, sleep_s: float = 0.3) -> Path:
    """``n`` tasks whose predicate sleeps ``sleep_s`` and passes on even, fails on odd tasks.

    Before its sleep, task ``i``'s predicate waits (30 s at most) until the tasks of its wave have
    started, a wave being as many tasks as the run has slots (the number in ``<log>.slots``, 1 if
    absent): N slots that run at once are then seen at once however slowly the machine starts them,
    and one slot never waits."""
    tasks = {}
    for i in range(n):
        # the predicate logs when it runs (an absolute path: HOME and TMPDIR are the attempt's own)
        wave = (f's=$(cat {log}.slots 2>/dev/null || echo 1); w=$(( ({i} / s + 1) * s )); '
                f'if [ $w -gt {n} ]; then w={n}; fi; k=0; '
                f'while [ $(grep -c ^start {log}) -lt $w ] && [ $k -lt 300 ]; do sleep 0.1; k=$((k + 1)); done\n')
        script = (f'echo "start {i} $(date +%s%N) $HOME" >> {log}\n{wave}sleep {sleep_s}\n'
                  f'echo "end {i} $(date +%s%N)" >> {log}\nexit {i % 2}\n')
        tasks[f"t{i}"] = {"script": [], "repo": {"run_tests.sh": script}}
    return write_suite(tmp_path / "suite", tasks)


def _max_overlap(log: str) -> int:
    events = []
    for line in log.splitlines():
        kind, _, ns = line.split()[:3]
        events.append((int(ns), 1 if kind == "start" else -1))
    live = peak = 0
    for _, delta in sorted(events):
        live += delta
        peak = max(peak, live)
    return peak


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in _TIMING}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _run(tmp_path: Path, name: str, slots: int) -> tuple[Path, str, subprocess.CompletedProcess[str]]:
    """The same suite and workspace root each time (they are part of what is recorded)."""
    log = tmp_path / "predicate.log"
    suite = tmp_path / "suite" if (tmp_path / "suite").exists() else _suite(tmp_path, log)
    log.write_text("")
    Path(f"{log}.slots").write_text(f"{slots}\n")
    out = tmp_path / name
    done = run_runner("run", "--suite", str(suite), "--out", str(out), "--host", "h", "--run-id", "r1",
                      "--workspace-root", str(tmp_path / "ws"), "--slots", str(slots))
    assert done.returncode == 0, done.stderr
    return out, log.read_text(), done


def test_four_slots_run_four_attempts_at_once_with_the_results_and_traces_of_one(tmp_path: Path) -> None:
    one, one_log, _ = _run(tmp_path, "one", 1)
    four, four_log, done = _run(tmp_path, "four", 4)
    assert _max_overlap(one_log) == 1
    assert _max_overlap(four_log) == 4
    # each attempt had a HOME of its own
    homes = [line.split()[3] for line in four_log.splitlines() if line.startswith("start")]
    assert len(set(homes)) == 8
    rows_one, rows_four = records(one / "results.jsonl"), records(four / "results.jsonl")
    assert [(r["task"], r["attempt"], r["verdict"]) for r in rows_four] == [
        (f"t{i}", 0, "pass" if i % 2 == 0 else "fail") for i in range(8)
    ]
    assert _strip(rows_four) == _strip(rows_one)
    for i in range(8):
        trace = f"t{i}.0.jsonl"
        assert _strip(records(four / "traces" / trace)) == _strip(records(one / "traces" / trace))
    assert list((tmp_path / "ws").iterdir()) == []
    assert done.stderr.count("[h] t") == 8  # one progress line per attempt


def test_slots_must_be_at_least_one(tmp_path: Path) -> None:
    suite = _suite(tmp_path, tmp_path / "log", n=1, sleep_s=0)
    done = run_runner("run", "--suite", str(suite), "--out", str(tmp_path / "out"), "--slots", "0")
    assert done.returncode == 2 and "--slots: must be a whole number of at least 1, got '0'" in done.stderr


# a root runner's attempts are in a tmpfs that goes with it: on disk, the runner's own removal is what is tested
@pytest.mark.parametrize("where", [[], ["--attempts-on-disk"]], ids=["in-memory", "on-disk"])
def test_sigterm_with_slots_stops_every_attempt_and_leaves_no_workspace(tmp_path: Path, where: list[str]) -> None:
    log = tmp_path / "log"
    sleep_s = 300 + (time.time_ns() % 1000) / 1000 + 0.0001
    suite = _suite(tmp_path, log, n=6, sleep_s=sleep_s)
    ws = tmp_path / "ws"
    proc = subprocess.Popen([sys.executable, "-m", "agent_runner", "run", "--suite", str(suite), "--out",
                             str(tmp_path / "out"), "--workspace-root", str(ws), "--slots", "3", *where],
                            env=clean_env(), cwd=REPO, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (log.exists() and log.read_text().count("start") >= 3):
        assert time.monotonic() < deadline, "three attempts never started"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert list(ws.iterdir()) == []
    # the predicates' sleeps died with the runner (a value no other test uses)
    gone = subprocess.run(["pgrep", "-f", f"sleep {sleep_s}"], capture_output=True, text=True)
    assert gone.stdout.strip() == ""
    assert log.read_text().count("start") == 3  # nothing started after the signal
    assert records(tmp_path / "out" / "results.jsonl") == []
