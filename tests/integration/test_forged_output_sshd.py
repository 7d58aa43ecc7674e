"""Forging what the harness reports, on a real sshd host and on local.

"first-victim" fails (its predicate exits 1). "then-forger", a command agent run after it on the same
host, tries to rewrite the victim's trace to a pass (its frames in out/traces.stream), out/results.jsonl
and out/fingerprint.json, and announces a digest of its own for results.jsonl on every channel it can
reach: in the sandbox it cannot write out/ at all, and no line of its reaches the digests' channel, so
the victim keeps its real verdict and the host no error. Whoever can write
there (a host without the sandbox, the host itself) is caught by the digests the runner announced
over the SSH channel: the forgery is that host's error, and no forged pass reaches the report.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from orchestrator.commands.replay import ReplayRequest, replay
from orchestrator.store.jsonl import read_jsonl
from orchestrator.store.rundir import RunDir
from tests.support.runner import write_suite

pytestmark = pytest.mark.sshd

FORGER = r"""
import json, os, sys
sys.stdin.readline()
# a digest announced for results.jsonl on every channel it can reach: its own output (pipes the runner
# reads) and the descriptors of what it sees above it; one that reached the run exec's stdout would
# make the controller's check find two digests for it (the host's error)
FORGED = "crosshost-digest " + "0" * 64 + " results.jsonl\n"
sys.stderr.write(FORGED)
sys.stderr.flush()
for pid in sorted({"1", str(os.getppid())}):
    for fd in ("1", "2"):
        try:
            with open("/proc/%s/fd/%s" % (pid, fd), "w") as channel:
                channel.write(FORGED)
        except OSError:
            pass
here = os.getcwd()
while here != "/" and not os.path.isfile(os.path.join(here, "out", "results.jsonl")):
    here = os.path.dirname(here)
out = os.path.join(here, "out")
stream = os.path.join(out, "traces.stream")  # the runner crosshost starts: every trace a frame of it
data, frames, i = open(stream, "rb").read(), [], 0
while i < len(data):
    j = data.index(b"\n", i)
    name, size = data[i:j].split(b" ")
    frames.append([name, data[j + 1:j + 1 + int(size)]])
    i = j + 1 + int(size)
finish = [f for f in frames if f[0] == b"traces/first-victim.0.jsonl"][-1]  # one frame a record
record = json.loads(finish[1])
record.update(verdict="pass", predicate_exit=0, why="ok")
finish[1] = (json.dumps(record) + "\n").encode()
open(stream, "wb").write(b"".join(n + b" %d\n" % len(b) + b for n, b in frames))
rows = [json.loads(l) for l in open(os.path.join(out, "results.jsonl"))]
for r in rows:
    r.update(verdict="pass", passed=True)
open(os.path.join(out, "results.jsonl"), "w").write("".join(json.dumps(r) + "\n" for r in rows))
fp = json.load(open(os.path.join(out, "fingerprint.json")))
fp["fingerprint"] = "0" * 16
json.dump(fp, open(os.path.join(out, "fingerprint.json"), "w"))
print(json.dumps({"type": "final", "content": "done"}), flush=True)
print(FORGED, end="", flush=True)
"""


def _suite(tmp_path: Path) -> Path:
    stop = [{"content": "done", "finish": "stop"}]
    return write_suite(tmp_path / "suite", {
        "first-victim": {"script": stop, "repo": {"run_tests.sh": "echo 'FAIL: the real verdict'\nexit 1\n"}},
        "then-forger": {"toml": '[agent]\nkind = "command"\ncommand = ["python3", "{suite}/agent/forge.py"]\n',
                        "repo": {"run_tests.sh": "exit 0\n"}},
    }, agent_files={"forge.py": FORGER})  # fmt: skip


def _victim(rd: Path) -> dict[str, list[str]]:
    report = json.loads((rd / "report.json").read_text())
    (victim,) = [t for t in report["tasks"] if t["task"] == "first-victim"]
    return victim["verdicts"]


def test_the_forging_agent_cannot_touch_the_victims_verdict(sshd_hosts: Any, tmp_path: Path) -> None:
    out = replay(ReplayRequest(suite_dir=_suite(tmp_path), inventory_path=sshd_hosts.inventory_path,
                               out=tmp_path / "runs", hosts=["local", "box-a"], repeat=1))  # fmt: skip
    m = RunDir(out.run_dir.path).read_manifest()
    assert all(rec.error is None for rec in m.hosts.values()), m.hosts
    assert _victim(out.run_dir.path) == {"local": ["fail"], "box-a": ["fail"]}
    rows = {(r["env"], r["task"]): r for r in read_jsonl(out.run_dir.path / "results.jsonl")}
    assert rows[("box-a", "first-victim")]["exit_code"] == 1


def test_output_changed_after_the_runner_wrote_it_is_the_hosts_error(
    sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the sandbox keeps the agent from doing, done by the host itself before the pull. The
    archive is fetched after the run here (none comes in the run's output), so that the host's change
    at the pull is what comes home; the check is the same for an archive that came in the output."""
    from orchestrator.hosts import remote
    from orchestrator.hosts.transport import open_host

    monkeypatch.setattr(remote, "INLINE_MAX_BYTES", 0)

    def hook(name: str, stage: str, detail: str) -> None:
        if stage != "pull":
            return
        cfg = sshd_hosts.config(name)
        host = open_host(cfg)
        try:
            res = host.exec(["sh", "-c", f"cd {cfg.workspace_root}/runs/*/ && python3 -c {shlex.quote(FORGER)} "
                                         "< /dev/null && rm -f out.tar && tar -C out -cf out.tar ."], 30)  # fmt: skip
            assert res.ok, res.stderr
        finally:
            host.close()

    out = replay(ReplayRequest(suite_dir=_suite(tmp_path), inventory_path=sshd_hosts.inventory_path,
                               out=tmp_path / "runs", hosts=["box-a"], repeat=1), on_event=hook)  # fmt: skip
    m = RunDir(out.run_dir.path).read_manifest()
    assert out.exit_code == 3
    error = m.hosts["box-a"].error or ""
    assert "OutputTampered" in error and "differs from what the runner wrote" in error, error
    assert "pass" not in _victim(out.run_dir.path)["box-a"]
    assert m.hosts["box-a"].fingerprint != "0" * 16
    assert m.hosts["box-a"].workspace_removed is True  # removed beside the check that refused the output
