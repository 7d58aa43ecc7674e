"""An exec agent written against the official ``openai`` SDK, as a user would write one.

It knows nothing of crosshost: ``OpenAI()`` reads ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``. It streams
every answer, runs its own two tools in the working directory, and stops when the model stops.
argv: the prompt file, then a directory to create a file in on each stream's first event (or "-").
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from openai import OpenAI

TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "lookup", "description": "look a fact up",
                                      "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                                     "required": ["q"]}}},
    {"type": "function", "function": {"name": "write_file", "description": "write a file",
                                      "parameters": {"type": "object",
                                                     "properties": {"path": {"type": "string"},
                                                                    "content": {"type": "string"}},
                                                     "required": ["path", "content"]}}},
]


def run_tool(name: str, args: dict[str, Any]) -> str:
    if name == "lookup":
        return Path("notes.txt").read_text()
    if name == "write_file":
        Path(args["path"]).write_text(args["content"])
        return f"wrote {len(args['content'])} bytes"
    return f"unknown tool {name}"


def _chunks(stream: Any, mark: str) -> Any:
    for n, chunk in enumerate(stream):
        if n == 0 and mark != "-":  # the first event arrived: say so before the rest comes
            Path(mark, f"{os.getpid()}-{time.time_ns()}").write_text("first event\n")
        yield chunk


def main() -> int:
    prompt, mark = Path(sys.argv[1]).read_text(), sys.argv[2]
    client = OpenAI()
    messages: list[Any] = [{"role": "user", "content": prompt}]
    for _ in range(1000):
        text, calls = "", {}
        with client.chat.completions.create(model=os.environ["CROSSHOST_MODEL"], messages=messages,
                                            tools=TOOLS, stream=True) as stream:
            chunks = list(_chunks(stream, mark))
        for chunk in chunks:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for call in choice.delta.tool_calls or []:
                    slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] = call.id or slot["id"]
                    if call.function is not None:
                        slot["name"] += call.function.name or ""
                        slot["arguments"] += call.function.arguments or ""
        if not calls:
            print(text)
            return 0
        messages.append({"role": "assistant", "content": text or None, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls.values()]})
        for c in calls.values():
            result = run_tool(c["name"], json.loads(c["arguments"] or "{}"))
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
    return 1


if __name__ == "__main__":
    sys.exit(main())
