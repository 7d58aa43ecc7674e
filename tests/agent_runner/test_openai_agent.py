"""The openai agent's protocol client, against the real proxy and a real provider on loopback."""

from __future__ import annotations

import json
from pathlib import Path
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
from agent_runner.wire import MODEL_PASS_ENV, MODEL_URL_ENV
from orchestrator.model.proxy import ModelProxy
from tests.support.fake_provider import FakeProvider, unused_port
from tests.support.runner import clean_env, records, run_runner, write_suite

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
        conv = Conversation.start(ChatClient(p.url, SETTINGS, "t.0", p.attempt_token("t.0")), "label the third issue", CONTRACT)
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
        conv = Conversation.start(ChatClient(p.url, SETTINGS, "t.0", p.attempt_token("t.0")), "go", CONTRACT)
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
                ChatClient(p.url, SETTINGS, "t.0", p.attempt_token("t.0")).complete([{"role": "user", "content": "x"}], [])
        assert got.value.call is not None and got.value.call.status == 502
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


# --- the real runner CLI, an openai suite, the proxy and the provider on loopback ----------------------

OPENAI_SUITE = """name = "live"
[agent]
kind = "openai"
model = "m1"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "CROSSHOST_TEST_MODEL_KEY"
temperature = 0
seed = 7
max_tokens = 256
[budget]
max_steps = 6
timeout_s = 30
"""
ANSWER_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "lookup", "args": {"q": "answer"}}]},
    {"tool_calls": [{"name": "write_file", "args": {"path": "answer.txt", "content": "42"}}]},
    {"content": "wrote it", "finish": "stop"},
]


def openai_suite(root: Path) -> Path:
    return write_suite(
        root,
        {
            "t1": {
                "toml": '[fixtures]\nlookup = "the answer is 42"\n',
                "prompt": "find the answer, write it",
                "repo": {"run_tests.sh": 'test "$(cat answer.txt)" = 42\n'},
            }
        },
        suite_toml=OPENAI_SUITE,
    )


def run_openai(
    tmp_path: Path, to: ModelProxy | None, *extra: str
) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]:
    """The runner as a replay starts it: the proxy's URL and the secret each attempt's placeholder comes from."""
    suite, out = openai_suite(tmp_path / "suite"), tmp_path / "out"
    env = clean_env(**({MODEL_URL_ENV: to.url, MODEL_PASS_ENV: to.secret} if to is not None else {}))
    done = run_runner(
        "run",
        "--suite",
        str(suite),
        "--out",
        str(out),
        "--host",
        "local",
        "--workspace-root",
        str(tmp_path / "ws"),
        *extra,
        env=env,
    )
    rows = records(out / "results.jsonl") if (out / "results.jsonl").exists() else []
    trace = records(out / "traces" / "t1.0.jsonl") if (out / "traces" / "t1.0.jsonl").exists() else []
    everything = "".join(p.read_text() for p in out.rglob("*") if p.is_file())
    assert KEY not in everything + done.stdout + done.stderr
    return done, rows, trace


def test_runner_passes_an_openai_task_three_times_by_default(tmp_path: Path) -> None:
    with FakeProvider(script=ANSWER_SCRIPT, key=KEY) as provider, proxy(provider.base_url) as p:
        done, rows, trace = run_openai(tmp_path, p)
    assert done.returncode == 0, done.stderr
    assert [(r["attempt"], r["verdict"], r["reason"]) for r in rows] == [
        (a, "pass", "stop") for a in range(3)
    ]
    turns = [r for r in trace if r["type"] == "turn"]
    assert [t["tool"] for t in turns] == ["lookup", "write_file"]
    assert turns[0]["prompt_tokens"] == 11 and turns[0]["completion_tokens"] == 7
    assert turns[0]["model"]["system_fingerprint"] == "fp_fake_0001" and turns[0]["model"]["status"] == 200
    finish = trace[-1]
    assert finish["model"]["requests"] == 3 and finish["model"]["completion_tokens"] == 21
    assert finish["model"]["settings"] == {"model": "m1", "temperature": 0, "seed": 7, "max_tokens": 256}
    assert len(provider.requests) == 9 == len(p.calls)  # 3 requests x 3 attempts, all through the proxy


def test_a_model_that_never_stops_is_stopped_by_the_proxy_cap(tmp_path: Path) -> None:
    with (
        FakeProvider(mode="forever", forever_tool="lookup", key=KEY) as provider,
        proxy(provider.base_url, max_requests=3) as p,
    ):
        done, rows, trace = run_openai(tmp_path, p, "--repeat", "1")
    assert done.returncode == 0, done.stderr
    assert (rows[0]["reason"], rows[0]["verdict"]) == ("budget_model", "fail")
    assert len([r for r in trace if r["type"] == "turn"]) == 3  # below max_steps = 6: the cap stopped it
    assert "max_requests = 3" in trace[-1]["final"]
    assert len(provider.requests) == 3


def test_429_twice_is_retried_and_the_trace_shows_both_retries(tmp_path: Path) -> None:
    with (
        FakeProvider(script=ANSWER_SCRIPT, key=KEY, fail_first=[429, 429]) as provider,
        proxy(provider.base_url) as p,
    ):
        done, rows, trace = run_openai(tmp_path, p, "--repeat", "1")
    assert done.returncode == 0, done.stderr
    assert rows[0]["verdict"] == "pass"
    first = [r for r in trace if r["type"] == "turn"][0]["model"]
    assert first["retries"] == 2 and [a["status"] for a in first["attempts"]] == [429, 429, 200]
    assert trace[-1]["model"]["retries"] == 2
    assert len(provider.requests) == 5


@pytest.mark.parametrize("case", ["unreachable", "bad_json", "no_model_url"])
def test_provider_failures_are_error_verdicts_never_fail(tmp_path: Path, case: str) -> None:
    with FakeProvider(mode="bad_json", key=KEY) as provider:
        base = provider.base_url if case == "bad_json" else f"http://127.0.0.1:{unused_port()}/v1"
        with proxy(base, retry_attempts=2) as p:
            done, rows, trace = run_openai(
                tmp_path, None if case == "no_model_url" else p, "--repeat", "1"
            )
    assert done.returncode == 0, done.stderr
    assert (rows[0]["verdict"], rows[0]["reason"]) == ("error", "agent_error")
    expected = {"unreachable": "unreachable", "bad_json": "not JSON", "no_model_url": "CROSSHOST_MODEL_URL"}[
        case
    ]
    assert expected in rows[0]["why"] and "\n" not in rows[0]["why"]
