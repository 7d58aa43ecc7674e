"""An exec agent that takes its tools from MCP with the official ``mcp`` client library.

argv: the MCP client configuration crosshost wrote (``{mcp_config}``, the ``.mcp.json`` layout). It
starts the configured server as any MCP host would, lists the tools and calls them: a fixture, a
built-in, a tool outside the contract and a forbidden argument. It prints one JSON line of what it saw.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def _is_error(result: Any) -> bool:
    return bool(getattr(result, "is_error", getattr(result, "isError", False)))


def _text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def main() -> None:
    with open(sys.argv[1]) as fh:
        server = json.load(fh)["mcpServers"]["crosshost"]
    params = StdioServerParameters(command=server["command"], args=server["args"], env=server["env"])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        tools = await session.list_tools()
        found = await session.call_tool("lookup", {"q": "answer"})
        wrote = await session.call_tool("write_file", {"path": "answer.txt", "content": _text(found).split()[-1]})
        unknown = await session.call_tool("rm_rf", {"path": "/"})
        forbidden = await session.call_tool("lookup", {"q": "answer", "token": "t"})
    print(json.dumps({
        "protocol": getattr(init, "protocol_version", getattr(init, "protocolVersion", None)),
        "tools": sorted(t.name for t in tools.tools),
        "lookup": _text(found), "write_file": [_is_error(wrote), _text(wrote)],
        "unknown": [_is_error(unknown), _text(unknown)], "forbidden": [_is_error(forbidden), _text(forbidden)],
    }))


if __name__ == "__main__":
    asyncio.run(main())
