"""The checker's leak rules one by one: which fired, on what, and what is only a weak finding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_runner.checker import Finding, check_turns, validate_contract
from tests.support.runner import run_runner

CONTRACT = {
    "contract_id": "rules.v1",
    "tools": [{"name": "note", "required_args": ["text"]}],
    "invariants": ["no_absolute_local_paths", "no_home_directory_strings", "no_hostname_in_tool_args"],
}
HOST = {"hostname": "box-a", "home": "/home/dev", "cwd": "/srv/crosshost/ws"}


def _findings(text: str, contract: dict[str, object] | None = None, host: dict[str, str] | None = None,
              kind: str | None = None) -> list[Finding]:
    found = check_turns(contract or CONTRACT, [{"step": 1, "tool": "note", "args": {"text": text}}], [host or HOST])
    return [f for f in found if kind is None or f.kind == kind]


@pytest.mark.parametrize(("hostname", "text", "rule", "weak"), [
    ("box-a", "record-for-box-a", "distinct_hostname", False),
    ("vm", "Lower vm.swappiness to 10", "generic_hostname", True),  # 3 characters or fewer
    ("api", 'service: "api"', "generic_hostname", True),
    ("build", "the build failed", "generic_hostname", True),  # a dictionary word
    ("Mercury.corp.example", "rotate mercury.log", "generic_hostname", True),  # its first label is a word
    ("builder-7", "ran on builder-7", "distinct_hostname", False),
])
def test_a_hostname_is_a_leak_unless_it_is_generic(hostname: str, text: str, rule: str, weak: bool) -> None:
    [finding] = _findings(text, host={"hostname": hostname}, kind="hostname")
    assert (finding.rule, finding.weak, finding.is_leak) == (rule, weak, not weak)
    assert repr(text) in finding.evidence
    if weak:
        assert "generic" in finding.evidence and "another host's arguments differ" in finding.evidence


@pytest.mark.parametrize(("text", "rule"), [
    # the system's paths are the same on every host; a URL's path and a relative path are no paths here
    ("cat /etc/os-release; ls /usr/lib/python3 /proc/cpuinfo /dev/null; https://example.com/home/x/tmp/y "
     "src/tmp/a.py /opt/tool/bin/x", None),
    ("/var/lib/dpkg/status and /srv/data/x", None),
    ("C:\\Windows\\System32\\drivers", None),
    ("wrote /tmp/out.txt", "temp_dir"),
    ("/var/tmp/x and", "temp_dir"),
    ("/private/var/folders/xy/T/z", "temp_dir"),
    ("/run/user/1000/bus", "temp_dir"),
    ("C:\\Windows\\Temp\\x.log", "temp_dir"),
    ("/home/alice/notes", "user_home"),
    ("/root/.cache/pip", "user_home"),
    ("copied from box-b:/root/.cache", "user_home"),  # scp's host:path is a path
    ("C:\\Users\\ann\\web", "user_home"),
    ("/srv/crosshost/ws/t1.0.x/work/status.txt", "workspace"),  # under a host's working directory
])
def test_an_absolute_path_is_a_leak_only_where_it_is_host_specific(text: str, rule: str | None) -> None:
    rules = [f.rule for f in _findings(text, kind="absolute_local_path")]
    assert rules == ([rule] if rule else [])


def test_a_host_home_outside_the_usual_roots_is_a_home(tmp_path: Path) -> None:
    [finding] = _findings("/data/people/dev/x", host={"home": "/data/people/dev"}, kind="absolute_local_path")
    assert finding.rule == "user_home" and "a host's home directory" in finding.evidence


def test_contract_host_paths_are_leaks_and_allowed_paths_win() -> None:
    contract = validate_contract(
        {**CONTRACT, "host_paths": ["/opt/site"], "allowed_paths": ["/opt/site/shared", "/tmp/cache"]}, "c.json"
    )
    found = {t: [f.rule for f in _findings(t, contract, kind="absolute_local_path")]
             for t in ("/opt/site/x", "/opt/site/shared/x", "/opt/sitex", "/tmp/cache/a", "/tmp/other")}  # fmt: skip
    assert found == {"/opt/site/x": ["contract_host_path"], "/opt/site/shared/x": [], "/opt/sitex": [],
                     "/tmp/cache/a": [], "/tmp/other": ["temp_dir"]}  # fmt: skip
    [finding] = _findings("/opt/site/x", contract, kind="absolute_local_path")
    assert finding.evidence == "text='/opt/site/x': under /opt/site, one of the contract's host_paths"


def test_home_directory_rules_say_which_form_they_saw() -> None:
    rules = {f.rule for f in _findings("~/src and /home/dev/x and /Users/ann/y", kind="home_directory")}
    assert rules == {"home_shorthand", "host_home", "user_home"}


def test_check_passes_with_a_weak_finding_and_says_it(tmp_path: Path) -> None:
    contract, trace, fingerprint = tmp_path / "contract.json", tmp_path / "trace.json", tmp_path / "fp.json"
    contract.write_text(json.dumps(CONTRACT))
    trace.write_text(json.dumps({"tool_calls": [{"name": "note", "args": {"text": "Lower vm.swappiness to 10"}}]}))
    fingerprint.write_text(json.dumps({"hostname": "vm"}))
    done = run_runner("check", str(contract), str(trace), str(fingerprint))
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert lines[0] == "PASS"
    assert lines[1].startswith("weak: step 1 note: hostname: hostname 'vm' in an argument [weak, generic_hostname: ")
    trace.write_text(json.dumps({"tool_calls": [{"name": "note", "args": {"text": "record-for-vm-host"}}]}))
    fingerprint.write_text(json.dumps({"hostname": "vm-host"}))
    done = run_runner("check", str(contract), str(trace), str(fingerprint))
    assert done.returncode == 1 and "[distinct_hostname: text='record-for-vm-host'" in done.stdout


def test_a_hostname_inside_a_hosts_own_directory_is_that_directorys_leak_only() -> None:
    # crosshost names a workspace after the inventory name: the path is the leak, not a hostname in it
    host = {"hostname": "box-b", "home": "/home/dev", "cwd": "/tmp/crosshost/runs/r1-box-b"}
    found = [(f.kind, f.rule) for f in _findings("/tmp/crosshost/runs/r1-box-b/work/status.txt", host=host)]
    assert found == [("absolute_local_path", "workspace")]
    found = [(f.kind, f.rule) for f in _findings("/tmp/crosshost/runs/r1-box-b/work/x for box-b", host=host)]
    assert found == [("absolute_local_path", "workspace"), ("hostname", "distinct_hostname")]
