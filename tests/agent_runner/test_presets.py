"""agent.preset: the CLI's command and API unless the suite names its own, and the CLI's own
configuration in the attempt's HOME pointing it at the proxy with the placeholder."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest

from agent_runner.errors import SuiteError
from agent_runner.presets import PRESETS
from agent_runner.suite import load_suite
from tests.agent_runner.test_suite import GOOD
from tests.support.runner import write_suite

BASE = "http://127.0.0.1:9/attempt/t.0"
SERVER = {"type": "stdio", "command": "/usr/bin/python3", "args": ["-m", "agent_runner", "mcp", "--task", "t"],
          "env": {"HOME": "/h", "PYTHONPATH": "/opt/runner.pyz"}}


def _agent(tmp_path: Path, extra: str) -> dict[str, object]:
    toml = ('[agent]\nkind = "exec"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\napi_key_env = "K"\n' + extra)
    return load_suite(write_suite(tmp_path / "s", {"a": dict(GOOD, toml=toml)})).tasks[0].agent.to_dict()


def test_a_preset_supplies_the_command_and_api_and_the_suite_may_name_its_own(tmp_path: Path) -> None:
    agent = _agent(tmp_path, 'preset = "codex"\n')
    assert agent["command"][:2] == ["codex", "exec"] and agent["api"] == "openai"
    agent = _agent(tmp_path / "b", 'preset = "gemini-cli"\ncommand = ["/opt/gemini"]\napi = "openai"\n')
    assert agent["command"] == ["/opt/gemini"] and agent["api"] == "openai" and agent["preset"] == "gemini-cli"
    with pytest.raises(SuiteError, match=r"preset must be one of 'claude-code', 'codex', .* got 'aider'"):
        _agent(tmp_path / "c", 'preset = "aider"\n')
    with pytest.raises(SuiteError, match=r"command must be a non-empty list .* \(or a preset: claude-code"):
        _agent(tmp_path / "d", 'api = "openai"\n')


def test_codex_config_is_toml_with_a_responses_provider_and_the_mcp_server(tmp_path: Path) -> None:
    env = PRESETS["codex"].configure(tmp_path, BASE, "crosshost-t", {**SERVER, "env": {"A": 'quo"te\n'}}, "m1")
    config = tomllib.loads((tmp_path / ".codex" / "config.toml").read_text())
    assert config["model"] == "m1" and config["model_provider"] == "crosshost"
    assert config["model_providers"]["crosshost"] == {
        "name": "crosshost", "base_url": BASE + "/v1", "env_key": "OPENAI_API_KEY", "wire_api": "responses",
        "supports_websockets": False}
    assert config["mcp_servers"]["crosshost"] == {"command": "/usr/bin/python3", "args": SERVER["args"],
                                                  "env": {"A": 'quo"te\n'}}
    assert env == {"OPENAI_API_KEY": "crosshost-t"}


def test_gemini_cli_settings_select_the_api_key_and_start_the_server_without_pythonpath(tmp_path: Path) -> None:
    env = PRESETS["gemini-cli"].configure(tmp_path, BASE, "crosshost-t", SERVER, "m1")
    settings = json.loads((tmp_path / ".gemini" / "settings.json").read_text())
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    # the CLI's built-in skills, listed in its prompt in no fixed order, are off: every host's prompt is the same
    assert sorted(settings["skills"]["disabled"]) == ["antigravity-support", "skill-creator"]
    server = settings["mcpServers"]["crosshost"]
    assert "PYTHONPATH" not in server["env"] and server["args"][2:] == ["/opt/runner.pyz", "mcp", "--task", "t"]
    # the boot line puts that path first and runs the runner's module with the rest as its arguments
    probe = subprocess.run(["/usr/bin/python3", "-c", server["args"][1].replace(
        "runpy.run_module('agent_runner', run_name='__main__', alter_sys=True)", "print(sys.path[0], sys.argv[1:])"),
        "/opt/runner.pyz", "mcp", "--task", "t"], capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "/opt/runner.pyz ['mcp', '--task', 't']"
    assert env == {"GOOGLE_GEMINI_BASE_URL": BASE, "GEMINI_API_KEY": "crosshost-t", "GEMINI_CLI_TRUST_WORKSPACE": "true"}


def test_opencode_gets_a_provider_of_the_proxy_and_mini_swe_agent_its_variables(tmp_path: Path) -> None:
    PRESETS["opencode"].configure(tmp_path, BASE, "crosshost-t", SERVER, "m1")
    config = json.loads((tmp_path / ".config" / "opencode" / "opencode.json").read_text())
    assert config["model"] == "crosshost/m1" and config["agent"] == {"title": {"disable": True}}
    assert config["provider"]["crosshost"]["options"] == {"baseURL": BASE + "/v1", "apiKey": "crosshost-t"}
    assert config["mcp"]["crosshost"]["command"] == ["/usr/bin/python3", *SERVER["args"]]
    mini = PRESETS["mini-swe-agent"]
    assert mini.configure(tmp_path, BASE, "crosshost-t", SERVER, "m1") == {
        "OPENAI_BASE_URL": BASE + "/v1", "OPENAI_API_KEY": "crosshost-t"}
    assert mini.env["MSWEA_CONFIGURED"] == "true" and not mini.uses_mcp
