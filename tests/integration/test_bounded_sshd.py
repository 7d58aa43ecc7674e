"""Bounded on real sshd hosts and on local: what the code under test prints, and what a host adds to
its own output, costs the runner and the controller no memory in proportion (under 100 MB).

The sshd test hosts share this machine's /proc, so the runner's peak resident memory (VmHWM) is read
from there while it runs; the controller's is read by a small parent of a replay in its own process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator.commands.replay import ReplayRequest, replay
from orchestrator.store.jsonl import read_jsonl
from orchestrator.store.rundir import RunDir
from tests.support.runner import REPO, write_suite

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


#: a replay in a process of its own (its peak is its own, not pytest's), whose box-a adds a 40-byte
#: trace named t.3000000.jsonl and a results row of attempt 2999999 to its out/ before the pull
BOMBED_REPLAY = r"""
import json, shlex, sys
from pathlib import Path
from orchestrator.hosts.inventory import load_inventory
from orchestrator.commands.replay import ReplayRequest, replay
from orchestrator.hosts import remote
from orchestrator.hosts.transport import open_host
remote.INLINE_MAX_BYTES = 0  # the archive is fetched after the run: the host's change to it then is what comes home
suite, inventory, out = (Path(a) for a in sys.argv[1:4])
cfg = load_inventory(inventory).get("box-a")
BOMB = (
    "cd %s/runs/*/ && printf '%%s\\n' '{\"type\": \"header\", \"task\": \"t\"}' > out/traces/t.3000000.jsonl && "
    "sed -n 1p out/results.jsonl | sed 's/\"attempt\": 0/\"attempt\": 2999999/' >> out/results.jsonl && "
    "rm -f out.tar && tar -C out -cf out.tar ." % shlex.quote(cfg.workspace_root)
)
def hook(name, stage, detail):
    if name == "box-a" and stage == "pull":
        host = open_host(cfg)
        try:
            done = host.exec(["sh", "-c", BOMB], 30)
            assert done.ok, done.stderr
        finally:
            host.close()
done = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=out, hosts=["local", "box-a"]), on_event=hook)
print(json.dumps({"exit": done.exit_code, "run_dir": str(done.run_dir.path)}))
"""
#: the peak of a child, read by its parent: a process's own ru_maxrss starts from its forker's
MEASURE = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stderr.write(done.stderr[-3000:])
print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "{}")
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
"""


def test_an_attempt_number_bomb_from_a_host_is_its_error_and_costs_under_100_mb(
    sshd_hosts: Any, tmp_path: Path
) -> None:
    suite = write_suite(tmp_path / "s", {"t": {"script": [{"content": "done", "finish": "stop"}],
                                               "repo": {"run_tests.sh": "exit 0\n"}}})  # fmt: skip
    argv = [sys.executable, "-c", MEASURE, sys.executable, "-c", BOMBED_REPLAY, str(suite),
            str(sshd_hosts.inventory_path), str(tmp_path / "runs")]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=300)
    said, peak = done.stdout.strip().splitlines()[-2:]
    outcome, peak_mb = json.loads(said), int(peak)
    assert outcome.get("exit") == 3, done.stderr
    assert peak_mb < 100, f"the controller peaked at {peak_mb} MB"
    m = RunDir(Path(outcome["run_dir"])).read_manifest()
    error = m.hosts["box-a"].error or ""
    assert "OutputTampered" in error and "(2 problems in all)" in error, error
    assert m.hosts["local"].error is None
    run_dir = Path(outcome["run_dir"])
    assert (run_dir / "hosts" / "box-a" / "traces" / "t.3000000.jsonl.tampered").is_file()  # never analysed
    rows = [r for r in read_jsonl(run_dir / "results.jsonl") if r["env"] == "box-a"]
    assert len(rows) <= 1 and all(r["attempt"] == 0 for r in rows), rows
