"""ModelProxy against a real chat-completions server on loopback (tests/support/fake_provider.py)."""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from agent_runner.suite import Suite, suite_from_dict
from agent_runner.wire import ATTEMPT_HEADER, CALL_HEADER, MODEL_PASS_ENV, attempt_token
from orchestrator.errors import ApiKeyMissing, SuiteError
from orchestrator.hosts.transport.local import LocalHost
from orchestrator.model.proxy import ModelProxy, ProxyConfig, model_route
from orchestrator.model.server import MAX_REQUEST_BYTES
from orchestrator.model.settings import openai_agent_config
from tests.support.fake_provider import FakeProvider, redirecting_provider, unused_port

KEY = "sk-test-key-0123456789abcdef"
ENV = {"TEST_MODEL_KEY": KEY}


def post(
    to: ModelProxy | str, body: Any, *, path: str = "/chat/completions", headers: dict[str, str] | None = None,
    attempt: str = "t.0",
) -> tuple[int, dict[str, Any], dict[str, Any] | None]:
    """POST ``body`` to a proxy as the built-in agent of ``attempt`` does (its id and its placeholder),
    or to a bare URL with only ``headers``."""
    url, own = (to, {}) if isinstance(to, str) else (to.url, as_attempt(to, attempt))
    req = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **own, **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, data, hdrs = resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        status, data, hdrs = exc.code, exc.read(), exc.headers
    call = json.loads(hdrs[CALL_HEADER]) if hdrs.get(CALL_HEADER) else None
    return status, json.loads(data), call


def as_attempt(proxy: ModelProxy, attempt: str = "t.0") -> dict[str, str]:
    """The headers the runner's built-in agent sends for ``attempt``."""
    return {ATTEMPT_HEADER: attempt, "Authorization": f"Bearer {proxy.attempt_token(attempt)}"}


def chat(model: str = "m1") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


def proxy_for(provider: FakeProvider, sleeps: list[float] | None = None, **kw: Any) -> ModelProxy:
    kw.setdefault("model", "m1")
    return ModelProxy(
        provider.base_url,
        "TEST_MODEL_KEY",
        environ=ENV,
        retry_wait_s=0.01,
        retry_max_wait_s=0.05,
        sleep=(sleeps.append if sleeps is not None else lambda s: None),
        **kw,
    )


def test_key_added_and_answer_passed_through_with_call_record() -> None:
    with (
        FakeProvider(script=[{"content": "hello", "finish": "stop"}], key=KEY) as provider,
        proxy_for(provider) as proxy,
    ):
        # The attempt's placeholder is replaced by the key, never forwarded.
        status, body, call = post(proxy, chat())
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "hello"
    assert [r.headers["authorization"] for r in provider.requests] == [f"Bearer {KEY}"]
    assert call is not None and call["status"] == 200 and call["retries"] == 0
    assert call["model"] == "fake-model-1" and call["system_fingerprint"] == "fp_fake_0001"
    assert (call["prompt_tokens"], call["completion_tokens"], call["total_tokens"]) == (11, 7, 18)
    assert [c.status for c in proxy.calls] == [200]
    assert proxy.summary()["total_tokens"] == 18


def test_only_chat_completions_is_forwarded() -> None:
    with FakeProvider(key=KEY) as provider, proxy_for(provider) as proxy:
        s1, b1, _ = post(proxy, {"input": "x"}, path="/embeddings")
        s2, b2, _ = post(proxy.url.replace("/v1", ""), chat(), path="/chat/completions")
        with pytest.raises(urllib.error.HTTPError) as got:
            urllib.request.urlopen(proxy.url + "/models", timeout=10)
        s4, b4, _ = post(proxy, chat(model="gpt-expensive"))
    assert (s1, s2, got.value.code, s4) == (404, 404, 405, 403)
    assert b1["error"]["type"] == b2["error"]["type"] == b4["error"]["type"] == "crosshost_refused"
    assert "gpt-expensive" in b4["error"]["message"]
    assert provider.requests == []  # nothing reached the provider
    assert len(proxy.refused_paths) == 3


def test_request_cap_answers_budget_model() -> None:
    with FakeProvider(mode="forever", key=KEY) as provider, proxy_for(provider, max_requests=2) as proxy:
        answers = [post(proxy, chat()) for _ in range(3)]
    assert [a[0] for a in answers] == [200, 200, 403]
    err = answers[2][1]["error"]
    assert err["type"] == "crosshost_budget" and err["code"] == "budget_model"
    assert "max_requests = 2" in err["message"]
    assert len(provider.requests) == 2
    assert proxy.requests_used == 2


def test_token_cap_stops_after_the_tokens_are_spent() -> None:
    # Each fake answer costs 18 tokens: 0 < 30, 18 < 30, then 36 >= 30 is refused.
    with FakeProvider(mode="forever", key=KEY) as provider, proxy_for(provider, max_total_tokens=30) as proxy:
        statuses = [post(proxy, chat())[0] for _ in range(3)]
    assert statuses == [200, 200, 403]
    assert proxy.tokens_used == 36
    assert proxy.calls[-1].error == "crosshost_budget"


def test_429_twice_then_ok_is_retried_and_every_attempt_recorded() -> None:
    sleeps: list[float] = []
    with FakeProvider(key=KEY, fail_first=[429, 429]) as provider, proxy_for(provider, sleeps) as proxy:
        status, body, call = post(proxy, chat())
    assert status == 200 and body["choices"]
    assert call is not None and call["retries"] == 2
    assert [a["status"] for a in call["attempts"]] == [429, 429, 200]
    assert all(a["wait_s"] is not None for a in call["attempts"][:2])
    assert len(sleeps) == 2 and all(0 <= s <= 0.05 for s in sleeps)
    assert len(provider.requests) == 3
    assert proxy.summary()["retries"] == 2


def test_5xx_until_out_of_attempts_is_a_provider_error() -> None:
    with (
        FakeProvider(key=KEY, fail_first=[503] * 10) as provider,
        proxy_for(provider, retry_attempts=3) as proxy,
    ):
        status, body, call = post(proxy, chat())
    assert status == 502
    assert body["error"]["type"] == "crosshost_provider_error"
    assert "HTTP 503 after 3 attempt(s)" in body["error"]["message"]
    assert call is not None and [a["status"] for a in call["attempts"]] == [503, 503, 503]
    assert len(provider.requests) == 3


def test_unreachable_provider_is_a_clear_error() -> None:
    base = f"http://127.0.0.1:{unused_port()}/v1"
    with ModelProxy(base, "TEST_MODEL_KEY", environ=ENV, retry_attempts=2, sleep=lambda s: None) as proxy:
        status, body, call = post(proxy, chat())
    assert status == 502
    assert body["error"]["type"] == "crosshost_provider_unreachable"
    assert base in body["error"]["message"] and "\n" not in body["error"]["message"]
    assert call is not None and [a["status"] for a in call["attempts"]] == [None, None]


def test_bad_json_is_not_retried_and_is_a_clear_error() -> None:
    with FakeProvider(mode="bad_json", key=KEY) as provider, proxy_for(provider) as proxy:
        status, body, _ = post(proxy, chat())
    assert status == 502
    assert body["error"]["type"] == "crosshost_provider_bad_json"
    assert "not JSON" in body["error"]["message"]
    assert len(provider.requests) == 1


def test_wrong_key_is_reported_without_echoing_any_key() -> None:
    with FakeProvider(key="sk-the-right-one") as provider, proxy_for(provider) as proxy:
        status, body, call = post(proxy, chat())
    assert status == 502 and "refused the API key" in body["error"]["message"]
    everything = json.dumps(body) + json.dumps(call) + json.dumps(proxy.summary()) + repr(proxy)
    assert KEY not in everything and "sk-wr" not in everything
    assert len(provider.requests) == 1  # 401 is not retried


def test_unset_api_key_env_is_one_line_input_error() -> None:
    with pytest.raises(ApiKeyMissing) as got:
        ModelProxy("http://127.0.0.1:9/v1", "NO_SUCH_KEY_VAR", environ={}, where="suites/triage/suite.toml")
    line = got.value.one_line()
    assert got.value.exit_code == 2
    assert "\n" not in line and "NO_SUCH_KEY_VAR" in line and "suites/triage/suite.toml" in line


def test_records_hold_no_key_and_proxy_closes_its_port(tmp_path: Any) -> None:
    with FakeProvider(key=KEY, script=[{"tool_calls": [{"name": "t", "args": {"a": 1}}]}]) as provider:
        with proxy_for(provider) as proxy:
            post(proxy, chat())
            url = proxy.url
        out = tmp_path / "model_calls.jsonl"
        proxy.write_jsonl(out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [1] and KEY not in out.read_text()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "/chat/completions", data=b"{}", timeout=2)


def test_openai_agent_config_merges_suite_and_tasks_and_selects_only_model_tasks(tmp_path: Path) -> None:
    agent = {
        "kind": "openai",
        "model": "m1",
        "base_url": "http://x/v1",
        "api_key_env": "K",
        "max_requests": 5,
    }

    def suite(suite_agent: dict[str, Any], tasks: list[dict[str, Any]]) -> Suite:
        data = {"name": "s", "agent": suite_agent, "contract": {"tools": []}, "tasks": tasks}
        return suite_from_dict(data, tmp_path)

    three = suite(
        agent,
        [
            {"id": "a", "prompt": "p"},
            {"id": "b", "prompt": "p", "agent": {"model": "m2"}},
            {"id": "p", "prompt": "p", "agent": {"kind": "none"}},
        ],
    )
    both = openai_agent_config(three)
    assert both is not None and both.max_requests == 5 and both.model is None  # two models: no pin
    assert (both.base_url, both.api_key_env, both.api, both.kind, both.hold_model) == ("http://x/v1", "K", "openai",
                                                                                      "openai", True)
    only_a = openai_agent_config(three, ["a", "p"])
    assert only_a is not None and only_a.model == "m1"
    assert openai_agent_config(three, ["p"]) is None
    assert openai_agent_config(suite({"kind": "none"}, [{"id": "a", "prompt": "p"}])) is None
    split = suite(agent, [{"id": "a", "prompt": "p"}, {"id": "b", "prompt": "p", "agent": {"base_url": "http://y/v1"}}])
    with pytest.raises(SuiteError, match="base_url"):
        openai_agent_config(split)


def test_model_route_serves_the_local_host_directly_and_records_calls(
    tmp_path: Any, monkeypatch: Any
) -> None:
    monkeypatch.setenv("TEST_MODEL_KEY", KEY)
    with FakeProvider(key=KEY) as provider:
        agent = ProxyConfig(provider.base_url, "TEST_MODEL_KEY", model="m1")
        with model_route(LocalHost(), agent, tmp_path) as env:
            token = attempt_token(env[MODEL_PASS_ENV], "t.0")
            status, _, _ = post(env["CROSSHOST_MODEL_URL"], chat(),
                                headers={ATTEMPT_HEADER: "t.0", "Authorization": f"Bearer {token}"})
            without, _, _ = post(env["CROSSHOST_MODEL_URL"], chat())
        with model_route(LocalHost(), None, tmp_path) as nothing:
            assert nothing == {}
    assert status == 200 and without == 401 and set(env) == {"CROSSHOST_MODEL_URL", MODEL_PASS_ENV}
    assert env["CROSSHOST_MODEL_URL"].startswith("http://127.0.0.1:")
    assert [
        json.loads(line)["status"] for line in (tmp_path / "model_calls.jsonl").read_text().splitlines()
    ] == [200, 401]
    assert len(provider.requests) == 1


@pytest.mark.parametrize("how", ["no placeholder", "another attempt's", "no attempt", "another proxy's"])
def test_the_built_in_agents_path_needs_the_placeholder_of_the_attempt_it_names(how: str) -> None:
    """Every request of the built-in agent names its attempt and carries that attempt's placeholder;
    anything else is a 401 in the OpenAI error format, recorded, and never reaches the provider."""
    with FakeProvider(key=KEY) as provider, proxy_for(provider) as proxy, proxy_for(provider) as other:
        headers = {
            "no placeholder": {ATTEMPT_HEADER: "t.0", "Authorization": ""},
            "another attempt's": {ATTEMPT_HEADER: "t.0", "Authorization": f"Bearer {proxy.attempt_token('t.1')}"},
            "no attempt": {ATTEMPT_HEADER: "", "Authorization": f"Bearer {proxy.attempt_token('t.0')}"},
            "another proxy's": as_attempt(other),
        }[how]
        status, body, call = post(proxy, chat(), headers=headers)
    assert status == 401 and body["error"]["type"] == "crosshost_refused", body
    assert call is not None and call["status"] == 401
    assert provider.requests == []
    assert [c.status for c in proxy.calls] == [401] and proxy.summary()["refusals"] == 1


@pytest.mark.parametrize("body", [b"[" * 100_000, b'{"model": "m1", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"])
def test_a_body_nested_past_the_bound_is_a_400_recorded_never_a_traceback(
    body: bytes, capfd: pytest.CaptureFixture[str]
) -> None:
    with FakeProvider(key=KEY) as provider, proxy_for(provider) as proxy:
        req = urllib.request.Request(proxy.url + "/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **as_attempt(proxy)})
        with pytest.raises(urllib.error.HTTPError) as got:
            urllib.request.urlopen(req, timeout=10)
        answer = json.loads(got.value.read())
    assert got.value.code == 400 and answer["error"]["type"] == "crosshost_refused"
    assert "nested more than" in answer["error"]["message"]
    assert [c.status for c in proxy.calls] == [400] and provider.requests == []
    assert "Traceback" not in capfd.readouterr().err


def _post_headers_only(proxy: ModelProxy, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """The built-in agent's POST of its attempt with ``headers`` as given (a Content-Length or none),
    and no body sent: the answer comes only if the proxy does not wait for one."""
    where = urllib.parse.urlsplit(proxy.url)
    conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=10)
    try:
        conn.putrequest("POST", where.path + "/chat/completions", skip_accept_encoding=True)
        for name, value in {**as_attempt(proxy), "Content-Type": "application/json", **headers}.items():
            conn.putheader(name, value)
        conn.endheaders()
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("length", "status"), [(str(MAX_REQUEST_BYTES + 1), 413), ("999999999999", 413), ("-1", 413), ("a lot", 411), (None, 411)]
)
def test_a_body_past_the_cap_or_of_no_stated_length_is_refused_unread_and_recorded(
    length: str | None, status: int, capfd: pytest.CaptureFixture[str]
) -> None:
    """An attempt that announces a body past 8 MiB (or a negative one, or none) is refused before the
    proxy reads or allocates any of it: recorded, in the OpenAI error format, never the provider's."""
    with FakeProvider(key=KEY) as provider, proxy_for(provider) as proxy:
        got, body = _post_headers_only(proxy, {} if length is None else {"Content-Length": length})
        assert got == status and body["error"]["type"] == "crosshost_refused", body
        assert [c.status for c in proxy.calls] == [status] and provider.requests == []
        assert post(proxy, chat())[0] == 200  # and the next request is served
    assert "Traceback" not in capfd.readouterr().err


def test_a_silent_connection_to_the_proxy_holds_its_thread_only_until_the_read_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With one thread: a connection that sends nothing holds it until the proxy's read timeout closes
    it; one opened meanwhile is closed rather than queued; then the proxy serves again."""
    monkeypatch.setattr("orchestrator.model.server.READ_TIMEOUT_S", 3.0)
    with FakeProvider(key=KEY) as provider, proxy_for(provider, max_connections=1) as proxy:
        where = urllib.parse.urlsplit(proxy.url)
        address = (where.hostname or "", where.port or 0)
        held = socket.create_connection(address, timeout=10)
        try:
            time.sleep(0.2)  # accepted, its thread waiting for a request line
            turned = socket.create_connection(address, timeout=10)
            with turned:
                assert turned.recv(100) == b""  # closed: a thread of its own would still wait for it
            held.setblocking(False)
            with pytest.raises(BlockingIOError):
                held.recv(100)  # still open, so the other was turned away, not served after its timeout
            held.settimeout(10)
            assert held.recv(100) == b""  # closed by the proxy's read timeout
        finally:
            held.close()
        # the held connection's thread is given back just after its socket closes: until then a
        # request is turned away like the second connection was
        deadline = time.monotonic() + 5
        while True:
            try:
                status = post(proxy, chat())[0]
            except (ConnectionError, urllib.error.URLError):
                status = 0
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert status == 200
    assert provider.requests and proxy.summary()["refusals"] == 0


def test_a_redirecting_provider_never_gets_the_key_at_the_new_origin() -> None:
    """A provider that answers 302 to another origin: the proxy does not follow (a 502 that says so),
    and the other origin receives nothing, the key least of all."""
    with redirecting_provider() as (url, seen), ModelProxy(
        url, "TEST_MODEL_KEY", environ=ENV, model="m1", retry_attempts=1
    ) as proxy:
        status, body, _ = post(proxy, chat())
    assert status == 502 and "redirect" in body["error"]["message"], body
    assert seen == []
