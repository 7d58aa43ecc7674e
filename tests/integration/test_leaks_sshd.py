"""Precise leaks on real sshd hosts named ``vm`` and ``box-y`` (each in its own UTS namespace).

What a user relies on: an agent that joins the host's name into an identifier is caught; a system
path such as /etc/os-release is no leak; and a host named ``vm`` does not invalidate a run that
mentions "vm.swappiness", unless the other host's call differs exactly by its own name.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from orchestrator.commands.replay import ReplayRequest, replay
from tests.support.runner import TRIAGE, write_suite

pytestmark = pytest.mark.sshd

# A command agent that names a record after the machine it runs on.
RECORD_AGENT = """\
import json, socket, sys

def send(message):
    sys.stdout.write(json.dumps(message) + "\\n")
    sys.stdout.flush()

json.loads(sys.stdin.readline())  # the task
send({"type": "tool_call", "name": "open_ticket",
      "args": {"title": "record-for-" + socket.gethostname(), "body": "the nightly record"}})
json.loads(sys.stdin.readline())  # the observation
send({"type": "final", "content": "opened", "finish": "stop"})
"""
FIXTURE = '[fixtures]\nopen_ticket = "ok=true ticket_id=OPS-1"\n'


def _suite(root: Path) -> Path:
    suite = write_suite(root / "leaks", {
        "swappiness": {
            "toml": 'expect_tools = ["open_ticket"]\n' + FIXTURE,
            "script": [
                {"tool_calls": [{"name": "open_ticket", "args": {
                    "title": "Lower vm.swappiness to 10", "body": "cat /etc/os-release says bookworm"}}]},
                {"content": "opened", "finish": "stop"},
            ],
        },
        "record": {
            "toml": 'expect_tools = ["open_ticket"]\n[agent]\nkind = "command"\n'
                    'command = ["python3", "{suite}/agent/record.py"]\n' + FIXTURE,
        },
    }, agent_files={"record.py": RECORD_AGENT})  # fmt: skip
    shutil.copy(TRIAGE / "contract.json", suite / "contract.json")  # all three leak invariants
    shutil.copy(TRIAGE / "tools.json", suite / "tools.json")
    return suite


def _replay(hosts: Any, suite: Path, out: Path, task: str) -> tuple[int, dict[str, Any]]:
    done = replay(ReplayRequest(suite_dir=suite, inventory_path=hosts.inventory_path, out=out, tasks=[task],
                                hosts=["vm", "box-y"], repeat=1))  # fmt: skip
    report = json.loads((done.run_dir.path / "report.json").read_text())
    return done.exit_code, report


def test_vm_swappiness_on_a_host_named_vm_and_etc_os_release_leave_the_run_valid(
    vm_sshd_hosts: Any, tmp_path: Path
) -> None:
    # "vm.swappiness" on the host named vm, the same words on box-y: weak, the run stays valid;
    # /etc/os-release in the same argument is the system's path, no leak
    code, report = _replay(vm_sshd_hosts, _suite(tmp_path), tmp_path / "runs", "swappiness")
    [task] = report["tasks"]
    assert report["hosts"][0]["name"] == "vm" and report["invalid_reasons"] == [], report["invalid_reasons"]
    assert code == 0 and report["valid"] is True
    assert task["leaks"] == [] and task["verdicts"] == {"vm": ["pass"], "box-y": ["pass"]}
    assert {(w["host"], w["kind"], w["rule"]) for w in task["weak"]} == {
        ("vm", "hostname", "generic_hostname"), ("box-y", "hostname", "generic_hostname")}  # fmt: skip
    assert "'Lower vm.swappiness to 10'" in task["weak"][0]["evidence"]



def test_record_for_hostname_is_a_leak_on_both_hosts(vm_sshd_hosts: Any, tmp_path: Path) -> None:
    # record-for-<hostname>: box-y's own name is a leak by itself; vm's is one because box-y's call
    # differs from it exactly by box-y's own name
    code, report = _replay(vm_sshd_hosts, _suite(tmp_path), tmp_path / "runs", "record")
    [task] = report["tasks"]
    assert code == 1 and report["valid"] is False
    leaks = {leak["host"]: leak for leak in task["leaks"]}
    assert (leaks["box-y"]["kind"], leaks["box-y"]["rule"]) == ("hostname", "distinct_hostname")
    assert "'record-for-box-y'" in leaks["box-y"]["evidence"]
    assert (leaks["vm"]["kind"], leaks["vm"]["rule"]) == ("hostname", "cross_host")
    assert "'record-for-vm'" in leaks["vm"]["evidence"] and "'record-for-box-y'" in leaks["vm"]["evidence"]
    assert task["weak"] == [] and task["verdicts"] == {"vm": ["fail"], "box-y": ["fail"]}
    assert any(r.startswith("host leakage: 1 finding(s) in traces from vm") and "[cross_host]" in r
               for r in report["invalid_reasons"])  # fmt: skip


def test_the_demo_suites_leaks_still_invalidate_the_run(vm_sshd_hosts: Any, tmp_path: Path) -> None:
    # the triage suite's two leaks, on this machine and two sshd hosts, as `make demo` replays them
    done = replay(ReplayRequest(suite_dir=TRIAGE, inventory_path=vm_sshd_hosts.inventory_path, out=tmp_path / "runs",
                                tasks=["leaky-workdir", "seed-leaked-label"], repeat=1))  # fmt: skip
    report = json.loads((done.run_dir.path / "report.json").read_text())
    assert done.exit_code == 1 and report["valid"] is False
    leakage = [r for r in report["invalid_reasons"] if r.startswith("host leakage")]
    assert len(leakage) == 3, report["invalid_reasons"]  # one per host: local, vm, box-y
    rules = {t["task"]: {(leak["host"], leak["kind"], leak["rule"]) for leak in t["leaks"]} for t in report["tasks"]}
    for host in ("local", "vm", "box-y"):
        # the agent's working directory (under the run's workspace) and a home directory's key
        assert (host, "absolute_local_path", "workspace") in rules["leaky-workdir"], rules
        assert {(host, "absolute_local_path", "user_home"), (host, "home_directory", "user_home")} <= rules[
            "seed-leaked-label"
        ], rules
