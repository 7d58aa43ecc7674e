"""An exec agent written against the official ``anthropic`` SDK, as a user would write one.

It knows nothing of crosshost: ``Anthropic()`` reads ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY``. It
streams every answer (the SDK's ``messages.stream``), runs its own two tools in the working directory,
and stops when the model stops. argv: the prompt file, then a file to append a line to on each
stream's first event (or "-").
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from anthropic import Anthropic

TOOLS: list[Any] = [
    {"name": "lookup", "description": "look a fact up",
     "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}},
    {"name": "write_file", "description": "write a file",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                      "required": ["path", "content"]}},
]


def run_tool(name: str, args: dict[str, Any]) -> str:
    if name == "lookup":
        return Path("notes.txt").read_text()
    if name == "write_file":
        Path(args["path"]).write_text(args["content"])
        return f"wrote {len(args['content'])} bytes"
    return f"unknown tool {name}"


def main() -> int:
    prompt, mark = Path(sys.argv[1]).read_text(), sys.argv[2]
    client = Anthropic()
    messages: list[Any] = [{"role": "user", "content": prompt}]
    for _ in range(1000):
        with client.messages.stream(model=os.environ["CROSSHOST_MODEL"], max_tokens=512, messages=messages,
                                    tools=TOOLS) as stream:
            for n, _event in enumerate(stream):
                if n == 0 and mark != "-":
                    Path(mark, f"{os.getpid()}-{time.time_ns()}").write_text("first event\n")
            message = stream.get_final_message()
        uses = [b for b in message.content if b.type == "tool_use"]
        if not uses:
            print("".join(b.text for b in message.content if b.type == "text"))
            return 0
        messages.append({"role": "assistant", "content": [b.model_dump() for b in message.content]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b.id, "content": run_tool(b.name, dict(b.input))} for b in uses]})
    return 1


if __name__ == "__main__":
    sys.exit(main())
