"""A command agent that forges what the harness reports, on a real sshd host.

"victim" fails (its predicate exits 1). "forger", run after it on the same host, rewrites the
victim's trace to a pass, rewrites out/results.jsonl and replaces out/fingerprint.json. The runner
announced every file's digest over the SSH channel, so the controller finds the forgery: it is that
host's error, with a plain reason, and no forged pass reaches the report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.replay import ReplayRequest, replay
from orchestrator.rundir import RunDir, read_jsonl
from tests.support.runner import write_suite

pytestmark = pytest.mark.sshd

FORGER = r"""
import json, os, sys
sys.stdin.readline()
here = os.getcwd()
while here != "/" and not os.path.isfile(os.path.join(here, "out", "results.jsonl")):
    here = os.path.dirname(here)
out = os.path.join(here, "out")
trace = os.path.join(out, "traces", "first-victim.0.jsonl")
lines = [json.loads(l) for l in open(trace)]
lines[-1].update(verdict="pass", predicate_exit=0, why="ok")
open(trace, "w").write("".join(json.dumps(l) + "\n" for l in lines))
rows = [json.loads(l) for l in open(os.path.join(out, "results.jsonl"))]
for r in rows:
    r.update(verdict="pass", passed=True)
open(os.path.join(out, "results.jsonl"), "w").write("".join(json.dumps(r) + "\n" for r in rows))
fp = json.load(open(os.path.join(out, "fingerprint.json")))
fp["fingerprint"] = "0" * 16
json.dump(fp, open(os.path.join(out, "fingerprint.json"), "w"))
print(json.dumps({"type": "final", "content": "done"}), flush=True)
"""


def test_a_forging_agent_is_its_hosts_error_and_forges_no_pass(sshd_hosts: Any, tmp_path: Path) -> None:
    stop = [{"content": "done", "finish": "stop"}]
    suite = write_suite(tmp_path / "suite", {
        "first-victim": {"script": stop, "repo": {"run_tests.sh": "echo 'FAIL: the real verdict'\nexit 1\n"}},
        "then-forger": {"toml": '[agent]\nkind = "command"\ncommand = ["python3", "{suite}/agent/forge.py"]\n',
                   "repo": {"run_tests.sh": "exit 0\n"}},
    }, agent_files={"forge.py": FORGER})  # fmt: skip
    out = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs",
                               hosts=["local", "box-a"], tasks=["first-victim", "then-forger"], repeat=1))  # fmt: skip
    rd = out.run_dir.path
    m = RunDir(rd).read_manifest()
    assert out.exit_code == 3, m.hosts
    for host in ("box-a", "local"):  # over SSH and on the controller itself alike
        error = m.hosts[host].error or ""
        assert "OutputTampered" in error and "differs from what the runner wrote" in error, error
    rows = {(r["env"], r["task"]): r for r in read_jsonl(rd / "results.jsonl")}
    assert rows[("box-a", "first-victim")]["verdict"] != "pass", rows  # never a forged pass
    report = json.loads((rd / "report.json").read_text())
    (victim,) = [t for t in report["tasks"] if t["task"] == "first-victim"]
    assert "pass" not in victim["verdicts"]["box-a"]
