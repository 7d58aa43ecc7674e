"""agent.kind = "exec" on the local host and two real sshd hosts: agents written against the official
``openai`` and ``anthropic`` SDKs, streaming, behind the controller's model proxy.

The agents (tests/integration/exec_agents/) run in a venv of their own with both SDKs, made once from
the package registry; the agents and the venv are staged under /var/tmp (tests/support/shared.py), where
every test host and the attempts' own uid can read them; the runner itself stays stdlib-only. The provider is tests/support/fake_provider.py on the controller's loopback.
"""

from __future__ import annotations

import json
import secrets
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.commands.replay import ReplayRequest, replay
from orchestrator.store.jsonl import read_jsonl
from tests.integration.test_openai_sshd import CONTRACT, SCRIPT, ProcessWatch, _files_holding, _uts
from tests.support.fake_provider import FakeProvider
from tests.support.shared import sdk_venv, stage

pytestmark = pytest.mark.sshd

KEY_ENV = "CROSSHOST_IT_EXEC_KEY"
SDKS = ("openai", "anthropic", "mcp")


@dataclass(frozen=True)
class SdkAgents:
    """The exec agents of tests/integration/exec_agents/ and a venv holding the official SDKs, both
    where every test host and the attempts' own uid can read them."""

    python: str
    dir: Path

    def command(self, agent: str, *args: str) -> list[str]:
        return [self.python, str(self.dir / agent), *args]


@pytest.fixture(scope="module")
def sdk() -> SdkAgents:
    agents = sorted((Path(__file__).resolve().parent / "exec_agents").glob("*_agent.py"))
    return SdkAgents(str(sdk_venv(SDKS)), stage("exec-agents", agents))


def exec_suite(root: Path, api: str, base_url: str, mark: str, sdk: SdkAgents, *, max_requests: int = 50,
               hold: bool = False) -> Path:
    """A one-task exec suite; its model is held only with ``hold`` (every host then gets the reference's
    answers, and the provider sees the reference's requests alone)."""
    suite = root / f"exec-{api}"
    (suite / "tasks" / "answer" / "repo").mkdir(parents=True)
    command = sdk.command(f"{api}_sdk_agent.py", "{prompt_file}", mark)
    (suite / "suite.toml").write_text(
        f'name = "exec-{api}"\nrepeat = 1\n'
        f'[agent]\nkind = "exec"\ncommand = {json.dumps(command)}\napi = "{api}"\nmodel = "m1"\n'
        f'base_url = "{base_url}"\napi_key_env = "{KEY_ENV}"\nmax_requests = {max_requests}\n'
        + ("" if hold else "hold_model = false\n") + "[budget]\nmax_steps = 6\ntimeout_s = 60\n"
    )
    (suite / "contract.json").write_text(json.dumps(CONTRACT))
    (suite / "tools.json").write_text(json.dumps({"allow": [], "deny": []}))
    task = suite / "tasks" / "answer"
    (task / "task.toml").write_text("")
    (task / "prompt.md").write_text("Find the answer and write it to answer.txt.\n")
    (task / "repo" / "notes.txt").write_text("the answer is 42\n")
    (task / "repo" / "run_tests.sh").write_text('test "$(cat answer.txt)" = 42\n')
    return suite


def provider_base(provider: FakeProvider, api: str) -> str:
    # the SDKs' conventions: OpenAI's base URL ends in /v1, Anthropic's is the origin
    return provider.base_url if api == "openai" else provider.base_url.removesuffix("/v1")


class StreamGate:
    """The provider waits after each stream's first event until the agents have marked as many first
    events (a file each in ``mark``) as streams were started: a proxy or forward that buffered a stream would stall it."""

    def __init__(self, mark: Path) -> None:
        self.mark = mark
        self.started = 0
        self.lock = threading.Lock()

    def __call__(self) -> bool:
        with self.lock:
            self.started += 1
            wanted = self.started
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if len(list(self.mark.iterdir())) >= wanted:
                return True
            time.sleep(0.02)
        return False


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_sdk_exec_agent_streams_through_the_proxy_on_three_hosts_and_the_key_stays_home(
    api: str, sdk: SdkAgents, sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-it-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    fleet = sshd_hosts.fleet
    tag = secrets.token_hex(4)
    workspace_root = f"/tmp/crosshost-exec-{tag}"
    mark = Path(f"/var/tmp/crosshost-exec-mark-{tag}")  # /var/tmp: the test hosts share it
    inventory = fleet.write_inventory(
        tmp_path / "hosts.toml", ["box-a", "box-b"], connect_timeout_s=5,
        extra_defaults={"workspace_root": workspace_root},
    )  # fmt: skip
    # a root of its own per host: the hosts share this machine's processes, and a host's cleanup
    # stops whatever names its workspace path
    text = inventory.read_text()
    for name in ("box-a", "box-b"):
        text = text.replace(f'name = "{name}"\n', f'name = "{name}"\nworkspace_root = "{workspace_root}-{name}"\n')
    inventory.write_text(text)
    watch = ProcessWatch(key, {n: _uts(fleet.hosts[n].ns_pid()) or "" for n in ("box-a", "box-b")}, workspace_root)
    mark.mkdir()
    mark.chmod(0o777)  # the attempts run as uids of their own
    gate = StreamGate(mark)
    try:
        with FakeProvider(script=SCRIPT, key=key, on_request=watch, after_first_event=gate) as provider:
            suite = exec_suite(tmp_path, api, provider_base(provider, api), str(mark), sdk)
            out = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs"))
        run_dir = out.run_dir.path
        rows = read_jsonl(run_dir / "results.jsonl")
        assert sorted((r["env"], r["verdict"]) for r in rows) == [
            ("box-a", "pass"), ("box-b", "pass"), ("local", "pass")
        ], [r.get("why") for r in rows]

        # Every request reached the provider streamed, with the real key, which only the proxy holds.
        assert len(provider.requests) == 3 * 3
        assert {r.body.get("stream") for r in provider.requests} == {True}
        if api == "openai":
            assert {r.headers["authorization"] for r in provider.requests} == {f"Bearer {key}"}
        else:
            assert {r.headers["x-api-key"] for r in provider.requests} == {key}
            assert {r.path for r in provider.requests} == {"/v1/messages"}
        # Each stream reached its agent event by event: the first before the provider sent the rest.
        assert provider.stream_gates == [True] * 9

        for host in ("local", "box-a", "box-b"):
            trace = read_jsonl(run_dir / "hosts" / host / "traces" / "answer.0.jsonl")
            turns = [t for t in trace if t.get("type") == "turn"]
            assert [(t["tool"], t["args"]) for t in turns] == [
                ("lookup", {"q": "answer"}), ("write_file", {"path": "answer.txt", "content": "42"}),
            ], host  # fmt: skip
            obs = read_jsonl(run_dir / "hosts" / host / "traces" / "answer.0.obs.jsonl")
            assert [o["content"] for o in obs] == ["the answer is 42\n", "wrote 2 bytes"], host
            assert turns[0]["prompt_tokens"] == 11 and turns[0]["completion_tokens"] == 7
            finish = trace[-1]
            assert finish["reason"] == "stop" and finish["findings"] == [], finish
            calls = read_jsonl(run_dir / "hosts" / host / "model_calls.jsonl")
            assert [c["status"] for c in calls] == [200] * 3, host
        report = json.loads((run_dir / "report.json").read_text())
        assert [t["classification"] for t in report["tasks"]] != ["infra_error"]

        # The key is in no process environment on a host, no host file, no pulled file.
        assert watch.foreign_processes > 0
        assert watch.offenders == []
        for host in ("box-a", "box-b"):
            for sub in ("root", "tmp", "opt"):
                assert _files_holding(fleet.hosts[host].dir / sub, key.encode()) == [], (host, sub)
        assert _files_holding(run_dir, key.encode()) == []
        assert _files_holding(run_dir, KEY_ENV.encode() + b"=") == []
    finally:
        shutil.rmtree(workspace_root, ignore_errors=True)
        shutil.rmtree(mark, ignore_errors=True)


def test_the_caps_stop_a_runaway_exec_agent_with_budget_model(
    sdk: SdkAgents, sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-it-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    inventory = sshd_hosts.fleet.write_inventory(tmp_path / "hosts.toml", ["box-a"], connect_timeout_s=5)
    with FakeProvider(mode="forever", key=key) as provider:
        suite = exec_suite(tmp_path, "openai", provider.base_url, "-", sdk, max_requests=4)
        out = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs"))
    rows = read_jsonl(out.run_dir.path / "results.jsonl")
    assert sorted((r["env"], r["reason"]) for r in rows) == [("box-a", "budget_model"), ("local", "budget_model")]
    assert all(r["verdict"] != "error" for r in rows), rows
    assert len(provider.requests) == 2 * 4  # the fifth request of each host never left the controller


def test_a_provider_failure_is_an_error_verdict_for_an_exec_agent(
    sdk: SdkAgents, sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-it-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    inventory = sshd_hosts.fleet.write_inventory(tmp_path / "hosts.toml", ["box-a"], connect_timeout_s=5)
    with FakeProvider(mode="bad_json", key=key) as provider:
        suite = exec_suite(tmp_path, "anthropic", provider_base(provider, "anthropic"), "-", sdk)
        out = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs"))
    rows = read_jsonl(out.run_dir.path / "results.jsonl")
    assert sorted((r["env"], r["verdict"], r["reason"]) for r in rows) == [
        ("box-a", "error", "agent_error"), ("local", "error", "agent_error")
    ], rows
    assert all("not server-sent events" in r["why"] for r in rows), rows
    report = json.loads((out.run_dir.path / "report.json").read_text())
    assert [t["classification"] for t in report["tasks"]] == ["infra_error"]


def test_an_mcp_client_agent_calls_the_contract_tools_and_each_call_is_a_trace_turn(
    sdk: SdkAgents, sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-it-" + secrets.token_hex(16))
    inventory = sshd_hosts.fleet.write_inventory(tmp_path / "hosts.toml", ["box-a"], connect_timeout_s=5)
    with FakeProvider(key="unused") as provider:
        suite = exec_suite(tmp_path, "openai", provider.base_url, "-", sdk)
        contract = {**CONTRACT, "tools": [{"name": "lookup", "required_args": ["q"], "forbidden_args": ["token"]},
                                          {"name": "write_file", "required_args": ["path", "content"]}]}
        (suite / "contract.json").write_text(json.dumps(contract))
        (suite / "tasks" / "answer" / "task.toml").write_text('[fixtures]\nlookup = "the answer is 42"\n')
        toml = (suite / "suite.toml").read_text()
        start = toml.index("command = ")
        end = toml.index("\n", start)
        command = sdk.command("mcp_agent.py", "{mcp_config}")
        (suite / "suite.toml").write_text(toml[:start] + f"command = {json.dumps(command)}" + toml[end:])
        out = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs"))
    assert provider.requests == []  # this agent asks no model: its tools come over MCP
    rows = read_jsonl(out.run_dir.path / "results.jsonl")
    assert sorted(r["env"] for r in rows) == ["box-a", "local"]
    for row in rows:
        host = row["env"]
        trace = read_jsonl(out.run_dir.path / "hosts" / host / "traces" / "answer.0.jsonl")
        finish = trace[-1]
        seen = json.loads(finish["final"])
        assert seen["protocol"] in ("2025-11-25", "2025-06-18") and seen["tools"] == ["lookup", "write_file"]
        assert seen["lookup"] == "the answer is 42" and seen["write_file"][0] is False
        assert seen["unknown"][0] is True and "not in contract" in seen["unknown"][1], seen
        assert seen["forbidden"][0] is True and "forbidden argument" in seen["forbidden"][1], seen
        turns = [t for t in trace if t.get("type") == "turn"]
        assert [(t["tool"], t["args"]) for t in turns] == [
            ("lookup", {"q": "answer"}), ("write_file", {"path": "answer.txt", "content": "42"}),
            ("rm_rf", {"path": "/"}), ("lookup", {"q": "answer", "token": "[REDACTED]"}),
        ], host  # fmt: skip
        assert turns[2]["error"] and "not in contract" in turns[2]["error"]
        # the predicate passed; the contract check fails the attempt on the unknown tool and the forbidden arg
        assert finish["predicate_exit"] == 0
        assert row["verdict"] == "fail" and "contract:" in row["why"], row
        kinds = {f["kind"] for f in finish["findings"]}
        assert {"unknown_tool", "forbidden_args"} <= kinds, finish["findings"]


def test_an_exec_agents_model_is_held_streamed_answers_and_all(
    sdk: SdkAgents, sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sampled model (each call's arguments drawn at random) behind a streaming SDK agent: held, box-a
    gets the reference's answers, event for event, and its trace is the reference's."""
    key = "sk-it-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    inventory = sshd_hosts.fleet.write_inventory(tmp_path / "hosts.toml", ["box-a"], connect_timeout_s=5)
    with FakeProvider(script=SCRIPT, key=key, mode="random") as provider:
        suite = exec_suite(tmp_path, "openai", provider.base_url, "-", sdk, hold=True)
        (suite / "suite.toml").write_text((suite / "suite.toml").read_text().replace("repeat = 1", "repeat = 3"))
        out = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs"))
    run_dir = out.run_dir.path
    rows = read_jsonl(run_dir / "results.jsonl")
    assert sorted((r["env"], r["verdict"]) for r in rows) == [("box-a", "pass")] * 3 + [("local", "pass")] * 3
    # box-a asked nothing: every request the provider got is one of the reference's own attempts at a
    # call (3 calls in each of its 3 attempts, and any retry a loaded machine made of one)
    asked = {h: [len(c["attempts"]) for a in range(3)
                 for c in read_jsonl(run_dir / "hosts" / h / "traces" / f"answer.{a}.jsonl")[-1]["model"]["calls"]]
             for h in ("local", "box-a")}
    hold = json.loads((run_dir / "model_hold.json").read_text())  # its divergences say why box-a asked live
    assert len(asked["local"]) == 9 and min(asked["local"]) >= 1 and asked["box-a"] == [0] * 9, (asked, hold)
    assert len(provider.requests) == sum(asked["local"]), asked
    assert hold["held"] == {"box-a": {"answer.0": 3, "answer.1": 3, "answer.2": 3}} and hold["divergences"] == []
    for attempt in range(3):
        shapes = [[(t["tool"], t["args"]) for t in read_jsonl(run_dir / "hosts" / h / "traces" / f"answer.{attempt}.jsonl")
                   if t.get("type") == "turn"] for h in ("local", "box-a")]
        assert shapes[0] == shapes[1] and len(shapes[0]) == 2, shapes
    calls = read_jsonl(run_dir / "hosts" / "box-a" / "model_calls.jsonl")
    assert {c["held"] for c in calls} == {True} and len(calls) == 9
    report = json.loads((run_dir / "report.json").read_text())
    [task] = report["tasks"]
    assert report["hold_model"] == "true" and task["model_hold"] == ["model held for 9 of 9 request(s) on box-a"]
    assert task["shape_diff"] == [] and task["classification"] == "agree", task
