"""Bounded on real sshd hosts and on local: what the code under test prints, and what a host adds to
its own output, costs the runner and the controller no memory in proportion.

The sshd test hosts share this machine's /proc, so the runner's peak resident memory (VmHWM) is read
from there while it runs; the controller's is read by a small parent of a replay in its own process.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator.replay import ReplayRequest, replay
from orchestrator.rundir import RunDir
from tests.support.runner import write_suite

pytestmark = pytest.mark.sshd

GIB = 1 << 30


def _runner_peaks(runs: Path, stop: threading.Event, peaks: dict[int, int]) -> None:
    """Until ``stop``: the highest VmHWM (kB) of every runner of the one run under ``runs`` (other
    tests' runners on this machine are told apart by the run id on their command line)."""
    marker = None
    while not stop.wait(0.05):
        if marker is None:
            made = [d.name for d in runs.glob("*") if d.is_dir()] if runs.is_dir() else []
            if not made:
                continue
            marker = b"runner.pyz\0run\0", f"--run-id\0{made[0]}\0".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                if not all(m in cmd for m in marker):
                    continue
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    peaks[int(entry)] = max(peaks.get(int(entry), 0), int(line.split()[1]))


def test_a_gigabyte_of_predicate_output_keeps_the_runner_under_100_mb(sshd_hosts: Any, tmp_path: Path) -> None:
    suite = write_suite(tmp_path / "s", {
        "loud": {"script": [{"content": "done", "finish": "stop"}],
                 "repo": {"run_tests.sh": f"head -c {GIB} /dev/zero\necho the end\nexit 1\n"}},
    }, suite_toml='name = "loud"\nrepeat = 1\n[agent]\nkind = "scripted"\n[budget]\nmax_steps = 4\n'
                  'timeout_s = 120\nmax_bytes = 100000\n')  # fmt: skip
    stop, peaks = threading.Event(), dict[int, int]()
    watcher = threading.Thread(target=_runner_peaks, args=(tmp_path / "runs", stop, peaks), daemon=True)
    watcher.start()
    try:
        out = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs",
                                   hosts=["local", "box-a"]), with_analysis=False)  # fmt: skip
    finally:
        stop.set()
        watcher.join()
    m = RunDir(out.run_dir.path).read_manifest()
    assert all(rec.error is None for rec in m.hosts.values()), m.hosts
    assert len(peaks) >= 2, f"saw {len(peaks)} runner(s) run"  # one a host, at least
    assert max(peaks.values()) < 100 * 1024, f"a runner peaked at {max(peaks.values()) // 1024} MB"
    for name in ("local", "box-a"):
        trace = out.run_dir.path / "hosts" / name / "traces" / "loud.0.jsonl"
        finish = json.loads(trace.read_text().splitlines()[-1])
        assert finish["verdict"] == "fail" and finish["predicate_exit"] == 1, (name, finish)
        assert finish["predicate_output"].startswith("…") and finish["predicate_output"].endswith("the end")
