"""The runner's MCP server, message by message (the official client drives it in the sshd tests)."""

from __future__ import annotations

from pathlib import Path

from agent_runner.mcp_server import McpServer
from agent_runner.tools import ToolBox

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
