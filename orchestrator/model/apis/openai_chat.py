"""OpenAI chat completions: ``POST /v1/chat/completions``, streamed or not (also the built-in agent's)."""

from __future__ import annotations

from typing import Any

from agent_runner.wire import API_BASE_PATH, CHAT_PATH
from orchestrator.model.apis.base import WireApi
from orchestrator.model.exchanges import Answer, count, json_args, listing, mapping, text_of

#: a held model compares these besides the conversation
SETTINGS = ("model", "temperature", "seed", "max_tokens", "tools", "system", "stream")


class OpenAIChat(WireApi):
    family = "openai"
    title = "OpenAI chat completions"
    example_path = API_BASE_PATH + CHAT_PATH

    def serves(self, path: str) -> bool:
        return path == self.example_path

    def upstream_url(self, base_url: str, path: str, query: str) -> str:
        return base_url + CHAT_PATH  # the suite's base_url ends in /v1

    def prepare(self, body: dict[str, Any], stream: bool) -> dict[str, Any] | None:
        if not stream:
            return None
        # a streamed answer has its tokens only when asked for them
        given = body.get("stream_options")
        if given is not None and not isinstance(given, dict):
            raise ValueError("stream_options must be a JSON object")
        return {**body, "stream_options": {**(given or {}), "include_usage": True}}

    def is_answer(self, answer: Any) -> bool:
        return isinstance(answer, dict) and isinstance(answer.get("choices"), list) and bool(answer["choices"])

    def parse_answer(self, answer: dict[str, Any]) -> Answer:
        out = Answer(model=answer.get("model") if isinstance(answer.get("model"), str) else None)
        usage = mapping(answer.get("usage"))
        out.prompt_tokens, out.completion_tokens = count(usage.get("prompt_tokens")), count(usage.get("completion_tokens"))
        choices = answer.get("choices") or [{}]
        first = mapping(choices[0])
        message = mapping(first.get("message"))
        out.finish_reason = first["finish_reason"] if isinstance(first.get("finish_reason"), str) else None
        out.text = text_of(message.get("content")) or None
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            out.calls.append((str(call.get("id", "")), str(function.get("name", "")), json_args(function.get("arguments"))))
        return out

    def stream_event(self, event: dict[str, Any], answer: Answer, calls: dict[int, dict[str, Any]]) -> None:
        if isinstance(event.get("model"), str):
            answer.model = event["model"]
        usage = event.get("usage")
        if isinstance(usage, dict):
            answer.prompt_tokens = count(usage.get("prompt_tokens"))
            answer.completion_tokens = count(usage.get("completion_tokens"))
        for choice in event.get("choices") or []:
            if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                answer.finish_reason = choice["finish_reason"]
            delta = mapping(mapping(choice).get("delta"))
            if isinstance(delta.get("content"), str):
                answer.text = (answer.text or "") + delta["content"]
            for call in listing(delta.get("tool_calls")):
                slot = calls.setdefault(int(call.get("index", 0)), {"id": "", "name": "", "arguments": ""})
                function = call.get("function") or {}
                slot["id"] = call.get("id") or slot["id"]
                slot["name"] += function.get("name") or ""
                slot["arguments"] += function.get("arguments") or ""

    def tool_results(self, body: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
        out: dict[str, tuple[str, str | None]] = {}
        for message in listing(body.get("messages")):
            if isinstance(message, dict) and message.get("role") == "tool":
                out[str(message.get("tool_call_id", ""))] = (text_of(message.get("content")), None)
        return out

    def comparable(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"messages": body.get("messages"), **{k: body.get(k) for k in SETTINGS}}
