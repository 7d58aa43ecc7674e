"""The runner's MCP server, message by message (the official client drives it in the sshd tests), and
how an exec agent's command and MCP calls are put together."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_runner.exec_agent import argv_of, contract_name, merge_mcp_turns
from agent_runner.mcp_server import MAX_MESSAGE_CHARS, McpServer
from agent_runner.suite import AgentSpec
from agent_runner.tools import ToolBox
from tests.support.runner import clean_env, write_suite

CONTRACT = {"contract_id": "c", "tools": [{"name": "lookup", "required_args": ["q"]}, {"name": "list_dir"}]}


def _server(tmp_path: Path) -> McpServer:
    box = ToolBox(CONTRACT, {}, {"lookup": "42"}, tmp_path, {"PATH": "/usr/bin"})
    return McpServer(box, CONTRACT["tools"], tmp_path / "turns.jsonl")  # type: ignore[arg-type]


def test_both_protocol_revisions_are_spoken_and_an_unknown_one_gets_the_newest(tmp_path: Path) -> None:
    server = _server(tmp_path)
    for asked, got in (("2025-06-18", "2025-06-18"), ("2025-11-25", "2025-11-25"), ("2099-01-01", "2025-11-25")):
        answer = server.handle({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                "params": {"protocolVersion": asked, "capabilities": {}}})
        assert answer is not None and answer["result"]["protocolVersion"] == got
    assert server.handle({"jsonrpc": "2.0", "method": "notifications/initialized"}) is None


def test_tools_list_and_a_call_outside_the_contract_starts_nothing(tmp_path: Path) -> None:
    server = _server(tmp_path)
    listed = server.handle({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    assert listed is not None
    tools = {t["name"]: t["inputSchema"] for t in listed["result"]["tools"]}
    assert tools["lookup"]["required"] == ["q"] and tools["list_dir"]["required"] == ["path"]
    called = server.handle({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                            "params": {"name": "shell", "arguments": {"argv": ["touch", "x"]}}})
    assert called is not None and called["result"]["isError"] is True
    assert server.toolbox.processes_started == 0 and not (tmp_path / "x").exists()
    ok = server.handle({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                        "params": {"name": "lookup", "arguments": {"q": "a"}}})
    assert ok is not None and ok["result"] == {"content": [{"type": "text", "text": "42"}], "isError": False}
    assert len((tmp_path / "turns.jsonl").read_text().splitlines()) == 2
    missing = server.handle({"jsonrpc": "2.0", "id": 5, "method": "resources/list"})
    assert missing is not None and missing["error"]["code"] == -32601


def test_an_agent_clis_name_for_a_contract_tool_and_its_mcp_call_are_one_turn(tmp_path: Path) -> None:
    # Claude Code shows the server's "lookup" to its model as mcp__crosshost__lookup
    asked = [{"tool": "mcp__crosshost__lookup", "args": {"q": "a"}, "observation": "", "prompt_tokens": 5},
             {"tool": "mcp__crosshost__lookup", "args": {"q": "b"}, "observation": "", "prompt_tokens": 0},
             {"tool": "mcp__other__lookup", "args": {"q": "a"}, "observation": "", "prompt_tokens": 0}]
    served = tmp_path / "turns.jsonl"
    served.write_text("".join(json.dumps(c) + "\n" for c in (
        {"tool": "lookup", "args": {"q": "b"}, "observation": "B", "error": None},
        {"tool": "lookup", "args": {"q": "a"}, "observation": "A", "error": None},
        {"tool": "lookup", "args": {"q": "c"}, "observation": "C", "error": None},
    )))
    merged = merge_mcp_turns(asked, served)
    assert [(t["tool"], t["args"], t["observation"]) for t in merged] == [
        ("lookup", {"q": "a"}, "A"), ("lookup", {"q": "b"}, "B"),
        ("mcp__other__lookup", {"q": "a"}, ""),  # another server's tool is no contract tool
        ("lookup", {"q": "c"}, "C"),  # called over MCP, never asked for by the model
    ]
    assert merged[0]["prompt_tokens"] == 5 and contract_name("crosshost__write_file") == "write_file"
    assert contract_name("mcp__crosshost__") == "mcp__crosshost__"


def test_command_placeholders_are_replaced_once_and_the_prompt_stays_as_written(tmp_path: Path) -> None:
    spec = AgentSpec(kind="exec", command=["cli", "-p", "{prompt}", "--mcp-config={mcp_config}", "{suite}/x"])
    argv = argv_of(spec, "write {workspace} into {prompt_file}", tmp_path / "p.md", tmp_path / "w", tmp_path / "s")
    assert argv == ["cli", "-p", "write {workspace} into {prompt_file}", f"--mcp-config={tmp_path}/w/.mcp.json",
                    f"{tmp_path}/s/x"]


@pytest.mark.parametrize("line", ["[" * 100_000, '{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": ' + "[" * 5000
                                  + "]" * 5000 + "}", "x" * (MAX_MESSAGE_CHARS + 10)])
def test_a_deep_or_overlong_message_is_a_json_rpc_parse_error_and_the_server_goes_on(tmp_path: Path, line: str) -> None:
    """100,000 '[' (a RecursionError in json) or a line over the bound: one parse error answered, no
    traceback, and the next message is served."""
    suite = write_suite(tmp_path / "s", {"t": {"script": []}})
    ping = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping"})
    done = subprocess.run([sys.executable, "-m", "agent_runner", "mcp", "--suite", str(suite), "--task", "t",
                           "--workspace", str(tmp_path)], input=line + "\n" + ping + "\n", capture_output=True,
                          text=True, env=clean_env(), timeout=60)
    answers = [json.loads(a) for a in done.stdout.splitlines()]
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert answers[0]["error"]["code"] == -32700 and answers[1] == {"jsonrpc": "2.0", "id": 2, "result": {}}
