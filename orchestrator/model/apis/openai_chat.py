"""OpenAI chat completions: ``POST /v1/chat/completions``, streamed or not (also the built-in agent's)."""

from __future__ import annotations

from agent_runner.jsonfile import JSONObject, JSONValue
from agent_runner.wire import API_BASE_PATH, CHAT_PATH
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
    text_piece,
)

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

    def prepare(self, body: JSONObject, stream: bool) -> JSONObject | None:
        if not stream:
            return None
        # a streamed answer has its tokens only when asked for them
        given = body.get("stream_options")
        if given is not None and not isinstance(given, dict):
            raise ValueError("stream_options must be a JSON object")
        return {**body, "stream_options": {**mapping(given), "include_usage": True}}

    def is_answer(self, answer: JSONValue) -> bool:
        return isinstance(answer, dict) and isinstance(answer.get("choices"), list) and bool(answer["choices"])

    def parse_answer(self, answer: JSONObject) -> Answer:
        model = answer.get("model")
        out = Answer(model=model if isinstance(model, str) else None)
        usage = mapping(answer.get("usage"))
        out.prompt_tokens, out.completion_tokens = count(usage.get("prompt_tokens")), count(usage.get("completion_tokens"))
        choices = listing(answer.get("choices"))
        first = mapping(choices[0] if choices else None)
        message = mapping(first.get("message"))
        finish = first.get("finish_reason")
        out.finish_reason = finish if isinstance(finish, str) else None
        out.text = text_of(message.get("content")) or None
        for call in listing(message.get("tool_calls")):
            function = mapping(mapping(call).get("function"))
            out.calls.append((str(mapping(call).get("id", "")), str(function.get("name", "")),
                              json_args(function.get("arguments"))))
        return out

    def stream_event(self, event: JSONObject, answer: Answer, calls: dict[int, CallSlot]) -> None:
        model = event.get("model")
        if isinstance(model, str):
            answer.model = model
        usage = event.get("usage")
        if isinstance(usage, dict):
            answer.prompt_tokens = count(usage.get("prompt_tokens"))
            answer.completion_tokens = count(usage.get("completion_tokens"))
        for choice in listing(event.get("choices")):
            finish = mapping(choice).get("finish_reason")
            if isinstance(finish, str):
                answer.finish_reason = finish
            delta = mapping(mapping(choice).get("delta"))
            content = delta.get("content")
            if isinstance(content, str):
                answer.text = (answer.text or "") + content
            for call in map(mapping, listing(delta.get("tool_calls"))):
                slot = calls.setdefault(count(call.get("index")), CallSlot())
                function = mapping(call.get("function"))
                slot.id = str(call.get("id") or slot.id)
                slot.name += text_piece(function.get("name"))
                slot.arguments = text_piece(slot.arguments) + text_piece(function.get("arguments"))

    def tool_results(self, body: JSONObject) -> dict[str, ToolResult]:
        out: dict[str, ToolResult] = {}
        for message in listing(body.get("messages")):
            if isinstance(message, dict) and message.get("role") == "tool":
                out[str(message.get("tool_call_id", ""))] = (text_of(message.get("content")), None)
        return out

    def comparable(self, body: JSONObject) -> RequestView:
        return RequestView(body.get("messages"), {k: body.get(k) for k in SETTINGS})
