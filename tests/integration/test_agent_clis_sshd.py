"""The agent CLIs people run, from their registries (pinned in tools/agent-clis, installed by ``make
setup``), each set up by its ``agent.preset`` and driven through the model proxy on the local host and
two real sshd hosts against a scripted provider of the API it speaks: Codex (OpenAI Responses),
Gemini CLI (Gemini streamGenerateContent), opencode (chat completions, streamed) and mini-swe-agent
(chat completions through litellm). Claude Code has tests/integration/test_agent_cli_sshd.py.

Each CLI passes a two-tool task on every host with its model held (the provider sees the reference's
requests only) and the key never on a host; a CLI pointed at an API the suite did not declare ends as
``error`` naming the API, and the run exits non-zero, not valid; a host-coupled task of mini-swe-agent
is found and explained. Few requests per CLI: one run each.
"""

from __future__ import annotations

import json
import secrets
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent_runner.presets import GEMINI_BUILTIN_SKILLS, PRESETS
from orchestrator.commands.explain import ExplainRequest, explain
from orchestrator.commands.replay import ReplayRequest, replay
from orchestrator.store.jsonl import read_jsonl
from tests.integration.test_agent_cli_sshd import own_roots
from tests.integration.test_exec_sshd import KEY_ENV
from tests.integration.test_openai_sshd import _files_holding
from tests.support.agent_clis import cli
from tests.support.fake_provider import FakeProvider

pytestmark = pytest.mark.sshd

HOSTS = ("box-a", "box-b")
TOOLS = [{"name": "lookup", "required_args": ["q"]}, {"name": "write_file", "required_args": ["path", "content"]}]
INVARIANTS = ["no_absolute_local_paths", "no_home_directory_strings", "no_hostname_in_tool_args"]
#: the model's last answer: two lines, so a final taken from the end of stdout would differ
FINAL = "The answer is 42.\nwrote it"


def _calls(preset: str) -> list[dict[str, Any]]:
    """The two contract tools as the CLI shows them to its model."""
    lookup, write = {"q": "answer"}, {"path": "answer.txt", "content": "42"}
    if preset == "codex":  # MCP tools in the namespace mcp__crosshost
        return [{"name": "lookup", "namespace": "mcp__crosshost", "args": lookup},
                {"name": "write_file", "namespace": "mcp__crosshost", "args": write}]
    prefix = {"gemini-cli": "mcp_crosshost_", "opencode": "crosshost_"}[preset]
    return [{"name": prefix + "lookup", "args": lookup}, {"name": prefix + "write_file", "args": write}]


def _script(preset: str) -> tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]:
    """The provider's script and the trace turns it must give."""
    if preset == "mini-swe-agent":  # its one tool is bash, run by mini-swe-agent itself
        commands = ["cat prompt-note.txt", "echo 42 > answer.txt", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
        return ([{"tool_calls": [{"name": "bash", "args": {"command": c}}]} for c in commands],
                [("bash", {"command": c}) for c in commands])
    first, second = _calls(preset)
    return ([{"tool_calls": [first]}, {"tool_calls": [second]}, {"content": FINAL, "finish": "stop"}],
            [("lookup", {"q": "answer"}), ("write_file", {"path": "answer.txt", "content": "42"})])


def _suite(root: Path, preset: str, base_url: str, api: str | None = None,
           predicate: str = 'test "$(cat answer.txt)" = 42\n') -> Path:
    suite = root / preset
    task = suite / "tasks" / "answer"
    (task / "repo").mkdir(parents=True)
    declared = api or PRESETS[preset].api
    base = base_url if declared == "openai" else base_url.removesuffix("/v1")
    command = [cli(preset), *PRESETS[preset].command[1:]]  # the staged CLI: not on the test hosts' PATH
    (suite / "suite.toml").write_text(
        f'name = "{preset}"\nrepeat = 1\n[agent]\nkind = "exec"\npreset = "{preset}"\n'
        f"command = {json.dumps(command)}\n" + (f'api = "{api}"\n' if api else "")
        + f'model = "m1"\nbase_url = "{base}"\napi_key_env = "{KEY_ENV}"\nmax_requests = 30\n'
        "hold_model = true\n[budget]\nmax_steps = 6\ntimeout_s = 150\n"
    )
    tools = [{"name": "bash", "required_args": ["command"]}] if preset == "mini-swe-agent" else TOOLS
    (suite / "contract.json").write_text(json.dumps({"contract_id": "cli.v1", "tools": tools, "invariants": INVARIANTS}))
    (suite / "tools.json").write_text(json.dumps({"allow": [], "deny": []}))
    (task / "task.toml").write_text('[fixtures]\nlookup = "the answer is 42"\n')
    (task / "prompt.md").write_text("--help: look up the answer and write it to answer.txt.\n")
    (task / "repo" / "prompt-note.txt").write_text("the answer is 42\n")
    (task / "repo" / "run_tests.sh").write_text(predicate)
    return suite


@pytest.fixture
def roots(sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    key = "sk-it-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    inventory, workspace_root = own_roots(sshd_hosts.fleet, tmp_path / "hosts.toml", HOSTS)
    yield key, inventory
    shutil.rmtree(workspace_root, ignore_errors=True)


@pytest.mark.parametrize("preset", ["codex", "gemini-cli", "opencode", "mini-swe-agent"])
def test_each_cli_passes_a_two_tool_task_on_every_host_held_with_the_key_at_home(
    preset: str, roots: Any, sshd_hosts: Any, tmp_path: Path
) -> None:
    key, inventory = roots
    script, turns = _script(preset)
    with FakeProvider(script=script, key=key) as provider:
        suite = _suite(tmp_path, preset, provider.base_url)
        out = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs"))
    run_dir = out.run_dir.path
    rows = read_jsonl(run_dir / "results.jsonl")
    assert sorted((r["env"], r["verdict"]) for r in rows) == [
        ("box-a", "pass"), ("box-b", "pass"), ("local", "pass")], [r.get("why") for r in rows]  # fmt: skip
    # held: the provider answered the reference's requests only, each with the real key
    paths = {"codex": {"/v1/responses"}, "gemini-cli": {"/v1beta/models/m1:streamGenerateContent"}}
    assert {r.path for r in provider.requests} == paths.get(preset, {"/v1/chat/completions"})
    # every follower's request answered from the reference's record (else: where it diverged)
    hold = json.loads((run_dir / "model_hold.json").read_text())
    # the divergences whole (a string: pytest would cut a dict's repr), with both requests' texts
    assert hold["held"] == {h: {"answer.0": len(script)} for h in HOSTS}, json.dumps(hold["divergences"], indent=1)
    # one request per scripted turn; a CLI that resent a request (its own retry, as under heavy load)
    # sent the same body again, which the provider answers alike: counted once
    bodies = {json.dumps(r.body, sort_keys=True) for r in provider.requests}
    assert len(bodies) == len(script), [r.path for r in provider.requests]
    if preset == "gemini-cli":
        # the CLI's built-in skills, which its prompt would list in the order its file walk finishes,
        # are the ones the preset turns off, and no request names any of them
        shipped = Path(cli("gemini-cli")).parent / "builtin"
        assert sorted(p.name for p in shipped.iterdir()) == sorted(GEMINI_BUILTIN_SKILLS)
        assert not [n for n in GEMINI_BUILTIN_SKILLS for b in bodies if n in b]
    assert {r.headers.get("x-goog-api-key") or r.headers.get("authorization") for r in provider.requests} == {
        key if preset == "gemini-cli" else f"Bearer {key}"}
    for host in ("local", *HOSTS):
        trace = read_jsonl(run_dir / "hosts" / host / "traces" / "answer.0.jsonl")
        assert [(t["tool"], t["args"]) for t in trace if t.get("type") == "turn"] == turns, host
        finish = trace[-1]
        assert finish["reason"] == "stop" and finish["findings"] == [], (host, finish)
        if preset != "mini-swe-agent":
            assert finish["final"] == FINAL, (host, finish["final"])  # the model's last answer, whole
    for host in HOSTS:
        for sub in ("root", "tmp", "opt"):
            assert _files_holding(sshd_hosts.fleet.hosts[host].dir / sub, key.encode()) == [], (host, sub)
    assert _files_holding(run_dir, key.encode()) == []
    assert out.exit_code == 0


class TestARefusalAndAnExplanation:
    """A class of their own: pytest-xdist's ``--dist loadscope`` schedules a class apart from its
    module's functions, so these two (about 60 s) run on another worker than the four CLIs (about
    105 s), not after them on the same one."""

    def test_a_cli_pointed_at_an_api_the_suite_did_not_declare_is_the_runs_error(
        self, roots: Any, tmp_path: Path
    ) -> None:
        """Codex speaks only OpenAI Responses; a suite that says api = "anthropic" gets no answer for it:
        every host's attempt is an error that names the API and the fix, the run is not valid."""
        key, inventory = roots
        script, _ = _script("codex")
        with FakeProvider(script=script, key=key) as provider:
            suite = _suite(tmp_path, "codex", provider.base_url, api="anthropic")
            out = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs"))
        run_dir = out.run_dir.path
        assert provider.requests == []
        rows = read_jsonl(run_dir / "results.jsonl")
        assert {r["verdict"] for r in rows} == {"error"} and len(rows) == 3
        for row in rows:
            assert "/v1/responses (OpenAI Responses)" in row["why"] and "api is 'anthropic'" in row["why"], row["why"]
        calls = read_jsonl(run_dir / "hosts" / "box-a" / "model_calls.jsonl")
        assert calls and {(c["path"], c["error"]) for c in calls} == {("/v1/responses", "crosshost_refused")}
        assert out.exit_code != 0
        report = json.loads((run_dir / "report.json").read_text())
        assert report["valid"] is False

    def test_mini_swe_agent_host_coupled_task_is_found_and_explained_by_the_opt_file_it_looked_up(
        self, roots: Any, sshd_hosts: Any, tmp_path: Path
    ) -> None:
        """mini-swe-agent checks a feature flag under /opt that only box-b has: the run finds the flip and
        explain names the flag file the agent looked up, among the thousands of paths its Python and
        litellm read when they start (those rank last, and are the ones dropped past the cap, said so)."""
        key, _ = roots
        inventory, workspace_root = own_roots(sshd_hosts.fleet, tmp_path / "one.toml", ("box-b",))
        top = f"crosshost-cli-{secrets.token_hex(3)}"
        flag = f"/opt/{top}/feature.flag"
        on_box_b = sshd_hosts.fleet.hosts["box-b"].dir / "opt" / top
        on_box_b.mkdir(parents=True)
        (on_box_b / "feature.flag").write_text("on\n")
        commands = [f"if test -f {flag}; then echo on; else echo off; fi > answer.txt",
                    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
        script = [{"tool_calls": [{"name": "bash", "args": {"command": c}}]} for c in commands]
        try:
            with FakeProvider(script=script, key=key) as provider:
                suite = _suite(tmp_path, "mini-swe-agent", provider.base_url, predicate='test "$(cat answer.txt)" = off\n')
                run = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs"))
                rows = read_jsonl(run.run_dir.path / "results.jsonl")
                assert sorted((r["env"], r["verdict"]) for r in rows) == [("box-b", "fail"), ("local", "pass")], rows
                assert run.report is not None and [t.flip for t in run.report.tasks] == [True]
                out = explain(ExplainRequest(run_dir=run.run_dir.path, inventory_path=inventory))
            assert out.exit_code == 0 and not out.errors, out.errors
            [entry] = out.record.tasks
            assert flag in [p.path for p in entry.paths], ([p.path for p in entry.paths][:8], entry.not_collected)
            evidence = next(p for p in entry.paths if p.path == flag)
            assert evidence.by == ["agent"] and evidence.state["local"] == "absent", evidence
            assert entry.paths[0].path in (flag, f"/opt/{top}"), [p.path for p in entry.paths][:5]
            # what was cut is said, with where: the agent's interpreter and library files, not the flag
            cuts = [n for n in entry.not_collected if n.startswith("file evidence cut")]
            assert all(flag not in n for n in cuts), cuts
            record = json.loads((run.run_dir.path / "explain.json").read_text())
            assert [t["not_collected"] for t in record["tasks"]] == [entry.not_collected]
        finally:
            shutil.rmtree(on_box_b, ignore_errors=True)
            shutil.rmtree(workspace_root, ignore_errors=True)
