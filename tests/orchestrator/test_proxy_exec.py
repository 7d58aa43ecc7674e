"""The model proxy for exec agents, driven by the official SDKs (not streamed here; the sshd tests
stream): the placeholder is required and swapped for the real key, and the exchanges become turns."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import anthropic
import openai
import pytest

from agent_runner.errors import SuiteError
from agent_runner.suite import read_suite
from agent_runner.wire import CALL_HEADER, EXEC_PREFIX, MODEL_PASS_ENV
from orchestrator.hosts.testing import FakeHost
from orchestrator.model.hold import ModelHold
from orchestrator.model.proxy import ModelProxy, ProxyConfig, model_route
from tests.support.fake_provider import FakeProvider

KEY = "sk-unit-" + "k" * 24
SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "lookup", "args": {"q": "answer"}}]},
    {"content": "42", "finish": "stop"},
]


def _proxy(api: str, base_url: str, **kw: Any) -> ModelProxy:
    return ModelProxy(base_url, "K", api=api, environ={"K": KEY}, retry_wait_s=0, **kw)


def test_openai_sdk_through_the_proxy_builds_turns_with_the_next_requests_tool_result() -> None:
    with FakeProvider(script=SCRIPT, key=KEY) as provider, _proxy("openai", provider.base_url) as proxy:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{proxy.port}{EXEC_PREFIX}t.0/v1", api_key=proxy.attempt_token("t.0"))
        first = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])
        call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
        messages: list[Any] = [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "the answer is 42"},
        ]
        second = client.chat.completions.create(model="m", messages=messages)
        assert second.choices[0].message.content == "42"
        assert {r.headers["authorization"] for r in provider.requests} == {f"Bearer {KEY}"}
        snapshot = proxy.book.snapshot("t.0")
    assert snapshot["requests"] == 2 and snapshot["stopped"] is None and snapshot["error"] is None
    assert [(t["tool"], t["args"], t["observation"], t["prompt_tokens"]) for t in snapshot["turns"]] == [
        ("lookup", {"q": "answer"}, "the answer is 42", 11)
    ]


def test_anthropic_sdk_through_the_proxy_with_the_placeholder_only() -> None:
    with FakeProvider(script=SCRIPT, key=KEY) as provider:
        base = provider.base_url.removesuffix("/v1")
        with _proxy("anthropic", base) as proxy:
            url = f"http://127.0.0.1:{proxy.port}{EXEC_PREFIX}t.1"
            wrong = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)
            with pytest.raises(anthropic.AuthenticationError):  # the real key is not what the proxy takes
                wrong.messages.create(model="m", max_tokens=9, messages=[{"role": "user", "content": "go"}])
            client = anthropic.Anthropic(base_url=url, api_key=proxy.attempt_token("t.1"))
            answer = client.messages.create(model="m", max_tokens=9, messages=[{"role": "user", "content": "go"}])
            assert [b.type for b in answer.content] == ["tool_use"]
            snapshot = proxy.book.snapshot("t.1")
        assert {r.headers["x-api-key"] for r in provider.requests} == {KEY}
        assert len(provider.requests) == 1  # the refused request never left the controller
    assert [(t["tool"], t["args"], t["observation"]) for t in snapshot["turns"]] == [("lookup", {"q": "answer"}, None)]


def test_the_request_cap_is_a_budget_model_stop_of_the_attempt() -> None:
    with FakeProvider(mode="forever", key=KEY) as provider, _proxy("openai", provider.base_url, max_requests=1) as proxy:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{proxy.port}{EXEC_PREFIX}t.0/v1", api_key=proxy.attempt_token("t.0"),
                               max_retries=0)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])
        with pytest.raises(openai.PermissionDeniedError) as got:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])
        assert "max_requests = 1" in str(got.value)
        assert proxy.book.snapshot("t.0")["stopped"] == "budget_model"


def test_model_route_gives_an_exec_run_the_placeholder_and_never_the_key() -> None:
    agent = ProxyConfig("http://127.0.0.1:9/v1", "K", api="openai", kind="exec")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("K", KEY)
        with model_route(FakeHost("h"), agent) as env:
            assert len(env[MODEL_PASS_ENV]) == 64 and KEY not in env.values()


def test_an_exec_agent_needs_its_api_and_command(tmp_path: Any) -> None:
    suite = tmp_path / "s"
    (suite / "tasks" / "t").mkdir(parents=True)
    (suite / "contract.json").write_text('{"contract_id": "c", "tools": []}')
    (suite / "tasks" / "t" / "task.toml").write_text("")
    (suite / "tasks" / "t" / "prompt.md").write_text("go\n")
    base = 'model = "m"\nbase_url = "http://x/v1"\napi_key_env = "K"\n'
    (suite / "suite.toml").write_text(f'[agent]\nkind = "exec"\ncommand = ["a"]\n{base}')
    with pytest.raises(SuiteError, match=r"api is required for kind = \"exec\""):
        read_suite(suite)
    (suite / "suite.toml").write_text(f'[agent]\nkind = "exec"\napi = "openai"\n{base}')
    with pytest.raises(SuiteError, match="command must be a non-empty list"):
        read_suite(suite)
    (suite / "suite.toml").write_text(f'[agent]\nkind = "exec"\napi = "openai"\ncommand = ["a"]\n{base}')
    loaded = read_suite(suite)
    assert loaded.tasks[0].agent.kind == "exec" and loaded.repeat == 3  # sampled: three attempts


def _post(proxy: ModelProxy, attempt: str, api: str, body: dict[str, Any]) -> tuple[int, bytes]:
    path = "/v1/messages" if api == "anthropic" else "/v1/chat/completions"
    request = urllib.request.Request(f"http://127.0.0.1:{proxy.port}{EXEC_PREFIX}{attempt}{path}",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "x-api-key": proxy.attempt_token(attempt)})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.parametrize(("api", "stream"), [("openai", True), ("openai", False), ("anthropic", True),
                                             ("anthropic", False)])
def test_an_exec_agents_model_is_held_streamed_or_not(api: str, stream: bool) -> None:
    first = {"model": "m", "max_tokens": 9, "stream": stream, "messages": [{"role": "user", "content": "go"}]}
    with FakeProvider(script=SCRIPT, key=KEY, mode="random") as provider:
        base = provider.base_url if api == "openai" else provider.base_url.removesuffix("/v1")
        hold = ModelHold("ref", "strict")
        with _proxy(api, base, hold=hold, host="ref") as ref, _proxy(api, base, hold=hold, host="other") as other:
            reference = _post(ref, "t.0", api, first)
            held = _post(other, "t.0", api, first)
            asked = len(provider.requests)
            # a request the reference did not make: strict ends the attempt with model_diverged
            diverged = _post(other, "t.1", api, {**first, "messages": [{"role": "user", "content": "other"}]})
            _post(ref, "t.1", api, first)
            after = _post(other, "t.1", api, {**first, "messages": [{"role": "user", "content": "other"}]})
    assert asked == 1  # the held host asked the provider nothing
    assert held == reference and held[0] == 200  # the same bytes: a stream's events as the reference got them
    shapes = [[(t["tool"], t["args"]) for t in p.book.snapshot("t.0")["turns"]] for p in (ref, other)]
    assert shapes[0] == shapes[1] != []
    assert other.book.snapshot("t.0")["calls"][0]["held"] is True
    assert [c.held for c in other.calls] == [True, False, False]
    assert diverged[0] == 200  # t.1 had no record yet: answered live, not held
    assert after[0] == 409 and b"model_diverged" in after[1], after  # differs from the reference's t.1
    assert len(provider.requests) == 3
    assert other.book.snapshot("t.1")["stopped"] == "model_diverged"
    assert hold.summary().held == {"other": {"t.0": 1}}


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_streamed_answer_carries_its_record_header_and_the_attempt_keeps_each_requests_record(api: str) -> None:
    first = {"model": "m", "max_tokens": 9, "stream": True, "messages": [{"role": "user", "content": "go"}]}
    with FakeProvider(script=SCRIPT, key=KEY) as provider:
        base = provider.base_url if api == "openai" else provider.base_url.removesuffix("/v1")
        with _proxy(api, base, model="m") as proxy:
            path = "/v1/messages" if api == "anthropic" else "/v1/chat/completions"
            request = urllib.request.Request(f"http://127.0.0.1:{proxy.port}{EXEC_PREFIX}t.0{path}",
                                             data=json.dumps(first).encode(), method="POST",
                                             headers={"Content-Type": "application/json",
                                                      "x-api-key": proxy.attempt_token("t.0")})
            with urllib.request.urlopen(request, timeout=10) as resp:
                header = json.loads(resp.headers[CALL_HEADER])
                assert resp.read().count(b"data:") > 3
            _post(proxy, "t.0", api, {**first, "model": "other"})  # refused: recorded too
            seen = proxy.book.snapshot("t.0")
    assert (header["id"], header["status"], [a["status"] for a in header["attempts"]]) == (1, 200, [200])
    assert [(c["request"], c["status"], c["finish_reason"], c.get("error")) for c in seen["calls"]] == [
        (1, 200, "tool_calls" if api == "openai" else "tool_use", None), (2, 403, None, "crosshost_refused")]
    assert seen["turns"][0]["model"] == seen["calls"][0] and (seen["prompt_tokens"], seen["completion_tokens"]) == (11, 7)


def test_a_stream_is_relayed_as_it_arrives_and_read_back_in_whole_lines() -> None:
    """Whatever one read brings goes on in one write; the lines the trace is built from are whole,
    however the reads cut them (mid-line, several lines at once, a line past the size bound)."""
    from orchestrator.model import exec_forward as forward_module

    stream = b'data: {"a": 1}\n\ndata: {"b": 2}\n\nevent: x\ndata: [DONE]\n\ntail-without-newline'

    class Resp:
        def __init__(self, cuts: list[int]) -> None:
            self.pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]

        def read1(self, n: int) -> bytes:
            assert n == forward_module.RELAY_BYTES
            return self.pieces.pop(0) if self.pieces else b""

    class Sent:
        def __init__(self) -> None:
            self.writes: list[bytes] = []

        def chunk(self, data: bytes) -> None:
            self.writes.append(data)

    lines = stream.decode().splitlines(keepends=True)
    for cuts in ([], [3, 5, 20, 21, 40], list(range(1, len(stream)))):
        resp, sent = Resp(cuts), Sent()
        got = list(forward_module.relay_lines(resp, sent))  # type: ignore[arg-type]
        assert [x.decode() for x in got] == lines
        assert sent.writes == [p for p in Resp(cuts).pieces if p]  # one write a read, in order
    big = Resp([])
    big.pieces = [b"x" * forward_module.MAX_RESPONSE_BYTES, b"yz\n"]
    assert [len(x) for x in forward_module.relay_lines(big, Sent())] == [forward_module.MAX_RESPONSE_BYTES, 3]  # type: ignore[arg-type]
