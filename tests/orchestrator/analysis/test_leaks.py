"""Precise leaks in the analysis: weak findings, cross-host evidence, and which rule fired on what."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.analysis import analyse_run
from orchestrator.analysis.models import TaskReport
from orchestrator.report import render_markdown
from tests.support.rundirs import Attempt, RunSpec, build_run, fingerprint


def _hosts(**homes: str) -> dict[str, Any]:
    return {
        "vm": fingerprint("vm", "a" * 16, home=homes.get("vm", "/root")),
        "box-b": fingerprint("box-b", "b" * 16, home=homes.get("box-b", "/root"), python="CPython 3.11.9"),
    }


def _run(tmp_path: Path, vm: list[tuple[str, dict[str, Any]]], box_b: list[tuple[str, dict[str, Any]]],
         hosts: dict[str, Any] | None = None, dirs: dict[str, dict[str, str]] | None = None) -> TaskReport:
    dirs = dirs or {}
    spec = RunSpec(hosts=hosts or _hosts(), attempts={
        ("vm", "t1", 0): Attempt("pass", calls=vm, dirs=dirs.get("vm")),
        ("box-b", "t1", 0): Attempt("pass", calls=box_b, dirs=dirs.get("box-b")),
    })  # fmt: skip
    report = analyse_run(build_run(tmp_path, spec))
    (tmp_path / "report.json").write_text(report.model_dump_json())
    (tmp_path / "report.md").write_text(render_markdown(report))
    (tmp_path / "valid").write_text(json.dumps(report.valid))
    return report.tasks[0]


def _restart(reason: str) -> tuple[str, dict[str, Any]]:
    return ("restart_unit", {"unit": "nginx.service", "reason": reason})


def test_a_generic_hostname_without_cross_host_evidence_is_weak_and_the_run_stays_valid(tmp_path: Path) -> None:
    same = [_restart("Lower vm.swappiness to 10")]
    task = _run(tmp_path, same, same)
    assert json.loads((tmp_path / "valid").read_text()) is True
    assert task.leaks == [] and task.verdicts == {"vm": ["pass"], "box-b": ["pass"]}
    # both traces hold "vm" (each trace is checked against every host's name); both are weak
    assert {(w.host, w.step, w.kind, w.rule) for w in task.weak} == {
        ("vm", 1, "hostname", "generic_hostname"), ("box-b", 1, "hostname", "generic_hostname")}  # fmt: skip
    assert "3 characters or fewer" in task.weak[0].evidence and "vm.swappiness" in task.weak[0].evidence
    saved = json.loads((tmp_path / "report.json").read_text())["tasks"][0]
    assert saved["weak"][0]["rule"] == "generic_hostname" and saved["weak"][0]["evidence"]
    markdown = (tmp_path / "report.md").read_text()
    assert "weak finding (not a leak) on vm attempt 0 step 1: hostname [generic_hostname]" in markdown
    assert "- weak: 2 finding(s) of a generic host name without cross-host evidence, not leaks" in markdown


def test_a_generic_hostname_is_a_leak_when_the_other_host_differs_by_its_own_name(tmp_path: Path) -> None:
    task = _run(tmp_path, [_restart("record-for-vm")], [_restart("record-for-box-b")])
    assert json.loads((tmp_path / "valid").read_text()) is False
    assert task.weak == []
    rules = {(leak.host, leak.kind, leak.rule) for leak in task.leaks}
    # box-b's name is distinct on its own; vm's match needs box-b's call as its evidence
    assert rules == {("vm", "hostname", "cross_host"), ("box-b", "hostname", "distinct_hostname")}
    [vm] = [leak for leak in task.leaks if leak.host == "vm"]
    assert "'record-for-box-b'" in vm.evidence and "on box-b" in vm.evidence and "own hostname" in vm.evidence
    assert task.verdicts["vm"] == ["fail"] and task.why["vm"][0].startswith("checker: hostname at step 1")
    assert "leak on vm attempt 0 step 1: hostname [cross_host]" in (tmp_path / "report.md").read_text()


def test_a_difference_that_is_not_exactly_the_hostname_is_no_evidence(tmp_path: Path) -> None:
    task = _run(tmp_path, [_restart("record-for-vm-1")], [_restart("record-for-vm-2")])
    assert task.leaks == [] and {w.host for w in task.weak} == {"vm", "box-b"}
    task = _run(tmp_path / "b", [_restart("vm: 10"), _restart("x")], [_restart("box-c: 10"), _restart("y")])
    assert [leak for leak in task.leaks if leak.host == "vm"] == []


def test_working_and_home_directories_are_caught_in_any_form_across_hosts(tmp_path: Path) -> None:
    def dirs(root: str) -> dict[str, str]:
        return {"attempt": root, "cwd": f"{root}/work", "home": f"{root}/home", "tmp": f"{root}/tmp"}

    hosts = _hosts(vm="/home/alice", **{"box-b": "/home/bob"})
    attempt_dirs = {"vm": dirs("/srv/ws/t1.0.k3j9"), "box-b": dirs("/srv/ws/t1.0.q8w2")}
    vm_calls = [
        ("restart_unit", {"unit": "srv-ws-t1.0.k3j9-work"}),  # the working directory as an identifier
        ("http_get_health", {"url": "https://files.example/get?p=%2Fhome%2Falice%2Fnotes"}),  # home, URL-encoded
        ("read_unit_status", {"unit": "fine.service"}),
    ]
    box_calls = [
        ("restart_unit", {"unit": "srv-ws-t1.0.q8w2-work"}),
        ("http_get_health", {"url": "https://files.example/get?p=%2Fhome%2Fbob%2Fnotes"}),
        ("read_unit_status", {"unit": "fine.service"}),
    ]
    task = _run(tmp_path, vm_calls, box_calls, hosts=hosts, dirs=attempt_dirs)
    found = {(leak.host, leak.step, leak.kind, leak.rule) for leak in task.leaks}
    assert found == {
        ("vm", 1, "absolute_local_path", "cross_host"), ("box-b", 1, "absolute_local_path", "cross_host"),
        ("vm", 2, "home_directory", "cross_host"), ("box-b", 2, "home_directory", "cross_host"),
    }  # fmt: skip
    [step1] = [leak for leak in task.leaks if leak.host == "vm" and leak.step == 1]
    assert step1.message == "vm's own working directory in an argument"
    assert "'srv-ws-t1.0.q8w2-work'" in step1.evidence and "own working directory" in step1.evidence


def test_absolute_paths_are_leaks_only_where_they_are_host_specific(tmp_path: Path) -> None:
    calls = [
        _restart("cat /etc/os-release"),
        _restart("/usr/share/zoneinfo/UTC and /opt/tool/bin/x and /var/lib/dpkg/status"),
        _restart("wrote /tmp/report.txt"),
        _restart("key at /home/dev/.ssh/id_ed25519"),
    ]
    task = _run(tmp_path, calls, calls)
    assert {(leak.step, leak.rule) for leak in task.leaks if leak.kind == "absolute_local_path"} == {
        (3, "temp_dir"), (4, "user_home")}  # fmt: skip
    [temp] = [leak for leak in task.leaks if leak.step == 3 and leak.host == "vm"]
    assert temp.evidence == "reason='wrote /tmp/report.txt': under /tmp, a temp directory"


def test_the_terminal_shows_the_rule_of_a_leak_and_the_weak_findings(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli import app

    spec = RunSpec(hosts=_hosts(), attempts={
        ("vm", "t1", 0): Attempt("pass", calls=[_restart("record-for-vm"), _restart("vm.swappiness")]),
        ("box-b", "t1", 0): Attempt("pass", calls=[_restart("record-for-box-b"), _restart("vm.swappiness")]),
    })  # fmt: skip
    run = build_run(tmp_path, spec)
    out = CliRunner().invoke(app, ["report", str(run)], env={"COLUMNS": "400"})
    assert out.exit_code == 1, out.output
    text = " ".join(out.output.split())
    assert "host leakage: 1 finding(s) in traces from vm (first: t1.0 step 1: hostname [cross_host]: " in text
    assert "weak: 2 finding(s) of a generic host name without cross-host evidence, not leaks (first: t1.0 on vm step 2" in text


def test_a_leak_only_the_runner_could_see_is_the_runs_leak_too(tmp_path: Path) -> None:
    # the attempt's own directory is in no fingerprint: the runner's finding is the evidence
    path = "/srv/elsewhere/t1.0.k3j9/work/status.txt"
    seen = {"step": 1, "kind": "absolute_local_path", "tool": "restart_unit", "rule": "workspace", "weak": False,
            "message": "a host's working directory '/srv/elsewhere/t1.0.k3j9' in an argument",
            "evidence": f"reason={path!r}: holds /srv/elsewhere/t1.0.k3j9, a host's working directory"}  # fmt: skip
    weak = {**seen, "kind": "hostname", "rule": "generic_hostname", "weak": True}
    spec = RunSpec(hosts=_hosts(), attempts={
        ("vm", "t1", 0): Attempt("fail", calls=[_restart(path)], findings=[seen, weak]),
        ("box-b", "t1", 0): Attempt("pass", calls=[_restart("fine")]),
    })  # fmt: skip
    report = analyse_run(build_run(tmp_path, spec))
    [task] = report.tasks
    assert [(leak.host, leak.kind, leak.rule, leak.evidence) for leak in task.leaks] == [
        ("vm", "absolute_local_path", "workspace", seen["evidence"])]  # fmt: skip
    assert task.weak == []  # the analysis judges generic names itself
    assert not report.valid and report.invalid_reasons[-1].startswith("host leakage: 1 finding(s) in traces from vm")
