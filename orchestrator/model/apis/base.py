"""The interface every wire API module implements (``orchestrator/model/apis/``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent_runner.jsonfile import JSONObject, JSONValue

if TYPE_CHECKING:
    from orchestrator.model.exchanges import Answer, CallSlot, ToolResult


@dataclass
class RequestView:
    """What of a request must be equal for a held answer to stand in: its conversation (a held model's
    divergence names the first differing message) and the API's settings."""

    messages: JSONValue
    settings: dict[str, JSONValue] = field(default_factory=dict)

    def to_json(self) -> JSONObject:
        return {"messages": self.messages, **self.settings}


class WireApi:
    """One wire API. Subclasses override what differs; the defaults are OpenAI chat completions'."""

    #: the suite's ``api`` this module serves
    family = ""
    #: this module's own name, for records and messages ("openai chat completions", ...)
    title = ""
    #: the path an agent POSTs (below its attempt's prefix), as a refusal names it
    example_path = ""
    #: the header the key travels in upstream, and its prefix
    key_header = "Authorization"
    key_prefix = "Bearer "

    def serves(self, path: str) -> bool:
        """Whether ``path`` (below an attempt's prefix, no query) is a request of this API."""
        raise NotImplementedError

    def auxiliary(self, path: str) -> bool:
        """Whether ``path`` is not a model answer (Anthropic's ``count_tokens``): forwarded with the
        key and recorded, neither capped, held nor a turn."""
        return False

    def upstream_url(self, base_url: str, path: str, query: str) -> str:
        """The provider's URL for ``path``: the suite's ``base_url`` plus this API's path."""
        raise NotImplementedError

    def upstream_headers(self, key: str, headers: dict[str, str], stream: bool) -> dict[str, str]:
        """The headers sent upstream: the key, and what this API passes through of the agent's."""
        return {"Content-Type": "application/json", "Accept": "text/event-stream" if stream else "application/json",
                self.key_header: self.key_prefix + key}

    def model_of(self, path: str, body: JSONObject) -> JSONValue:
        """The model a request asks for."""
        return body.get("model")

    def streamed(self, path: str, query: str, body: JSONObject) -> bool:
        return body.get("stream") is True

    def prepare(self, body: JSONObject, stream: bool) -> JSONObject | None:
        """The body to send upstream when it differs from the agent's (None: send it as it came)."""
        return None

    def error_body(self, kind: str, message: str, code: str | None = None) -> JSONObject:
        """An error in this API's format, so the agent's SDK raises it as such."""
        return {"error": {"type": kind, "code": code or kind, "message": message}}

    def is_answer(self, answer: JSONValue) -> bool:
        raise NotImplementedError

    def parse_answer(self, answer: JSONObject) -> Answer:
        raise NotImplementedError

    def stream_event(self, event: JSONObject, answer: Answer, calls: dict[int, CallSlot]) -> None:
        """Fold one server-sent event into ``answer``; a tool call's pieces gather in ``calls`` by index."""
        raise NotImplementedError

    def tool_results(self, body: JSONObject) -> dict[str, ToolResult]:
        """call id -> (observation, error) for every tool result a request carries."""
        raise NotImplementedError

    def comparable(self, body: JSONObject) -> RequestView:
        """What of a request must be equal for a held answer to stand in."""
        raise NotImplementedError
