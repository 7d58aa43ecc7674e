"""Anthropic messages: ``POST /v1/messages``, streamed or not, and ``/v1/messages/count_tokens``
(Claude Code, the Anthropic SDK); ``anthropic-version`` and ``anthropic-beta`` are passed upstream."""

from __future__ import annotations

from agent_runner.jsonfile import JSONObject, JSONValue
from agent_runner.wire import API_BASE_PATH, MESSAGES_PATH
from orchestrator.model.apis.base import RequestView, WireApi
from orchestrator.model.apis.openai_chat import SETTINGS
from orchestrator.model.exchanges import (
    Answer,
    CallSlot,
    ToolResult,
    count,
    json_args,
    listing,
    mapping,
    text_of,
    text_piece,
)

COUNT_TOKENS = "/count_tokens"  # below the messages path: what a request would cost, no answer


class AnthropicMessages(WireApi):
    family = "anthropic"
    title = "Anthropic messages"
    example_path = API_BASE_PATH + MESSAGES_PATH
    key_header = "x-api-key"
    key_prefix = ""

    def serves(self, path: str) -> bool:
        return path in (self.example_path, self.example_path + COUNT_TOKENS)

    def auxiliary(self, path: str) -> bool:
        return path.endswith(COUNT_TOKENS)

    def upstream_url(self, base_url: str, path: str, query: str) -> str:
        return base_url + path  # the suite's base_url is the origin

    def upstream_headers(self, key: str, headers: dict[str, str], stream: bool) -> dict[str, str]:
        out = super().upstream_headers(key, headers, stream)
        out["anthropic-version"] = headers.get("anthropic-version") or "2023-06-01"
        if headers.get("anthropic-beta"):
            out["anthropic-beta"] = str(headers.get("anthropic-beta"))
        return out

    def error_body(self, kind: str, message: str, code: str | None = None) -> JSONObject:
        return {"type": "error", "error": {"type": kind, "code": code or kind, "message": message}}

    def is_answer(self, answer: JSONValue) -> bool:
        return isinstance(answer, dict) and isinstance(answer.get("content"), list)

    def parse_answer(self, answer: JSONObject) -> Answer:
        model, stop = answer.get("model"), answer.get("stop_reason")
        out = Answer(model=model if isinstance(model, str) else None)
        usage = mapping(answer.get("usage"))
        out.prompt_tokens, out.completion_tokens = count(usage.get("input_tokens")), count(usage.get("output_tokens"))
        out.finish_reason = stop if isinstance(stop, str) else None
        texts = []
        for block in map(mapping, listing(answer.get("content"))):
            if block.get("type") == "tool_use":
                out.calls.append((str(block.get("id", "")), str(block.get("name", "")), json_args(block.get("input"))))
            elif block.get("type") == "text":
                texts.append(str(block.get("text", "")))
        out.text = "".join(texts) or None
        return out

    def stream_event(self, event: JSONObject, answer: Answer, calls: dict[int, CallSlot]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            message = mapping(event.get("message"))
            model = message.get("model")
            answer.model = model if isinstance(model, str) else None
            usage = mapping(message.get("usage"))
            answer.prompt_tokens = count(usage.get("input_tokens"))
            answer.completion_tokens = count(usage.get("output_tokens"))
        elif kind == "content_block_start":
            block = mapping(event.get("content_block"))
            if block.get("type") == "tool_use":
                calls[count(event.get("index"))] = CallSlot(str(block.get("id", "")), str(block.get("name", "")))
        elif kind == "content_block_delta":
            delta = mapping(event.get("delta"))
            slot = calls.get(count(event.get("index")))
            text = delta.get("text")
            if slot is not None and delta.get("type") == "input_json_delta":
                slot.arguments = text_piece(slot.arguments) + text_piece(delta.get("partial_json"))
            elif delta.get("type") == "text_delta" and isinstance(text, str):
                answer.text = (answer.text or "") + text
        elif kind == "message_delta":
            delta = mapping(event.get("delta"))
            stop = delta.get("stop_reason")
            if isinstance(stop, str):
                answer.finish_reason = stop
            usage = mapping(event.get("usage"))
            if "output_tokens" in usage:
                answer.completion_tokens = count(usage.get("output_tokens"))

    def tool_results(self, body: JSONObject) -> dict[str, ToolResult]:
        out: dict[str, ToolResult] = {}
        for message in listing(body.get("messages")):
            for block in listing(mapping(message).get("content")):
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    text = text_of(block.get("content"))
                    out[str(block.get("tool_use_id", ""))] = (text, text if block.get("is_error") else None)
        return out

    def comparable(self, body: JSONObject) -> RequestView:
        # "system": Anthropic's system prompt is not a message; SETTINGS has it
        return RequestView(body.get("messages"), {k: body.get(k) for k in SETTINGS})
