"""The contract's tools as an MCP server over stdio (``runner mcp``), for exec agents.

JSON-RPC 2.0, one message a line, protocol revisions ``2025-06-18`` and ``2025-11-25`` (``initialize``,
``notifications/initialized``, ``ping``, ``tools/list``, ``tools/call``). The tools are the suite's
contract tools, served by the runner's own ``ToolBox``: fixtures and built-ins with the same
confinement and checks as for any agent; a tool outside the contract gets an error result
(``isError``) and starts no process. Every call is appended to ``--turns`` (JSON lines), which the
runner writes into the attempt's trace when the agent has exited.

Standard library only, Python 3.9 syntax: this travels in the runner zipapp.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import IO, List, Optional, TypedDict

from . import jsonfile
from .checker import ContractTool
from .jsonfile import JSONObject, JSONValue
from .suite import load_suite
from .tools import ToolBox

PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18")  # newest first
SERVER_NAME = "crosshost-contract-tools"
TOOL_TIMEOUT_S = 120.0
#: the longest JSON-RPC message (one line) read; a tool call's arguments fit many times over
MAX_MESSAGE_CHARS = 4 * 1024 * 1024


def _schema(tool: ContractTool) -> JSONObject:
    from .openai_agent import BUILTIN_PARAMETERS  # one home for the built-ins' schemas

    parameters = tool.get("parameters")
    if isinstance(parameters, dict):
        return dict(parameters)
    if tool["name"] in BUILTIN_PARAMETERS:
        return dict(BUILTIN_PARAMETERS[tool["name"]])
    required: List[JSONValue] = [a for a in tool.get("required_args", []) if isinstance(a, str)]
    properties: JSONObject = {str(a): {} for a in required}
    return {"type": "object", "properties": properties, "required": required}


class RpcError(TypedDict):
    code: int
    message: str


class RpcAnswer(TypedDict, total=False):
    """A JSON-RPC 2.0 response: ``result`` or ``error``, for the request ``id``."""

    jsonrpc: str
    id: JSONValue
    result: JSONObject
    error: RpcError


class McpTurn(TypedDict):
    """One line of ``--turns``: a tool call the agent made through this server, and its answer."""

    tool: str
    args: JSONObject
    observation: str
    error: Optional[str]


class McpServer:
    def __init__(self, toolbox: ToolBox, tools: List[ContractTool], turns: Optional[Path]) -> None:
        self.toolbox = toolbox
        self.tools = tools
        self.turns = turns

    def handle(self, message: JSONValue) -> Optional[RpcAnswer]:
        """The answer to one JSON-RPC message (None for a notification)."""
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
            return _error(message.get("id") if isinstance(message, dict) else None, -32600, "invalid request")
        method, params, ident = message["method"], message.get("params") or {}, message.get("id")
        if "id" not in message:
            return None  # notifications (initialized, cancelled) need no answer
        if method == "initialize":
            asked = params.get("protocolVersion") if isinstance(params, dict) else None
            version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
            return _result(ident, {"protocolVersion": version, "capabilities": {"tools": {"listChanged": False}},
                                   "serverInfo": {"name": SERVER_NAME, "version": "1"}})
        if method == "ping":
            return _result(ident, {})
        if method == "tools/list":
            return _result(ident, {"tools": [
                {"name": t["name"], "description": str(t.get("description") or f"contract tool {t['name']}"),
                 "inputSchema": _schema(t)} for t in self.tools]})
        if method == "tools/call":
            name = params.get("name") if isinstance(params, dict) else None
            if not isinstance(params, dict) or not isinstance(name, str):
                return _error(ident, -32602, "tools/call needs params.name")
            args = params.get("arguments") or {}
            result = self.toolbox.call(name, args, TOOL_TIMEOUT_S)
            self._log({"tool": name, "args": args if isinstance(args, dict) else {}, "observation": result.observation,
                       "error": result.error})
            text = result.error if result.error and not result.observation else result.observation
            return _result(ident, {"content": [{"type": "text", "text": text}], "isError": result.error is not None})
        return _error(ident, -32601, f"method {method!r} not found")

    def _log(self, turn: McpTurn) -> None:
        if self.turns is not None:
            with open(self.turns, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(turn) + "\n")

    def serve(self, stdin: IO[str], stdout: IO[str]) -> None:
        """One JSON-RPC message a line; a line over ``MAX_MESSAGE_CHARS`` or nested deeper than
        ``jsonfile.MAX_DEPTH`` is a parse error answered as one (the rest of an overlong line is
        drained, never held)."""
        while True:
            line = stdin.readline(MAX_MESSAGE_CHARS + 1)
            if not line:
                return
            answer: Optional[RpcAnswer]
            if len(line) > MAX_MESSAGE_CHARS and not line.endswith("\n"):
                while line and not line.endswith("\n"):
                    line = stdin.readline(MAX_MESSAGE_CHARS)
                answer = _error(None, -32700, f"parse error: a message over {MAX_MESSAGE_CHARS} characters")
            elif not line.strip():
                continue
            else:
                try:
                    message = jsonfile.loads(line)
                except ValueError as exc:
                    answer = _error(None, -32700, f"parse error: {str(exc)[:200]}")
                else:
                    answer = self.handle(message)
            if answer is not None:
                stdout.write(json.dumps(answer) + "\n")
                stdout.flush()


def _result(ident: JSONValue, result: JSONObject) -> RpcAnswer:
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def _error(ident: JSONValue, code: int, message: str) -> RpcAnswer:
    return {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}}


def serve_mcp(suite_dir: str, task_id: str, workspace: str, turns: Optional[str], env_keys: List[str]) -> int:
    suite = load_suite(suite_dir)
    task = suite.task(task_id)
    env = {k: os.environ[k] for k in env_keys if k in os.environ}
    toolbox = ToolBox(suite.contract, suite.tools, task.fixtures, Path(workspace), env)
    tools = [t for t in suite.contract.get("tools", []) if isinstance(t, dict) and isinstance(t.get("name"), str)]
    McpServer(toolbox, tools, Path(turns) if turns else None).serve(sys.stdin, sys.stdout)
    return 0
