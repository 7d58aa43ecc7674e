"""Gemini: ``POST /v1beta/models/<model>:generateContent`` and ``:streamGenerateContent?alt=sse``
(Gemini CLI, the Google GenAI SDKs). The key travels in ``x-goog-api-key`` (or ``?key=``), the model in
the path.

The conversation is ``contents``: the model's ``functionCall`` parts and the agent's
``functionResponse`` parts. A provider may give a call no ``id``; the agent then makes one up (Gemini
CLI: ``<name>_<time>_<n>``), so a call without one is matched to its response by name, in order, and
a held model compares calls and responses without their ids.
"""

from __future__ import annotations

import json
import re
import urllib.parse

from agent_runner.jsonfile import JSONObject, JSONValue
from orchestrator.model.apis.base import RequestView, WireApi
from orchestrator.model.exchanges import Answer, CallSlot, ToolResult, count, json_args, listing, mapping

_PATH = re.compile(r"^/v1beta/models/([^/:]+):(generateContent|streamGenerateContent)$")
SETTINGS = ("systemInstruction", "tools", "toolConfig", "generationConfig")


def _without_ids(contents: JSONValue) -> JSONValue:
    if not isinstance(contents, list):
        return contents
    out: list[JSONValue] = []
    for content in contents:
        if not isinstance(content, dict):
            out.append(content)
            continue
        parts: list[JSONValue] = []
        for part in listing(content.get("parts")):
            if isinstance(part, dict):
                part = {k: ({kk: vv for kk, vv in v.items() if kk != "id"}
                            if k in ("functionCall", "functionResponse") and isinstance(v, dict) else v)
                        for k, v in part.items()}
            parts.append(part)
        out.append({**content, "parts": parts})
    return out


class Gemini(WireApi):
    family = "gemini"
    title = "Gemini generateContent"
    example_path = "/v1beta/models/<model>:streamGenerateContent"
    key_header = "x-goog-api-key"
    key_prefix = ""

    def serves(self, path: str) -> bool:
        return _PATH.match(path) is not None

    def upstream_url(self, base_url: str, path: str, query: str) -> str:
        # the agent's query minus any key (the placeholder never goes upstream); the suite's base_url
        # is the origin (https://generativelanguage.googleapis.com)
        kept = [(k, v) for k, v in urllib.parse.parse_qsl(query) if k != "key"]
        return base_url + path + ("?" + urllib.parse.urlencode(kept) if kept else "")

    def model_of(self, path: str, body: JSONObject) -> JSONValue:
        found = _PATH.match(path)
        return urllib.parse.unquote(found.group(1)) if found else None

    def streamed(self, path: str, query: str, body: JSONObject) -> bool:
        return path.endswith(":streamGenerateContent")

    def error_body(self, kind: str, message: str, code: str | None = None) -> JSONObject:
        return {"error": {"status": kind, "message": message, "details": [{"reason": code or kind}]}}

    def is_answer(self, answer: JSONValue) -> bool:
        return isinstance(answer, dict) and isinstance(answer.get("candidates"), list)

    def parse_answer(self, answer: JSONObject) -> Answer:
        out = Answer()
        calls: dict[int, CallSlot] = {}
        self.stream_event(answer, out, calls)
        out.calls = [(slot.id, slot.name, json_args(slot.arguments)) for _, slot in sorted(calls.items())]
        return out

    def stream_event(self, event: JSONObject, answer: Answer, calls: dict[int, CallSlot]) -> None:
        # a streamed chunk is a whole answer of its own: the parts it adds, and the last one's usage
        model = event.get("modelVersion")
        if isinstance(model, str):
            answer.model = model
        usage = mapping(event.get("usageMetadata"))
        if usage:
            answer.prompt_tokens = count(usage.get("promptTokenCount"))
            answer.completion_tokens = count(usage.get("candidatesTokenCount"))
        candidates = listing(event.get("candidates"))
        candidate = mapping(candidates[0] if candidates else None)
        finish = candidate.get("finishReason")
        if isinstance(finish, str):
            answer.finish_reason = finish
        for part in map(mapping, listing(mapping(candidate.get("content")).get("parts"))):
            call = mapping(part.get("functionCall"))
            text = part.get("text")
            if call:
                name = str(call.get("name", ""))
                calls[len(calls)] = CallSlot(str(call.get("id") or name), name, mapping(call.get("args")))
            elif isinstance(text, str) and not part.get("thought"):
                answer.text = (answer.text or "") + text

    def tool_results(self, body: JSONObject) -> dict[str, ToolResult]:
        out: dict[str, ToolResult] = {}
        for content in listing(body.get("contents")):
            for part in listing(mapping(content).get("parts")):
                response = mapping(mapping(part).get("functionResponse"))
                if not response:
                    continue
                result = mapping(response.get("response"))
                error = result.get("error")
                text = str(result["output"]) if isinstance(result.get("output"), str) else json.dumps(result)
                value: ToolResult = (text, None) if error is None else (str(error), str(error))
                out[str(response.get("name", ""))] = value  # a call the provider gave no id
                if response.get("id"):
                    out[str(response["id"])] = value
        return out

    def comparable(self, body: JSONObject) -> RequestView:
        return RequestView(_without_ids(body.get("contents")), {k: body.get(k) for k in SETTINGS})
