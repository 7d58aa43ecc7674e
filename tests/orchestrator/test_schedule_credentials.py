"""`crosshost schedule` and the credentials a scheduled run needs: checked when the unit is written,
handed to it through an environment file of mode 0600, tried once with `--check` in the unit's own
environment; a scheduled run that fails before it starts leaves its reason in `crosshost history`."""

from __future__ import annotations

import json
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.commands import schedule

TRIAGE = Path(__file__).resolve().parents[2] / "examples" / "suites" / "triage"
LOCAL = "[[hosts]]\nname = 'local'\ntransport = 'local'\n"


def _agent_host(project: Path) -> str:
    key = project / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return (f"\n[[hosts]]\nname = 'box-c'\ntransport = 'ssh'\naddress = '127.0.0.1'\nport = 2\n"
            f"user = 'root'\nidentity_file = '{key}'\nuse_agent = true\n"
            "connect_timeout_s = 1\n")  # nothing listens there: its refused connects retried for 2 s, not 20


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "suites").mkdir()
    shutil.copytree(TRIAGE, tmp_path / "suites" / "triage")
    (tmp_path / "hosts.toml").write_text(LOCAL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setattr(schedule, "systemd_available", lambda: True)
    return tmp_path


def _invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, ["schedule", "suites/triage", "--every", "6h", *args], env=env)
    return res.exit_code, res.stdout, res.stderr


def test_a_use_agent_host_without_ssh_auth_sock_is_refused_naming_host_key_and_variable(project: Path) -> None:
    (project / "hosts.toml").write_text(LOCAL + _agent_host(project))
    code, out, err = _invoke("--install")
    assert code == 2, out + err
    assert "host 'box-c': key 'use_agent': SSH_AUTH_SOCK is not set" in err
    assert not (project / "config" / "systemd" / "user").exists()  # nothing half-installed


def test_the_units_read_an_environment_file_of_mode_0600_holding_what_the_run_needs(project: Path) -> None:
    (project / "hosts.toml").write_text(LOCAL + _agent_host(project))
    sock = project / "agent.sock"
    code, out, err = _invoke("--install", env={"SSH_AUTH_SOCK": str(sock)})
    assert code == 0, out + err
    env_file = project / "config" / "crosshost" / "crosshost-triage.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert env_file.read_text() == f"SSH_AUTH_SOCK={shlex.quote(str(sock))}\n"
    service = (project / "config" / "systemd" / "user" / "crosshost-triage.service").read_text()
    assert f"EnvironmentFile={env_file}\n" in service
    assert f"wrote {env_file} (mode 0600): SSH_AUTH_SOCK" in out
    # the agent's socket lives as long as the agent: said plainly, with the way to a lasting one
    assert "SSH_AUTH_SOCK" in err and "only while that ssh-agent runs" in err


def test_printing_the_units_warns_what_the_run_needs_and_how_to_provide_it(project: Path) -> None:
    suite = project / "suites" / "triage" / "suite.toml"
    suite.write_text(suite.read_text().replace('kind = "scripted"', 'kind = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\napi_key_env = "MY_LLM_KEY"', 1))
    code, out, err = _invoke(env={"MY_LLM_KEY": "sk-secret-value"})
    assert code == 0, out + err
    env_file = project / "config" / "crosshost" / "crosshost-triage.env"
    assert f"EnvironmentFile={env_file}" in out
    assert "the scheduled run needs MY_LLM_KEY (suite triage: agent.api_key_env)" in err
    assert f"--install writes this shell's values into {env_file} (mode 0600)" in err
    assert "sk-secret-value" not in out + err and not env_file.exists()
    code, out, err = _invoke("--cron", "--install", env={"MY_LLM_KEY": "sk-secret-value"})
    assert code == 0, out + err
    assert f". {env_file}" in out and env_file.read_text() == "MY_LLM_KEY=sk-secret-value\n"
    # an api_key_env unset here would leave the scheduled run without its key: refused
    code, out, err = _invoke("--install", env={"MY_LLM_KEY": ""})
    assert code == 2 and "suite triage: agent.api_key_env: MY_LLM_KEY is not set" in err


def test_check_runs_the_scheduled_command_once_in_the_units_environment(project: Path) -> None:
    code, out, err = _invoke("--cron", "--check")
    assert code == 0, out + err  # it ran: exit 1 is this one-host inventory's "nothing comparable"
    assert "check: running the scheduled replay once as cron starts it (env -i: HOME, LOGNAME, SHELL, PATH=/usr/bin:/bin)" in out
    assert "check: the scheduled replay exited 1" in out
    assert (project / "runs" / "index.sqlite").is_file()  # a real run, recorded in the history


def test_check_gives_the_run_the_environment_file_and_nothing_of_this_shell(project: Path) -> None:
    (project / "hosts.toml").write_text(LOCAL + _agent_host(project))
    sock = str(project / "agent.sock")
    code, out, err = _invoke("--cron", "--install", "--check", env={"SSH_AUTH_SOCK": sock})
    # the run got SSH_AUTH_SOCK from the file: past the inventory, it failed at box-c's port (a host failed)
    assert code == 3 and "check: the scheduled replay exited 3" in out, out + err
    env_file = project / "config" / "crosshost" / "crosshost-triage.env"
    env_file.unlink()
    code, out, err = _invoke("--cron", "--check", env={"SSH_AUTH_SOCK": sock})
    # this shell has SSH_AUTH_SOCK, cron would not: the check says so as the scheduled run would
    assert code == 2 and "check: the scheduled replay exited 2" in out, out + err
    assert f"check: {env_file} does not exist: the run gets none of SSH_AUTH_SOCK" in out


def test_a_scheduled_run_that_fails_before_it_starts_leaves_its_reason_in_history(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "hosts.toml").write_text(LOCAL + _agent_host(project))
    monkeypatch.setenv("SSH_AUTH_SOCK", str(project / "agent.sock"))  # here, not where cron starts it
    plan = schedule.plan_schedule(Path("suites/triage"), "6h", Path("hosts.toml"), Path("runs"), "cron")
    # as cron runs it: an empty environment but for the file the line reads (here: none written)
    done = subprocess.run(["env", "-i", f"HOME={project}", "PATH=/usr/bin:/bin", *plan.command],
                          cwd=project, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    res = CliRunner().invoke(app, ["history", "--out", "runs"], env={"COLUMNS": "100"})
    assert res.exit_code == 0, res.output
    assert "scheduled run failed" in res.output
    assert "host 'box-c': key 'use_agent': SSH_AUTH_SOCK is not set" in " ".join(res.output.split())
    res = CliRunner().invoke(app, ["history", "--out", "runs", "--json"])
    (failure,) = [e for e in json.loads(res.output) if e.get("failure")]
    assert failure["exit_code"] == 2 and failure["suite"] == "triage"
    assert "SSH_AUTH_SOCK is not set" in failure["reason"]
