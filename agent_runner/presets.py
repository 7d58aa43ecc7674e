"""``agent.preset``: the agent CLIs people run, each set up to reach the model proxy with the attempt's
placeholder and to take the contract's tools from the runner's MCP server.

A preset supplies the ``command`` (the CLI as found on the host's ``PATH``; a suite's own ``command``
overrides it), the ``api`` it speaks, fixed variables, and writes the CLI's own configuration into the
attempt's disposable ``HOME`` before the agent starts. The model's tool names are the CLI's (its MCP
prefix or namespace); ``exec_agent.contract_name`` maps them to the contract's.

Standard library only, Python 3.9 syntax: this travels in the runner zipapp.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Dict, List, Tuple, TypedDict

from .recordclass import dataclass, field

#: writes the CLI's configuration under HOME; given HOME, the attempt's base on the proxy
#: (``<proxy>/attempt/<task>.<attempt>``), the placeholder, the MCP server (``command``, ``args``,
#: ``env``) and the model; returns the variables the CLI reads. A CLI is pointed at the proxy in its own
#: API whatever the suite's ``api`` says: a mismatch is then the proxy's refusal, named, not silence.
Configure = Callable[[Path, str, str, "McpServerConfig", str], Dict[str, str]]


class McpServerConfig(TypedDict):
    """The runner's MCP server as an agent CLI's configuration names it (``exec_agent.mcp_server``)."""

    type: str  # "stdio"
    command: str
    args: List[str]
    env: Dict[str, str]


def _openai_env(home: Path, base: str, token: str, server: McpServerConfig, model: str) -> Dict[str, str]:
    return {"OPENAI_BASE_URL": base + "/v1", "OPENAI_API_KEY": token}


def _anthropic_env(home: Path, base: str, token: str, server: McpServerConfig, model: str) -> Dict[str, str]:
    return {"ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": token}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _toml(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(value, ensure_ascii=False)


def _codex(home: Path, base: str, token: str, server: McpServerConfig, model: str) -> Dict[str, str]:
    # Codex speaks only the Responses API to a provider of its config (wire_api = "responses"), reads
    # the key from env_key, and shows the MCP server's tools to its model in the namespace mcp__crosshost
    lines = [
        f"model = {_toml(model)}", 'model_provider = "crosshost"', "",
        "[model_providers.crosshost]", 'name = "crosshost"', f"base_url = {_toml(base + '/v1')}",
        # supports_websockets = false: HTTP from the first request (the proxy serves no WebSocket)
        'env_key = "OPENAI_API_KEY"', 'wire_api = "responses"', "supports_websockets = false", "",
        "[mcp_servers.crosshost]", f"command = {_toml(server['command'])}",
        "args = [" + ", ".join(_toml(a) for a in server["args"]) + "]", "",
        "[mcp_servers.crosshost.env]", *(f"{_toml(k)} = {_toml(v)}" for k, v in sorted(server["env"].items())), "",
    ]
    _write(home / ".codex" / "config.toml", "\n".join(lines))
    return {"OPENAI_API_KEY": token}


# the runner's MCP server started with its import path as an argument, not PYTHONPATH
_BOOT = "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); runpy.run_module('agent_runner', run_name='__main__', alter_sys=True)"


#: the skills Gemini CLI 0.61.0 ships in its bundle (bundle/builtin/<name>/SKILL.md)
GEMINI_BUILTIN_SKILLS = ("antigravity-support", "skill-creator")


def _gemini(home: Path, base: str, token: str, server: McpServerConfig, model: str) -> Dict[str, str]:
    # without selectedType = gemini-api-key, Gemini CLI ignores GOOGLE_GEMINI_BASE_URL and asks for a
    # login; it refuses to set PYTHONPATH for an MCP server, so the server is told its path otherwise
    env = dict(server["env"])
    args = list(server["args"])
    if args[:2] == ["-m", "agent_runner"] and "PYTHONPATH" in env:
        args = ["-c", _BOOT, env.pop("PYTHONPATH"), *args[2:]]
    # its two built-in skills are listed in every prompt in the order its file walk happens to finish,
    # so two hosts' first requests could differ by that order alone (a held model: a divergence)
    settings = {"security": {"auth": {"selectedType": "gemini-api-key"}},
                "skills": {"disabled": list(GEMINI_BUILTIN_SKILLS)},
                "mcpServers": {"crosshost": {"command": server["command"], "args": args, "env": env}}}
    _write(home / ".gemini" / "settings.json", json.dumps(settings, indent=2) + "\n")
    # GEMINI_CLI_TRUST_WORKSPACE: headless in a folder it has not been told to trust
    return {"GOOGLE_GEMINI_BASE_URL": base, "GEMINI_API_KEY": token, "GEMINI_CLI_TRUST_WORKSPACE": "true"}


def _opencode(home: Path, base: str, token: str, server: McpServerConfig, model: str) -> Dict[str, str]:
    # opencode ignores OPENAI_BASE_URL: the proxy is a provider of its config (chat completions); the
    # title agent is off, its request would race the first one
    config = {
        "$schema": "https://opencode.ai/config.json", "model": f"crosshost/{model}", "small_model": f"crosshost/{model}",
        "autoupdate": False, "share": "disabled",
        "provider": {"crosshost": {"npm": "@ai-sdk/openai-compatible", "name": "crosshost",
                                   "options": {"baseURL": base + "/v1", "apiKey": token},
                                   "models": {model: {"name": model}}}},
        "mcp": {"crosshost": {"type": "local", "command": [server["command"], *server["args"]],
                              "environment": server["env"], "enabled": True}},
        "agent": {"title": {"disable": True}},
    }
    _write(home / ".config" / "opencode" / "opencode.json", json.dumps(config, indent=2) + "\n")
    return {}


@dataclass(frozen=True)
class Preset:
    """An agent CLI crosshost knows how to start and point at the model proxy."""

    name: str
    api: str  # the wire API family it speaks
    command: Tuple[str, ...]
    tested: str  # the version the integration tests drive
    env: Dict[str, str] = field(default_factory=dict)
    configure: Configure = _openai_env
    uses_mcp: bool = True  # takes the contract's tools from the runner's MCP server


PRESETS: Dict[str, Preset] = {p.name: p for p in (
    Preset("claude-code", "anthropic",
           ("claude", "-p", "--model", "{model}", "--mcp-config", "{mcp_config}", "--strict-mcp-config", "--tools=",
            "--allowedTools", "mcp__crosshost", "--no-session-persistence", "--output-format", "text", "--",
            "{prompt}"),
           "@anthropic-ai/claude-code 2.1.332",
           env={"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"},
           configure=_anthropic_env),
    Preset("codex", "openai",
           ("codex", "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--", "{prompt}"),
           "@openai/codex 0.171.0", configure=_codex),
    Preset("gemini-cli", "gemini", ("gemini", "--model", "{model}", "--yolo", "--prompt={prompt}"),
           "@google/gemini-cli 0.61.0", configure=_gemini),
    Preset("opencode", "openai", ("opencode", "run", "--", "{prompt}"), "opencode 1.18.33", configure=_opencode),
    Preset("mini-swe-agent", "openai",
           ("mini", "--model", "openai/{model}", "--task={prompt}", "--yolo", "--exit-immediately", "--cost-limit", "0"),
           "mini-swe-agent 2.4.6 (PyPI)",
           # without these it stops to ask for a first-run setup and for a price of the unknown model
           env={"MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
           uses_mcp=False),
)}
