"""The held model through the proxy: the reference records, the other host is answered from the
record while its requests match, and at the first difference it is answered live (true) or stopped
(strict) with the divergence recorded."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent_runner.wire import ERR_DIVERGED, FINISH_MODEL_DIVERGED
from orchestrator.model.apis.openai_chat import OpenAIChat
from orchestrator.model.hold import Divergence, HoldSummary, ModelHold, first_difference, hold_mode
from orchestrator.model.proxy import ModelProxy, ProxyConfig
from orchestrator.store.rundir import RunDir
from tests.support.fake_provider import FakeProvider

KEY = "sk-test-key-0123456789abcdef"
ENV = {"TEST_MODEL_KEY": KEY}
SCRIPT = [{"tool_calls": [{"name": "lookup", "args": {"q": "x"}}]}, {"content": "done", "finish": "stop"}]


def _body(*observations: str) -> bytes:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for i, obs in enumerate(observations):
        messages.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{i}_0"}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}_0", "content": obs})
    return json.dumps({"model": "m1", "messages": messages, "temperature": 1}).encode()


def _proxies(provider: FakeProvider, mode: str) -> tuple[ModelHold, ModelProxy, ModelProxy]:
    hold = ModelHold("local", mode)
    make = lambda host: ModelProxy(provider.base_url, "TEST_MODEL_KEY", environ=ENV, hold=hold, host=host)  # noqa: E731
    return hold, make("local"), make("box-b")


@pytest.mark.parametrize("mode", ["true", "strict"])
def test_held_while_equal_then_live_or_stopped_at_the_first_difference(mode: str) -> None:
    with FakeProvider(script=SCRIPT, key=KEY) as provider:
        hold, ref, other = _proxies(provider, mode)
        for raw in (_body(), _body("ok")):
            assert ref.handle_chat(raw, "t.0")[0] == 200
        assert len(provider.requests) == 2
        status, answer, call = other.handle_chat(_body(), "t.0")  # the same first request: held
        assert (status, call.held, len(provider.requests)) == (200, True, 2)
        assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "lookup"
        status, answer, call = other.handle_chat(_body("ok on box-b"), "t.0")  # another observation
    [d] = hold.divergences
    assert (d.task, d.attempt, d.host, d.request, d.message, d.role) == ("t", 0, "box-b", 1, 2, "tool")
    assert (d.reference, d.other) == ("ok", "ok on box-b")
    assert d.diff == ["-ok", "+ok on box-b"]
    if mode == "true":
        assert (status, call.held, len(provider.requests)) == (200, False, 3)  # answered live
    else:
        assert (status, answer["error"]["type"], answer["error"]["code"]) == (409, ERR_DIVERGED, FINISH_MODEL_DIVERGED)
        assert len(provider.requests) == 2  # never reached the provider
    summary = hold.summary()
    assert summary.recorded == {"t.0": 2} and summary.held == {"box-b": {"t.0": 1}}


@pytest.mark.parametrize("mode", ["true", "strict"])
def test_an_attempt_the_reference_never_asked_about_is_answered_live_unrecorded_as_divergence(mode: str) -> None:
    with FakeProvider(script=SCRIPT, key=KEY) as provider:
        hold, _, other = _proxies(provider, mode)
        status, _, call = other.handle_chat(_body(), "t.1")
    assert (status, call.held, hold.divergences) == (200, False, [])
    assert hold.summary().live == {"box-b": {"t.1": 1}}


def test_settings_differing_are_a_difference_too() -> None:
    chat = OpenAIChat()
    ref = {"messages": [{"role": "user", "content": "go"}], "temperature": 0}
    assert first_difference(chat.comparable(ref), chat.comparable({**ref, "temperature": 1})) == (
        None, None, "temperature: 0", "temperature: 1")
    # the first differing message, by index and role
    later = {**ref, "messages": [{"role": "user", "content": "go"}, {"role": "tool", "content": "x"}]}
    assert first_difference(chat.comparable(ref), chat.comparable(later)) == (1, "tool", "", "x")


def test_hold_mode_defaults_to_held_for_a_live_model_and_the_flag_wins() -> None:
    assert hold_mode(None, True) is None  # no live model: nothing to hold
    live = ProxyConfig("http://127.0.0.1:9/v1", "K")
    assert hold_mode(live, None) == "true"
    assert hold_mode(replace(live, hold_model="strict"), None) == "strict"
    assert hold_mode(replace(live, hold_model=False), None) is None
    assert hold_mode(replace(live, hold_model=False), True) == "true"
    assert hold_mode(live, False) is None


def test_an_exec_attempts_own_directory_is_set_aside_in_both_spellings_and_the_answer_gets_the_hosts() -> None:
    hold = ModelHold("local", "strict")
    ref_root, root = "/tmp/crosshost/runs/r1/work/t.0.abcd1234", "/srv/ws/runs/r1/work/t.0.wxyz9876"

    def asked(where: str) -> dict[str, Any]:
        slug = where.replace("/", "-").replace(".", "-")
        return {"model": "m", "system": f"memory in /home/x/.claude/projects/{slug}-work/memory",
                "messages": [{"role": "user", "content": f"Primary working directory: {where}/work"}]}

    answer = {"content": [{"type": "tool_use", "id": "t", "name": "read", "input": {"path": f"{ref_root}/work/a"}}]}
    hold.record("t.0", asked(ref_root), answer, ref_root)
    held = hold.follow("box-b", "t.0", asked(root), root)
    assert held is not None and held["content"][0]["input"] == {"path": f"{root}/work/a"}
    assert hold.follow("box-c", "t.0", asked("/elsewhere/t.0.zzzz0000"), root) is None  # not this host's path
    [d] = hold.divergences
    assert d.host == "box-c" and "{crosshost_attempt_dir}" in d.reference and "/elsewhere/" in d.other


def test_only_a_deep_absolute_directory_is_taken_as_an_attempts_root() -> None:
    from orchestrator.model.hold import attempt_root

    assert attempt_root("/tmp/crosshost/runs/r/work/t.0.abcd1234") == "/tmp/crosshost/runs/r/work/t.0.abcd1234"
    for bad in ("/", "/tmp", "/tmp/x", "relative/a/b/c", '/a/b/c"d', "/a/b/c\\d", "/a/b/c\nd", 7, None):
        assert attempt_root(bad) is None, bad


def test_model_hold_json_is_read_back_as_it_was_written_and_damage_reads_as_not_held(tmp_path: Path) -> None:
    with FakeProvider(script=SCRIPT, key=KEY) as provider:
        hold, _, other = _proxies(provider, "true")
        other.handle_chat(_body(), "t.1")
    written = hold.summary()
    run = RunDir(tmp_path)
    hold.write(run, lambda path, data: path.write_bytes(data))
    assert HoldSummary.read(run) == written and written.live == {"box-b": {"t.1": 1}}
    run.model_hold_path.write_text(json.dumps({"mode": "true", "reference": "local", "recorded": {"t.0": "2"},
                                               "held": {"box-b": [1]}, "divergences": [{"task": 7}, "x"]}))
    damaged = HoldSummary.read(run)
    assert damaged is not None and damaged.recorded_requests(["t.0"]) == 0
    assert damaged.held_requests("box-b", ["t.0"]) == 0 and [d.task for d in damaged.divergences] == ["7"]
    run.model_hold_path.write_text("[1, 2]")
    assert HoldSummary.read(run) is None


def test_the_summaries_of_disjoint_runs_join_into_one() -> None:
    # shards and --until-decided rounds each hold the model for their own attempts
    first = HoldSummary("true", "local", {"t.0": 2}, {"box-b": {"t.0": 2}}, {},
                        [Divergence("t", 0, "box-b", 1, 1, "tool", "a", "b")])
    second = HoldSummary("true", "local", {"t.1": 1}, {"box-b": {"t.1": 0}}, {"box-b": {"t.1": 1}},
                         [Divergence("t", 1, "box-b", 0, None, None, "", "")])
    joined = HoldSummary.joined([first, second])
    assert joined is not None and (joined.mode, joined.reference) == ("true", "local")
    assert joined.recorded == {"t.0": 2, "t.1": 1} and joined.held == {"box-b": {"t.0": 2, "t.1": 0}}
    assert joined.live == {"box-b": {"t.1": 1}} and [d.attempt for d in joined.divergences] == [0, 1]
    assert HoldSummary.joined([]) is None
