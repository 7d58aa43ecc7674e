"""The contract checker: shapes and host leaks, as a function and as `check`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_runner.checker import Finding, check_turns, load_contract
from agent_runner.errors import ContractError
from tests.support.runner import TRIAGE, run_runner

SEED_CONTRACT = {
    "contract_id": "issue.triage.v3",
    "tools": [{"name": "add_label", "required_args": ["repo", "issue_id", "label"],
               "forbidden_args": ["assignee_email", "ssh_identity"], "result_shape": ["ok", "issue_id"]}],
    "invariants": ["no_absolute_local_paths", "no_home_directory_strings", "no_hostname_in_tool_args"],
}
SEED_TRACE = {"tool_calls": [{"name": "add_label", "args": {
    "repo": "acme/web", "issue_id": 7, "label": "bug", "ssh_identity": "/Users/you/.ssh/id_ed25519"}}]}
BOX_B = {"hostname": "box-b", "home": "/root", "cwd": "/tmp/crosshost"}
LOCAL = {"hostname": "laptop-7.corp.example", "home": "/home/dev", "cwd": "/work/main"}


def _kinds(findings: list[Finding]) -> set[str]:
    return {f.kind for f in findings}


def test_the_seed_leak_fails_with_forbidden_arg_and_absolute_path(tmp_path: Path) -> None:
    contract, trace, fingerprint = tmp_path / "contract.json", tmp_path / "trace.json", tmp_path / "fp.json"
    contract.write_text(json.dumps(SEED_CONTRACT))
    trace.write_text(json.dumps(SEED_TRACE))
    fingerprint.write_text(json.dumps(BOX_B))
    done = run_runner("check", str(contract), str(trace), str(fingerprint))
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0] == "FAIL"
    assert any("forbidden_args" in line and "ssh_identity" in line for line in lines[1:])
    assert any("absolute_local_path" in line and "/Users/you/.ssh/id_ed25519" in line for line in lines[1:])


def test_clean_trace_passes_and_unreadable_input_exits_2(tmp_path: Path) -> None:
    contract, trace, fingerprint = tmp_path / "contract.json", tmp_path / "trace.json", tmp_path / "fp.json"
    contract.write_text(json.dumps(SEED_CONTRACT))
    trace.write_text(json.dumps({"tool_calls": [{"name": "add_label",
                                                 "args": {"repo": "acme/web", "issue_id": 7, "label": "bug"}}]}))
    fingerprint.write_text(json.dumps([BOX_B, LOCAL]))
    done = run_runner("check", str(contract), str(trace), str(fingerprint))
    assert (done.returncode, done.stdout) == (0, "PASS\n")
    done = run_runner("check", str(contract), str(tmp_path / "nope.jsonl"), str(fingerprint))
    assert done.returncode == 2 and "nope.jsonl" in done.stderr
    contract.write_text("{broken")
    done = run_runner("check", str(contract), str(trace), str(fingerprint))
    assert done.returncode == 2 and "contract.json" in done.stderr


def test_leaks_are_checked_against_every_fingerprint() -> None:
    turns = [{"step": 1, "tool": "add_label", "args": {"repo": "acme/web", "issue_id": 1,
                                                        "label": "seen on laptop-7 by dev"}},
             {"step": 2, "tool": "add_label", "args": {"repo": "acme/web", "issue_id": 1,
                                                        "label": "x", "note": {"deep": ["/work/main/out.txt"]}}}]
    # Replayed on box-b, the trace still names the reference host: only the reference fingerprint knows.
    assert check_turns(SEED_CONTRACT, turns, [BOX_B]) == []
    findings = check_turns(SEED_CONTRACT, turns, [BOX_B, LOCAL])
    assert [(f.step, f.kind) for f in findings] == [(1, "hostname"), (2, "absolute_local_path")]
    assert all(f.is_leak for f in findings)


def test_shape_findings_and_no_false_alarms_on_urls_or_relative_paths() -> None:
    contract = dict(SEED_CONTRACT, tools=SEED_CONTRACT["tools"] + [{"name": "fetch", "required_args": ["url"]}])
    turns = [{"step": 1, "tool": "add_label", "args": {"repo": "acme/web", "issue_id": 1}},
             {"step": 2, "tool": "delete_repo", "args": {}},
             {"step": 3, "tool": "fetch", "args": {"url": "https://example.com/home/docs/tmp/x",
                                                   "path": "src/tmp/a.py", "api": "/healthz"}}]
    findings = check_turns(contract, turns, [BOX_B])
    assert [(f.step, f.kind, f.is_leak) for f in findings] == [(1, "missing_args", False),
                                                               (2, "unknown_tool", False)]


def test_home_directory_and_windows_paths() -> None:
    turns = [{"step": 1, "tool": "add_label", "args": {"repo": "~/src/web", "issue_id": 1, "label": "b"}},
             {"step": 2, "tool": "add_label", "args": {"repo": "C:\\Users\\ann\\web", "issue_id": 1, "label": "b"}},
             {"step": 3, "tool": "add_label", "args": {"repo": "r", "issue_id": 1, "label": "cache in /root/.cache"}}]
    findings = check_turns(SEED_CONTRACT, turns, [BOX_B])
    assert _kinds([f for f in findings if f.step == 1]) == {"home_directory"}
    assert _kinds([f for f in findings if f.step == 2]) == {"home_directory", "absolute_local_path"}
    assert _kinds([f for f in findings if f.step == 3]) == {"home_directory", "absolute_local_path"}


def test_invariants_only_apply_when_the_contract_lists_them() -> None:
    contract = dict(SEED_CONTRACT, invariants=[])
    turns = [{"step": 1, "tool": "add_label", "args": {"repo": "/home/x", "issue_id": 1, "label": "box-b"}}]
    assert check_turns(contract, turns, [BOX_B]) == []


@pytest.mark.parametrize(("content", "message"), [
    ("{", "not valid JSON"),
    ('{"tools": {}}', "'tools' must be a list"),
    ('{"tools": [{"name": "a"}, {"name": "a"}]}', "listed twice"),
    ('{"tools": [{"name": "a", "required_args": "x"}]}', "required_args must be a list"),
    ('{"tools": [], "invariants": ["no_leaks_please"]}', "unknown invariant"),
])
def test_load_contract_names_the_file_and_what_is_wrong(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "contract.json"
    path.write_text(content)
    with pytest.raises(ContractError, match=message) as info:
        load_contract(path)
    assert str(path) in str(info.value)


def test_check_reads_the_runners_own_traces(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_runner("run", "--suite", str(TRIAGE), "--out", str(out), "--repeat", "1", "--tasks",
                      "seed-leaked-label,restart-unhealthy-only")
    assert done.returncode == 0, done.stderr
    contract, fingerprint = str(TRIAGE / "contract.json"), str(out / "fingerprint.json")
    leaked = run_runner("check", contract, str(out / "traces" / "seed-leaked-label.0.jsonl"), fingerprint)
    assert leaked.returncode == 1 and leaked.stdout.startswith("FAIL\n")
    assert "step 1 add_label: forbidden_args" in leaked.stdout
    clean = run_runner("check", contract, str(out / "traces" / "restart-unhealthy-only.0.jsonl"), fingerprint)
    assert (clean.returncode, clean.stdout) == (0, "PASS\n")
