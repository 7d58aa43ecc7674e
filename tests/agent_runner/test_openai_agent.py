"""The openai agent's protocol client, against the real proxy and a real provider on loopback."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_runner.openai_agent import (
    ChatClient,
    Conversation,
    ModelError,
    OpenAISettings,
    contract_tools,
    parse_completion,
)
from orchestrator.proxy import ModelProxy
from tests.fake_provider import FakeProvider, unused_port

KEY = "sk-agent-test-key-0123456789"
ENV = {"K": KEY}
SETTINGS = OpenAISettings(model="m1", temperature=0.0, seed=7, max_tokens=256)
CONTRACT: list[dict[str, Any]] = [
    {"name": "add_label", "required_args": ["repo", "issue_id", "label"]},
    {"name": "shell"},
    {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
]


def proxy(provider_url: str, **kw: Any) -> ModelProxy:
    return ModelProxy(
        provider_url, "K", environ=ENV, model="m1", retry_wait_s=0.01, retry_max_wait_s=0.02, **kw
    )


def test_contract_tools_use_parameters_builtins_or_required_args() -> None:
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in contract_tools(CONTRACT)}
    assert tools["add_label"]["required"] == ["repo", "issue_id", "label"]
    assert set(tools["add_label"]["properties"]) == {"repo", "issue_id", "label"}
    assert tools["shell"]["properties"]["argv"]["type"] == "array"
    assert tools["lookup"] == CONTRACT[2]["parameters"]


def test_conversation_follows_the_script_through_the_proxy() -> None:
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "add_label", "args": {"repo": "r", "issue_id": 3, "label": "bug"}}]},
        {"content": "labelled", "finish": "stop"},
    ]
    with FakeProvider(script=script, key=KEY) as provider, proxy(provider.base_url) as p:
        conv = Conversation.start(ChatClient(p.url, SETTINGS), "label issue 3", CONTRACT)
        first = conv.next_turn()
        assert [(c.name, c.args) for c in first.tool_calls] == [
            ("add_label", {"repo": "r", "issue_id": 3, "label": "bug"})
        ]
        assert first.prompt_tokens == 11 and first.completion_tokens == 7
        assert first.model_record()["system_fingerprint"] == "fp_fake_0001"
        conv.observe(first.tool_calls[0], "ok=true issue_id=3")
        second = conv.next_turn()
    assert second.finish_reason == "stop" and second.content == "labelled" and not second.tool_calls
    sent = provider.requests[1].body
    # The sampling pins and the contract's tools reach the provider; the tool result is threaded back.
    assert (sent["model"], sent["temperature"], sent["seed"], sent["max_tokens"]) == ("m1", 0.0, 7, 256)
    assert [t["function"]["name"] for t in sent["tools"]] == ["add_label", "shell", "lookup"]
    assert sent["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_0_0",
        "content": "ok=true issue_id=3",
    }
    assert all("authorization" not in json.dumps(m).lower() for m in sent["messages"])


def test_cap_becomes_budget_model_not_an_error_verdict() -> None:
    with FakeProvider(mode="forever", key=KEY) as provider, proxy(provider.base_url, max_requests=1) as p:
        conv = Conversation.start(ChatClient(p.url, SETTINGS), "go", CONTRACT)
        conv.observe(conv.next_turn().tool_calls[0], "x")
        with pytest.raises(ModelError) as got:
            conv.next_turn()
    assert got.value.reason == "budget_model" and not got.value.verdict_error
    assert "max_requests = 1" in str(got.value)


@pytest.mark.parametrize("case", ["unreachable_provider", "bad_json", "proxy_gone"])
def test_provider_failures_become_agent_error_with_error_verdict(case: str) -> None:
    if case == "proxy_gone":
        client = ChatClient(f"http://127.0.0.1:{unused_port()}/v1", SETTINGS)
        with pytest.raises(ModelError) as got:
            client.complete([{"role": "user", "content": "x"}], [])
        assert "unreachable" in str(got.value)
    else:
        with FakeProvider(mode="bad_json", key=KEY) as provider:
            url = provider.base_url if case == "bad_json" else f"http://127.0.0.1:{unused_port()}/v1"
            with proxy(url, retry_attempts=2) as p, pytest.raises(ModelError) as got:
                ChatClient(p.url, SETTINGS).complete([{"role": "user", "content": "x"}], [])
        assert got.value.call is not None and got.value.call["status"] == 502
    assert got.value.reason == "agent_error" and got.value.verdict_error
    assert "\n" not in str(got.value)


def test_bad_tool_arguments_are_flagged_not_crashed() -> None:
    raw = json.dumps(
        {
            "choices": [
                {
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "a",
                                "type": "function",
                                "function": {"name": "shell", "arguments": "{oops"},
                            }
                        ],
                    },
                }
            ]
        }
    )
    turn = parse_completion(raw.encode())
    assert turn.tool_calls[0].args == {} and "not valid JSON" in (turn.tool_calls[0].args_error or "")
    with pytest.raises(ModelError):
        parse_completion(b'{"choices": []}')
