"""Output without end costs the runner no memory, and a signal death is reported as one.

1 GB from the predicate and 1 GB from a shell tool: the runner (a real subprocess, its real CLI)
stays under 100 MB at its peak, keeps the cap's worth and says how much more there was.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cgroups import join, memory_limited
from tests.support.runner import REPO, clean_env, records, write_suite

GIB = 1 << 30
# The peak is read by a small parent of the runner: a process's own ru_maxrss starts from what the
# process it was forked from (pytest) held, not from zero.
PEAK = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True)
sys.stderr.write(done.stderr.decode()[-2000:])
print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
"""


def _run_measured(suite: Path, out: Path) -> int:
    argv = [sys.executable, "-c", PEAK, sys.executable, "-m", "agent_runner", "run", "--suite", str(suite),
            "--out", str(out)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=300)
    code, peak_mb = (int(w) for w in done.stdout.split())
    assert code == 0, done.stderr
    return peak_mb


def test_a_gigabyte_of_output_keeps_the_runner_under_100_mb(tmp_path: Path) -> None:
    loud = [{"tool_calls": [{"name": "shell", "args": {"argv": ["head", "-c", str(GIB), "/dev/zero"]}}]},
            {"content": "done", "finish": "stop"}]  # fmt: skip
    suite = write_suite(
        tmp_path / "s",
        {"t": {"script": loud, "repo": {"run_tests.sh": f"head -c {GIB} /dev/zero\necho the end\nexit 1\n"}}},
        suite_toml='name = "t"\nrepeat = 1\n[agent]\nkind = "scripted"\n[budget]\nmax_steps = 8\ntimeout_s = 120\n'
        "max_bytes = 10000000\n",
        tools={"allow": ["head"], "deny": []},
    )
    peak_mb = _run_measured(suite, tmp_path / "out")
    assert peak_mb < 100, f"the runner peaked at {peak_mb} MB"

    trace = records(tmp_path / "out" / "traces" / "t.0.jsonl")
    finish = trace[-1]
    assert finish["verdict"] == "fail" and finish["predicate_exit"] == 1
    assert finish["predicate_output"].startswith("…") and finish["predicate_output"].endswith("the end")
    obs = [json.loads(line) for line in (tmp_path / "out" / "traces" / "t.0.obs.jsonl").read_text().splitlines()]
    assert obs[0]["content"].startswith("exit 0\n")
    assert obs[0]["content"].endswith(f"[truncated {GIB - 64 * 1024} bytes]")


def test_a_predicate_that_kills_itself_fails(tmp_path: Path) -> None:
    suite = write_suite(tmp_path / "s", {
        "killed": {"script": [{"content": "done", "finish": "stop"}],
                   "repo": {"run_tests.sh": "echo before\nkill -KILL $$\necho after\n"}},
    })  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "agent_runner", "run", "--suite", str(suite), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, env=clean_env(), cwd=REPO,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    finish = records(tmp_path / "out" / "traces" / "killed.0.jsonl")[-1]
    assert finish["verdict"] == "fail" and finish["predicate_exit"] not in (None, 0)
    assert "after" not in (finish["predicate_output"] or "")


def test_a_predicate_killed_by_a_signal_says_so_not_timed_out(tmp_path: Path) -> None:
    suite = write_suite(tmp_path / "s", {
        "killed": {"script": [{"content": "done", "finish": "stop"}],
                   "repo": {"run_tests.sh": "echo before\nkill -KILL $$\n"}},
    })  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "agent_runner", "run", "--suite", str(suite), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, env=clean_env(), cwd=REPO,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    finish = records(tmp_path / "out" / "traces" / "killed.0.jsonl")[-1]
    assert finish["verdict"] == "fail"
    assert "killed by SIGKILL" in finish["predicate_output"] and "timed out" not in finish["why"]
    assert finish["predicate_output"].endswith("before")


@pytest.mark.root
@pytest.mark.serial  # the OOM killer it calls is counted machine-wide: alone, never beside other runs
@pytest.mark.parametrize(("how", "said"), [
    ("exec ", "killed by SIGKILL: out of memory (the kernel's OOM killer)"),  # the predicate itself is killed
    ("", "the kernel's OOM killer killed a process while it ran (out of memory)"),  # a child of its shell
])  # fmt: skip
def test_a_predicate_the_oom_killer_ends_says_out_of_memory(tmp_path: Path, how: str, said: str) -> None:
    """The runner in a cgroup of 256 MiB, its predicate growing a string without end: the kernel's OOM
    killer ends it, and the trace says so, not a bare exit 137, not a timeout."""
    grow = how + "awk 'BEGIN { s = \"x\"; while (1) s = s s }'\n"
    suite = write_suite(tmp_path / "s", {
        "hungry": {"script": [{"content": "done", "finish": "stop"}], "repo": {"run_tests.sh": f"echo before\n{grow}"}},
    })  # fmt: skip
    argv = [sys.executable, "-m", "agent_runner", "run", "--suite", str(suite), "--out", str(tmp_path / "out")]
    with memory_limited(256 << 20) as procs:
        done = subprocess.run(argv, capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=120,
                              preexec_fn=lambda: join(procs))  # fmt: skip
    assert done.returncode == 0, done.stderr
    finish = records(tmp_path / "out" / "traces" / "hungry.0.jsonl")[-1]
    assert finish["verdict"] == "fail" and finish["predicate_exit"] not in (None, 0)
    assert finish["predicate_output"].startswith(said + "\nbefore"), finish["predicate_output"]
    assert "timed out" not in finish["why"]
