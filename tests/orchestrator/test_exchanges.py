"""An exec attempt's turns from its model exchanges (orchestrator/model/exchanges.py), whatever order the
proxy's threads book them in.

A streamed answer's tool calls are booked once its stream has ended; the agent has the whole stream by
then and may already have run the tool and sent its next request, on another connection the proxy
handles on another thread. Booked first, that request's results must still reach the turns they answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_runner.jsonfile import JSONObject
from orchestrator.model.apis.base import WireApi
from orchestrator.model.apis.gemini import Gemini
from orchestrator.model.apis.openai_chat import OpenAIChat
from orchestrator.model.exchanges import Answer, ExchangeBook


def _chat(*done: tuple[str, str, str]) -> JSONObject:
    """An OpenAI chat request whose history holds these (call id, tool, result) exchanges."""
    messages: list[Any] = [{"role": "user", "content": "go"}]
    for call_id, tool, result in done:
        messages.append({"role": "assistant", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": tool, "arguments": "{}"}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
    return {"messages": messages}


def _gemini(*done: tuple[str, str, str]) -> JSONObject:
    """A Gemini request whose history holds these exchanges, with no call ids (keyed by tool name)."""
    contents: list[Any] = [{"role": "user", "parts": [{"text": "go"}]}]
    for _, tool, result in done:
        contents.append({"role": "model", "parts": [{"functionCall": {"name": tool, "args": {}}}]})
        contents.append({"role": "user", "parts": [{"functionResponse": {"name": tool, "response": {"output": result}}}]})
    return {"contents": contents}


def _book(api: WireApi, body: Callable[..., JSONObject], calls: list[tuple[str, str, str]],
          racing: bool) -> list[tuple[str | None, str | None]]:
    """Book an attempt of one request per answer: in order, or each answer after the next request."""
    book = ExchangeBook()
    answers = [Answer(calls=[(call_id, tool, {})]) for call_id, tool, _ in calls]
    requests = [body(*calls[:i]) for i in range(len(calls) + 1)]
    book.request("a", api, requests[0])
    for i, answer in enumerate(answers):
        if racing:
            book.request("a", api, requests[i + 1])
            book.answer("a", answer)
        else:
            book.answer("a", answer)
            book.request("a", api, requests[i + 1])
    return [(t["tool"], t["observation"]) for t in book.snapshot("a")["turns"]]


def test_a_tool_result_booked_before_its_calls_answer_still_completes_the_turn() -> None:
    calls = [("c1", "lookup", "the answer is 42\n"), ("c2", "write_file", "wrote 2 bytes")]
    want = [("lookup", "the answer is 42\n"), ("write_file", "wrote 2 bytes")]
    assert _book(OpenAIChat(), _chat, calls, racing=False) == want
    assert _book(OpenAIChat(), _chat, calls, racing=True) == want  # an empty observation before the fix


def test_without_call_ids_a_repeated_tool_gets_each_calls_own_result_in_either_order() -> None:
    """Gemini's calls may carry no id: a result is keyed by the tool's name, and a request resends every
    earlier result. The second call of the same tool still gets its own result, not the first one's."""
    calls = [("lookup", "lookup", "first"), ("lookup", "lookup", "second"), ("write_file", "write_file", "ok")]
    want = [("lookup", "first"), ("lookup", "second"), ("write_file", "ok")]
    assert _book(Gemini(), _gemini, calls, racing=False) == want
    assert _book(Gemini(), _gemini, calls, racing=True) == want
