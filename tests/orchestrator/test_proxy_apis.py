"""The model proxy's wire APIs beyond chat completions and messages: OpenAI Responses (driven by the
official SDK, streamed and not, with function, namespaced and custom tool calls and reasoning items),
Gemini generateContent / streamGenerateContent, Anthropic's count_tokens, the provider's own errors
passed back, and a request of an API the suite did not declare: the harness's error, recorded."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from agent_runner.wire import EXEC_PREFIX
from orchestrator.model.proxy import ModelProxy
from tests.support.fake_provider import FakeProvider

KEY = "sk-unit-" + "r" * 24
PATCH = "*** Begin Patch\n*** Add File: answer.txt\n+42\n*** End Patch\n"
SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "lookup", "namespace": "mcp__crosshost", "args": {"q": "answer"}}]},
    {"tool_calls": [{"name": "apply_patch", "custom": True, "args": {"input": PATCH}}]},
    {"content": "wrote it", "finish": "stop"},
]


def _proxy(api: str, base_url: str, **kw: Any) -> ModelProxy:
    return ModelProxy(base_url, "K", api=api, environ={"K": KEY}, retry_wait_s=0, **kw)


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


@pytest.mark.parametrize("stream", [False, True])
def test_responses_through_the_proxy_turns_from_function_namespaced_and_custom_calls(stream: bool) -> None:
    with FakeProvider(script=SCRIPT, key=KEY) as provider, _proxy("openai", provider.base_url) as proxy:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{proxy.port}{EXEC_PREFIX}t.0/v1", api_key=proxy.attempt_token("t.0"))
        items: list[Any] = [{"role": "user", "content": "go"}]
        outputs = ["the answer is 42", "patched"]
        for turn in range(3):
            if stream:
                with client.responses.stream(model="m", input=items) as events:
                    kinds = [e.type for e in events]
                    answer = events.get_final_response()
                assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
            else:
                answer = client.responses.create(model="m", input=items)
            produced = [item.model_dump(exclude_none=True) for item in answer.output]
            items += produced  # the reasoning item goes back as it came, like Codex's
            for item in produced:
                if item["type"] in ("function_call", "custom_tool_call"):
                    kind = "function_call_output" if item["type"] == "function_call" else "custom_tool_call_output"
                    items.append({"type": kind, "call_id": item["call_id"], "output": outputs[turn]})
        assert answer.output_text == "wrote it"
        snapshot = proxy.book.snapshot("t.0")
    assert {r.path for r in provider.requests} == {"/v1/responses"}
    assert {r.headers["authorization"] for r in provider.requests} == {f"Bearer {KEY}"}
    assert {r.body.get("stream", False) for r in provider.requests} == {stream}
    reasoning = [i for i in provider.requests[1].body["input"] if i.get("type") == "reasoning"]
    assert [r["encrypted_content"] for r in reasoning] == ["opaque-0"]
    assert [(t["tool"], t["args"], t["observation"]) for t in snapshot["turns"]] == [
        ("mcp__crosshost__lookup", {"q": "answer"}, "the answer is 42"),
        ("apply_patch", {"input": PATCH}, "patched"),
    ]
    assert snapshot["requests"] == 3 and snapshot["error"] is None and snapshot["text"] == "wrote it"
    assert [c["finish_reason"] for c in snapshot["calls"]] == ["completed"] * 3
    assert snapshot["prompt_tokens"] == 33


@pytest.mark.parametrize("stream", [False, True])
def test_gemini_through_the_proxy_with_the_key_swapped_and_the_model_from_the_path(stream: bool) -> None:
    script = [{"tool_calls": [{"name": "lookup", "args": {"q": "answer"}}]}, {"content": "42", "finish": "stop"}]
    with FakeProvider(script=script, key=KEY) as provider, _proxy("gemini", provider.base_url.removesuffix("/v1"), model="gem-1") as proxy:
        verb = "streamGenerateContent?alt=sse" if stream else "generateContent"
        url = f"http://127.0.0.1:{proxy.port}{EXEC_PREFIX}t.0/v1beta/models/gem-1:{verb}"
        contents: list[Any] = [{"role": "user", "parts": [{"text": "go"}]}]
        # Gemini CLI sends its key as x-goog-api-key; the REST examples as ?key=
        status, first = _post(url + ("" if stream else f"?key={proxy.attempt_token('t.0')}"), {"contents": contents},
                              {"x-goog-api-key": proxy.attempt_token("t.0")} if stream else {})
        assert status == 200
        if stream:
            chunks = [json.loads(line[5:]) for line in first.decode().splitlines() if line.startswith("data:")]
            part = chunks[0]["candidates"][0]["content"]["parts"][0]
        else:
            part = json.loads(first)["candidates"][0]["content"]["parts"][0]
        # the agent makes up an id for a call the provider gave none (Gemini CLI: <name>_<time>_<n>)
        call = {**part["functionCall"], "id": "lookup_1796133012677_0"}
        contents += [{"role": "model", "parts": [{"functionCall": call}]},
                     {"role": "user", "parts": [{"functionResponse": {
                         "id": call["id"], "name": "lookup", "response": {"output": "the answer is 42"}}}]}]
        status, _ = _post(url, {"contents": contents}, {"x-goog-api-key": proxy.attempt_token("t.0")})
        assert status == 200
        status, refused = _post(url.replace("gem-1", "gem-2"), {"contents": contents}, {"x-goog-api-key": proxy.attempt_token("t.0")})
        snapshot = proxy.book.snapshot("t.0")
    assert status == 403 and "gem-2" in refused.decode()
    assert [r.headers["x-goog-api-key"] for r in provider.requests] == [KEY, KEY]  # the refused one never left
    assert all("key=" not in r.query for r in provider.requests)  # the placeholder never goes upstream
    assert [r.query for r in provider.requests] == (["alt=sse"] * 2 if stream else ["", ""])
    assert [(t["tool"], t["args"], t["observation"]) for t in snapshot["turns"]] == [
        ("lookup", {"q": "answer"}, "the answer is 42")]
    assert snapshot["text"] == "42" and snapshot["prompt_tokens"] == 22
    assert "gem-2" in snapshot["error"]  # a request the proxy refused is the harness's failure


def test_an_api_the_suite_did_not_declare_is_a_recorded_error_naming_the_api_and_the_fix(tmp_path: Path) -> None:
    with FakeProvider(script=SCRIPT, key=KEY) as provider, _proxy("anthropic", provider.base_url.removesuffix("/v1")) as proxy:
        status, body = _post(f"http://127.0.0.1:{proxy.port}{EXEC_PREFIX}t.0/v1/responses",
                             {"model": "m", "input": "go"}, {"Authorization": f"Bearer {proxy.attempt_token('t.0')}"})
        snapshot = proxy.book.snapshot("t.0")
        proxy.write_jsonl(tmp_path / "model_calls.jsonl")
    assert status == 404 and provider.requests == []
    message = json.loads(body)["error"]["message"]
    assert "/v1/responses (OpenAI Responses)" in message and "api is 'anthropic'" in message
    assert "set api = 'openai'" in message
    [call] = [json.loads(line) for line in (tmp_path / "model_calls.jsonl").read_text().splitlines()]
    assert (call["path"], call["status"], call["error"], call["message"]) == (
        "/v1/responses", 404, "crosshost_refused", message)
    assert snapshot["error"] == message and snapshot["calls"][0]["error"] == "crosshost_refused"


def test_count_tokens_and_beta_headers_pass_through_and_a_provider_error_comes_back_as_it_said_it() -> None:
    with FakeProvider(script=SCRIPT, key=KEY, fail_first=[]) as provider, _proxy("anthropic", provider.base_url.removesuffix("/v1"), max_requests=1) as proxy:
        base = f"http://127.0.0.1:{proxy.port}{EXEC_PREFIX}t.0/v1/messages"
        headers = {"x-api-key": proxy.attempt_token("t.0"), "anthropic-version": "2023-06-01", "anthropic-beta": "tools-x"}
        body = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "go"}]}
        status, counted = _post(base + "/count_tokens", body, headers)
        assert (status, json.loads(counted)) == (200, {"input_tokens": 11})
        provider.fail_first.append(400)
        status, failed = _post(base, body, headers)
        snapshot = proxy.book.snapshot("t.0")
        used = proxy.requests_used
    assert [(r.path, r.headers["x-api-key"], r.headers["anthropic-beta"]) for r in provider.requests] == [
        ("/v1/messages/count_tokens", KEY, "tools-x"), ("/v1/messages", KEY, "tools-x")]
    assert used == 1 and snapshot["turns"] == []  # counting is no model answer: not capped, no turn
    assert status == 400 and json.loads(failed) == {"error": {"message": "scripted 400", "type": "x"}}
    assert "HTTP 400" in snapshot["error"]


def test_a_websocket_attempt_is_a_404_an_agent_falls_back_from_and_no_error_of_the_attempt() -> None:
    with FakeProvider(script=SCRIPT, key=KEY) as provider, _proxy("openai", provider.base_url) as proxy:
        request = urllib.request.Request(f"http://127.0.0.1:{proxy.port}{EXEC_PREFIX}t.0/v1/responses", headers={
            "Upgrade": "websocket", "Connection": "Upgrade", "Authorization": f"Bearer {proxy.attempt_token('t.0')}"})
        with pytest.raises(urllib.error.HTTPError) as got:
            urllib.request.urlopen(request, timeout=10)
        snapshot = proxy.book.snapshot("t.0")
    assert got.value.code == 404 and "WebSocket" in got.value.read().decode()
    assert snapshot["error"] is None and snapshot["calls"] == [] and provider.requests == []
    assert proxy.refused_paths == ["GET /attempt/t.0/v1/responses (WebSocket)"]
