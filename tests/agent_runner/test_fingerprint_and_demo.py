"""The fingerprint's fields and findings, and the demo's host-dependent tasks on a host that differs:
/opt/crosshost-demo present (a private mount namespace, as box-b) and no UTF-8 locale."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.runner import REPO, TRIAGE, clean_env, records, run_runner


def test_fingerprint_fields_cwd_tools_and_findings(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / ".env").write_text("X=1\n")
    done = run_runner("fingerprint", "--cwd", str(tmp_path / "work"), "--tools", str(TRIAGE / "tools.json"),
                      env=clean_env(HOME=str(home), TZ="UTC"))
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    for key in ("hostname", "platform", "python", "cwd", "cwd_exists", "user_home_in_cwd", "env_keys",
                "has_local_dotenv", "cpu_count", "locale", "tz", "uid", "home", "tool_versions", "findings"):
        assert key in data, key
    assert data["cwd"] == str(tmp_path / "work") and data["cwd_exists"] and data["has_local_dotenv"]
    assert data["home"] == str(home) and not data["user_home_in_cwd"]
    assert data["tz"]["TZ"] == "UTC" and "TZ" in data["env_keys"]
    assert data["tool_versions"]["git"].startswith("git version")
    assert set(data["tool_versions"]) == {"cat", "git", "grep", "ls", "sh"}
    ssh = [f for f in data["findings"] if f["kind"] == "ssh_dir"]
    assert ssh and ssh[0]["action"] == "burn" and ssh[0]["detail"] == str(home / ".ssh")
    # stable: the same host twice gives the same 16-hex digest, though capture time moves
    again = json.loads(run_runner("fingerprint", "--cwd", str(tmp_path / "work"), "--tools",
                                  str(TRIAGE / "tools.json"), env=clean_env(HOME=str(home), TZ="UTC")).stdout)
    assert again["fingerprint"] == data["fingerprint"] and len(data["fingerprint"]) == 16
    moved = json.loads(run_runner("fingerprint", "--cwd", str(home), env=clean_env(HOME=str(home))).stdout)
    assert moved["user_home_in_cwd"] and moved["fingerprint"] != data["fingerprint"]


def test_run_specific_paths_never_move_the_digest(tmp_path: Path) -> None:
    """Each run, and each inventory name of one machine, works in a directory of its own: the digest
    describes the host, so the working directory is reported but not digested."""
    def fingerprint(*parts: str) -> dict:
        work = tmp_path.joinpath(*parts)
        work.mkdir(parents=True, exist_ok=True)
        done = run_runner("fingerprint", "--cwd", str(work), env=clean_env(HOME=str(tmp_path)))
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        assert data["cwd"] == str(work)  # the real path is still reported
        return dict(data)

    first = fingerprint("root-a", "runs", "probe-1a2b-box-a", "work")
    second = fingerprint("root-b", "runs", "20261130T120000-3c4d5e-box-a-again", "work")
    assert first["fingerprint"] == second["fingerprint"]
    assert first["machine_identity"] == second["machine_identity"]


def test_the_machine_identity_is_a_hash_of_the_machine_and_boot_ids_never_the_ids(tmp_path: Path) -> None:
    done = run_runner("fingerprint", env=clean_env(HOME=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    machine_id = Path("/etc/machine-id").read_text().strip()
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert data["machine_identity_complete"] is True and len(data["machine_identity"]) == 32
    for raw in (machine_id, boot_id, boot_id.replace("-", "")):
        assert raw not in done.stdout


def _run_demo(out: Path, env: dict[str, str], with_flag: bool, tmp_path: Path) -> None:
    tasks = "feature-flag-probe,locale-probe,shape-shifter"
    argv = [sys.executable, "-m", "agent_runner", "run", "--suite", str(TRIAGE), "--out", str(out), "--tasks",
            tasks, "--repeat", "1"]
    if with_flag:  # a private /opt, as on box-b: the host's own /opt is untouched
        opt = tmp_path / "opt"
        (opt / "crosshost-demo").mkdir(parents=True)
        (opt / "crosshost-demo" / "feature.flag").write_text("on\n")
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                f'mount --bind "{opt}" /opt && exec "$@"', "sh", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.root
def test_demo_host_facts_flip_the_probes_and_change_the_agents_shape(tmp_path: Path) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    _run_demo(here, clean_env(LANG="C.UTF-8"), with_flag=False, tmp_path=tmp_path)
    without_lang = {k: v for k, v in clean_env().items() if k not in ("LANG", "LC_ALL")}
    _run_demo(there, without_lang, with_flag=True, tmp_path=tmp_path)
    verdict = {(d.name, r["task"]): r["verdict"] for d in (here, there) for r in records(d / "results.jsonl")}
    assert verdict[("here", "feature-flag-probe")] == "pass" and verdict[("there", "feature-flag-probe")] == "fail"
    assert verdict[("here", "locale-probe")] == "pass" and verdict[("there", "locale-probe")] == "fail"
    # shape-shifter passes on both hosts, but its restart_unit call has another argument set on box-b
    assert verdict[("here", "shape-shifter")] == verdict[("there", "shape-shifter")] == "pass"
    restart = [[t["args"] for t in records(d / "traces" / "shape-shifter.0.jsonl")
                if t.get("tool") == "restart_unit"] for d in (here, there)]
    assert restart == [[{"unit": "nginx.service"}], [{"unit": "nginx.service", "grace_s": 30}]]


def test_the_fingerprint_records_the_path_attempts_start_from_and_a_different_path_moves_the_digest(
    tmp_path: Path,
) -> None:
    (tmp_path / "work").mkdir()

    def fingerprint(path: str) -> dict[str, object]:
        done = run_runner("fingerprint", "--cwd", str(tmp_path / "work"), env=clean_env(PATH=path))
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    login = fingerprint("/usr/local/bin:/usr/bin:/bin")
    venv = fingerprint(f"{tmp_path}/.venv/bin:/usr/local/bin:/usr/bin:/bin")
    assert login["path"] == "/usr/local/bin:/usr/bin:/bin"
    assert venv["path"] == f"{tmp_path}/.venv/bin:/usr/local/bin:/usr/bin:/bin"
    assert venv["fingerprint"] != login["fingerprint"]
