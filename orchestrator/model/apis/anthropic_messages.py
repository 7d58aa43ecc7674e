"""Anthropic messages: ``POST /v1/messages``, streamed or not, and ``/v1/messages/count_tokens``
(Claude Code, the Anthropic SDK); ``anthropic-version`` and ``anthropic-beta`` are passed upstream."""

from __future__ import annotations

from typing import Any

from agent_runner.wire import API_BASE_PATH, MESSAGES_PATH
from orchestrator.model.apis.base import WireApi
from orchestrator.model.apis.openai_chat import SETTINGS
from orchestrator.model.exchanges import Answer, count, json_args, listing, mapping, text_of

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

    def error_body(self, kind: str, message: str, code: str | None = None) -> dict[str, Any]:
        return {"type": "error", "error": {"type": kind, "code": code or kind, "message": message}}

    def is_answer(self, answer: Any) -> bool:
        return isinstance(answer, dict) and isinstance(answer.get("content"), list)

    def parse_answer(self, answer: dict[str, Any]) -> Answer:
        out = Answer(model=answer.get("model") if isinstance(answer.get("model"), str) else None)
        usage = mapping(answer.get("usage"))
        out.prompt_tokens, out.completion_tokens = count(usage.get("input_tokens")), count(usage.get("output_tokens"))
        out.finish_reason = answer["stop_reason"] if isinstance(answer.get("stop_reason"), str) else None
        texts = []
        for block in answer.get("content") or []:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                out.calls.append((str(block.get("id", "")), str(block.get("name", "")), json_args(block.get("input"))))
            elif isinstance(block, dict) and block.get("type") == "text":
                texts.append(str(block.get("text", "")))
        out.text = "".join(texts) or None
        return out

    def stream_event(self, event: dict[str, Any], answer: Answer, calls: dict[int, dict[str, Any]]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            answer.model = message.get("model") if isinstance(message.get("model"), str) else None
            usage = message.get("usage") or {}
            answer.prompt_tokens = count(usage.get("input_tokens"))
            answer.completion_tokens = count(usage.get("output_tokens"))
        elif kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") == "tool_use":
                calls[int(event.get("index", 0))] = {"id": block.get("id", ""), "name": block.get("name", ""),
                                                     "arguments": ""}
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            slot = calls.get(int(event.get("index", 0)))
            if slot is not None and delta.get("type") == "input_json_delta":
                slot["arguments"] += delta.get("partial_json") or ""
            elif delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                answer.text = (answer.text or "") + delta["text"]
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            if isinstance(delta.get("stop_reason"), str):
                answer.finish_reason = delta["stop_reason"]
            usage = event.get("usage") or {}
            if "output_tokens" in usage:
                answer.completion_tokens = count(usage.get("output_tokens"))

    def tool_results(self, body: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
        out: dict[str, tuple[str, str | None]] = {}
        for message in listing(body.get("messages")):
            if not isinstance(message, dict) or not isinstance(message.get("content"), list):
                continue
            for block in message["content"]:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    text = text_of(block.get("content"))
                    out[str(block.get("tool_use_id", ""))] = (text, text if block.get("is_error") else None)
        return out

    def comparable(self, body: dict[str, Any]) -> dict[str, Any]:
        # "system": Anthropic's system prompt is not a message; SETTINGS has it
        return {"messages": body.get("messages"), **{k: body.get(k) for k in SETTINGS}}
