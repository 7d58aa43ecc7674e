"""OpenAI Responses: ``POST /v1/responses``, streamed or not (Codex, the OpenAI Agents SDK).

The conversation is ``input``, a list of items: messages, the model's earlier ``function_call`` and
``custom_tool_call`` items (a free-form tool such as Codex's ``apply_patch``: its ``input`` is text),
``reasoning`` items passed back as they came, and the agent's ``function_call_output`` /
``custom_tool_call_output`` items, matched to their call by ``call_id``. A call made through a tool
namespace (Codex shows an MCP server's tools as the namespace ``mcp__<server>``) is recorded as
``<namespace>__<name>``, the name other CLIs give it.
"""

from __future__ import annotations

import json
import re

from agent_runner.jsonfile import JSONObject, JSONValue
from agent_runner.wire import API_BASE_PATH
from orchestrator.model.apis.base import RequestView, WireApi
from orchestrator.model.exchanges import (
    Answer,
    CallSlot,
    ToolResult,
    count,
    json_args,
    listing,
    mapping,
    text_of,
)

RESPONSES_PATH = "/responses"
#: besides ``input``, what a held model compares (not ``prompt_cache_key`` or ``client_metadata``:
#: an agent's session ids, new every run)
SETTINGS = ("model", "instructions", "tools", "tool_choice", "reasoning", "text", "temperature", "top_p",
            "max_output_tokens", "stream", "parallel_tool_calls", "include")
# Codex opens a tool's output with how long it ran ("Wall time: 0.0029 seconds"): a held model
# compares the output without it (it differs on every run of every host)
_WALL_TIME = re.compile(r"Wall time: [0-9.]+ seconds")


def _call(item: JSONObject) -> tuple[str, str, JSONObject] | None:
    """(call id, tool name, arguments) of an output item that is a tool call."""
    if item.get("type") == "function_call":
        name, namespace = str(item.get("name", "")), item.get("namespace")
        if isinstance(namespace, str) and namespace:
            name = f"{namespace}__{name}"
        return str(item.get("call_id", "")), name, json_args(item.get("arguments"))
    if item.get("type") == "custom_tool_call":
        return str(item.get("call_id", "")), str(item.get("name", "")), {"input": str(item.get("input", ""))}
    return None


def _message_text(item: JSONObject) -> str:
    return "".join(str(p.get("text", "")) for p in listing(item.get("content"))
                   if isinstance(p, dict) and p.get("type") == "output_text")


class OpenAIResponses(WireApi):
    family = "openai"
    title = "OpenAI Responses"
    example_path = API_BASE_PATH + RESPONSES_PATH

    def serves(self, path: str) -> bool:
        return path == self.example_path

    def upstream_url(self, base_url: str, path: str, query: str) -> str:
        return base_url + RESPONSES_PATH  # the suite's base_url ends in /v1

    def is_answer(self, answer: JSONValue) -> bool:
        return isinstance(answer, dict) and isinstance(answer.get("output"), list)

    def parse_answer(self, answer: JSONObject) -> Answer:
        out = Answer()
        self._finish(answer, out)
        texts = []
        for item in map(mapping, listing(answer.get("output"))):
            call = _call(item)
            if call is not None:
                out.calls.append(call)
            elif item.get("type") == "message":
                texts.append(_message_text(item))
        out.text = "".join(texts) or None
        return out

    @staticmethod
    def _finish(response: JSONObject, answer: Answer) -> None:
        usage = mapping(response.get("usage"))
        answer.prompt_tokens, answer.completion_tokens = count(usage.get("input_tokens")), count(usage.get("output_tokens"))
        status, model = response.get("status"), response.get("model")
        answer.finish_reason = status if isinstance(status, str) else None
        if isinstance(model, str):
            answer.model = model

    def stream_event(self, event: JSONObject, answer: Answer, calls: dict[int, CallSlot]) -> None:
        kind = event.get("type")
        if kind in ("response.created", "response.in_progress"):
            model = mapping(event.get("response")).get("model")
            answer.model = model if isinstance(model, str) else answer.model
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            self._finish(mapping(event.get("response")), answer)
        elif kind == "response.output_item.done":
            item = mapping(event.get("item"))
            call = _call(item)
            if call is not None:
                index = event.get("output_index")
                calls[index if isinstance(index, int) else len(calls)] = CallSlot(call[0], call[1], call[2])
            elif item.get("type") == "message":
                answer.text = (answer.text or "") + _message_text(item)

    def tool_results(self, body: JSONObject) -> dict[str, ToolResult]:
        out: dict[str, ToolResult] = {}
        for item in listing(body.get("input")):
            if isinstance(item, dict) and item.get("type") in ("function_call_output", "custom_tool_call_output"):
                output = item.get("output")
                out[str(item.get("call_id", ""))] = (output if isinstance(output, str) else text_of(output), None)
        return out

    def comparable(self, body: JSONObject) -> RequestView:
        # an input item's "id" is the agent's own (Codex: a new uuid every run); its content is compared
        items = body.get("input")
        if isinstance(items, list):
            items = [json.loads(_WALL_TIME.sub("Wall time: - seconds", json.dumps(
                {k: v for k, v in item.items() if k != "id"}))) if isinstance(item, dict) else item for item in items]
        return RequestView(items, {k: body.get(k) for k in SETTINGS})
