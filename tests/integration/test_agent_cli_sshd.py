"""An agent CLI that people run, from the package registry, driving a task end to end through the
model proxy on the local host and two real sshd hosts: Claude Code (``@anthropic-ai/claude-code``,
pinned in tools/agent-clis, installed into .agent-clis/ by ``make setup``).

Claude Code calls the Anthropic messages API (streamed, ``/v1/messages?beta=true``) through the proxy
with the run's placeholder as its key, and takes the contract's tools from the runner's MCP server
(``--mcp-config {mcp_config}``, its built-in tools off with ``--tools=``). The provider is
tests/support/fake_provider.py, scripted to ask for the contract tools the way Claude Code shows them
to its model (``mcp__crosshost__<tool>``), then to finish.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.commands.otel import read_otlp_json_lines
from orchestrator.commands.replay import ReplayRequest, replay
from orchestrator.hosts.inventory import load_inventory
from orchestrator.hosts.transport import open_host
from orchestrator.store.jsonl import read_jsonl
from tests.integration.test_exec_sshd import KEY_ENV
from tests.integration.test_openai_sshd import (
    CONTRACT,
    ProcessWatch,
    _files_holding,
    _read,
    _uts,
    process_view,
)
from tests.orchestrator.test_otel import flatten
from tests.support.fake_provider import FakeProvider
from tests.support.shared import stage

pytestmark = pytest.mark.sshd

REPO = Path(__file__).resolve().parents[2]
PINS = REPO / "tools" / "agent-clis" / "package.json"
INSTALLED = REPO / ".agent-clis" / "node_modules" / ".bin" / "claude"
PACKAGE = "@anthropic-ai/claude-code"

# Claude Code names the MCP server's tools mcp__<server>__<tool>; the runner's server is "crosshost".
SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "mcp__crosshost__lookup", "args": {"q": "answer"}}]},
    {"tool_calls": [{"name": "mcp__crosshost__write_file", "args": {"path": "answer.txt", "content": "42"}}]},
    {"content": "wrote it", "finish": "stop"},
]


def claude_command(claude: str, model: str) -> list[str]:
    """The suite's ``command`` for Claude Code (the README's snippet): one prompt, no terminal, only
    the contract's tools over MCP, no calls but the model's (no internet on a test host); the prompt
    after ``--``, so a prompt that starts with a dash is not read as an option."""
    return [
        "/usr/bin/env", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_AUTOUPDATER=1",
        claude, "-p", "--model", model,
        "--mcp-config", "{mcp_config}", "--strict-mcp-config", "--tools=", "--allowedTools", "mcp__crosshost",
        "--no-session-persistence", "--output-format", "text", "--", "{prompt}",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def claude_code() -> str:
    """The pinned Claude Code binary where every test host and the attempts' own uid can run it."""
    version = json.loads(PINS.read_text())["dependencies"][PACKAGE]
    if not INSTALLED.exists():
        pytest.fail(f"Claude Code {version} is not installed at {INSTALLED}: run `make setup` "
                    f"(it installs tools/agent-clis into .agent-clis/ with npm)")
    binary = Path(os.path.realpath(INSTALLED))
    said = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60).stdout
    if not said.startswith(version + " "):
        pytest.fail(f"{INSTALLED} says {said.strip()!r}, not the pinned {version}: rerun `make setup`")
    # a copy on /var/tmp: a test host sees neither this machine's /tmp nor /root, where a clone may be
    return str(stage(f"claude-code-{version}", [binary]) / binary.name)


class AgentEnvWatch(ProcessWatch):
    """ProcessWatch, and the API key each running Claude Code process was given."""

    def __init__(self, binary: str, *args: Any) -> None:
        super().__init__(*args)
        self.binary = binary.encode()
        self.agent_keys: set[str] = set()
        self.agent_lock = threading.Lock()

    def __call__(self) -> None:
        super().__call__()
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            seen_now = process_view(pid)
            if seen_now is None or seen_now[0][0] != self.binary:
                continue
            env = dict(v.split(b"=", 1) for v in seen_now[1].split(b"\0") if b"=" in v)
            with self.agent_lock:
                self.agent_keys.add(env.get(b"ANTHROPIC_API_KEY", b"").decode())


def claude_suite(root: Path, claude: str, base_url: str, *, hold: bool) -> Path:
    suite = root / "claude-code"
    task = suite / "tasks" / "answer"
    (task / "repo").mkdir(parents=True)
    (suite / "suite.toml").write_text(
        'name = "claude-code"\nrepeat = 1\n[agent]\nkind = "exec"\npreset = "claude-code"\n'
        f"command = {json.dumps(claude_command(claude, 'm1'))}\n"
        f'api = "anthropic"\nmodel = "m1"\nbase_url = "{base_url.removesuffix("/v1")}"\n'
        f'api_key_env = "{KEY_ENV}"\nmax_requests = 20\nhold_model = {json.dumps(hold)}\n'
        "[budget]\nmax_steps = 6\ntimeout_s = 120\n"
    )
    (suite / "contract.json").write_text(json.dumps(CONTRACT))
    (suite / "tools.json").write_text(json.dumps({"allow": [], "deny": []}))
    (task / "task.toml").write_text('[fixtures]\nlookup = "the answer is 42"\n')
    (task / "prompt.md").write_text("--help: look up the answer and write it to answer.txt.\n")
    (task / "repo" / "run_tests.sh").write_text('test "$(cat answer.txt)" = 42\n')
    return suite


def own_roots(fleet: Any, path: Path, hosts: tuple[str, ...]) -> tuple[Path, str]:
    """An inventory of local and ``hosts``, each with a workspace root of its own (a host's cleanup
    stops whatever names its path). Long enough that a socket under the attempt's TMPDIR would not fit
    in a socket path: Claude Code then uses XDG_RUNTIME_DIR, which the runner gives it and removes."""
    workspace_root = f"/tmp/crosshost-cli-{secrets.token_hex(4)}"
    inventory = fleet.write_inventory(
        path, list(hosts), connect_timeout_s=5, extra_defaults={"workspace_root": workspace_root}
    )
    text = inventory.read_text()
    for name in hosts:
        text = text.replace(f'name = "{name}"\n', f'name = "{name}"\nworkspace_root = "{workspace_root}-{name}"\n')
    inventory.write_text(text)
    return inventory, workspace_root


def test_claude_code_from_npm_passes_a_task_through_the_proxy_on_three_hosts(
    claude_code: str, sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-it-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    fleet = sshd_hosts.fleet
    hosts = ("box-a", "box-b")
    inventory, workspace_root = own_roots(fleet, tmp_path / "hosts.toml", hosts)
    watch = AgentEnvWatch(claude_code, key, {n: _uts(fleet.hosts[n].ns_pid()) or "" for n in hosts}, workspace_root)
    try:
        # not held: every host's Claude Code asks the provider (and the watch sees each one running)
        with FakeProvider(script=SCRIPT, key=key, on_request=watch) as provider:
            suite = claude_suite(tmp_path, claude_code, provider.base_url, hold=False)
            out = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs"))
        run_dir = out.run_dir.path
        rows = read_jsonl(run_dir / "results.jsonl")
        assert sorted((r["env"], r["verdict"]) for r in rows) == [
            ("box-a", "pass"), ("box-b", "pass"), ("local", "pass")
        ], [r.get("why") for r in rows]

        # The real Claude Code asked the model, streamed, and the provider saw the real key every time.
        assert len(provider.requests) == 3 * 3
        assert {r.path for r in provider.requests} == {"/v1/messages"}
        assert {r.headers["x-api-key"] for r in provider.requests} == {key}
        assert {r.body["stream"] for r in provider.requests} == {True}
        asked = [r.body["messages"][0]["content"] for r in provider.requests]
        assert all("--help: look up the answer" in json.dumps(a) for a in asked)  # the prompt, not an option
        # What the model was offered: the contract's tools from the MCP server, none of Claude Code's own.
        offered = {t["name"] for r in provider.requests for t in r.body["tools"]}
        assert {"mcp__crosshost__lookup", "mcp__crosshost__write_file"} <= offered
        assert not offered & {"Bash", "Edit", "Write", "Read"}, offered
        # Claude Code itself held only a placeholder (its attempt's own, one per host); no host process held the key.
        assert len(watch.agent_keys) == 3, watch.agent_keys
        assert all(re.fullmatch(r"crosshost-[0-9a-f]{40}", k) for k in watch.agent_keys), watch.agent_keys
        assert watch.foreign_processes > 0 and watch.offenders == []

        for host in ("local", *hosts):
            trace = read_jsonl(run_dir / "hosts" / host / "traces" / "answer.0.jsonl")
            turns = [t for t in trace if t.get("type") == "turn"]
            # the model's call (mcp__crosshost__lookup) and the MCP server's call (lookup) are one turn
            assert [(t["tool"], t["args"]) for t in turns] == [
                ("lookup", {"q": "answer"}), ("write_file", {"path": "answer.txt", "content": "42"}),
            ], host  # fmt: skip
            obs = read_jsonl(run_dir / "hosts" / host / "traces" / "answer.0.obs.jsonl")
            assert [o["content"] for o in obs] == ["the answer is 42", "wrote 2 bytes"], host
            finish = trace[-1]
            assert finish["reason"] == "stop" and finish["final"] == "wrote it", finish
            assert finish["findings"] == [] and "outside_workspace" not in finish, (host, finish.get("outside_workspace"))
            calls = read_jsonl(run_dir / "hosts" / host / "model_calls.jsonl")
            assert [c["status"] for c in calls] == [200] * 3, host

        # Exported as OpenTelemetry GenAI spans like a model agent: a chat span per request (the provider
        # named by the wire format, tokens), an execute_tool span per call with its arguments.
        spans_file = tmp_path / "spans.jsonl"
        exported = CliRunner().invoke(app, ["export", "otel", str(run_dir), "--file", str(spans_file), "--content"])
        assert exported.exit_code == 0, exported.output
        spans = [s for r in read_otlp_json_lines(spans_file) for s in flatten(r)]
        root = next(s for s in spans if s["name"] == "invoke_agent exec" and s["attrs"]["crosshost.host"] == "box-a")
        mine = [s for s in spans if s["trace"] == root["trace"] and s is not root]
        chats = [s for s in mine if s["attrs"]["gen_ai.operation.name"] == "chat"]
        assert [s["name"] for s in chats] == ["chat m1"] * 3
        assert {s["attrs"]["gen_ai.provider.name"] for s in chats} == {"anthropic"}
        assert sum(s["attrs"]["gen_ai.usage.input_tokens"] for s in chats) == 33
        assert [c["attrs"].get("gen_ai.response.finish_reasons") for c in chats] == [
            ["tool_use"], ["tool_use"], ["end_turn"]]  # fmt: skip
        tools = [(s["attrs"]["gen_ai.tool.name"], json.loads(s["attrs"]["gen_ai.tool.call.arguments"]))
                 for s in mine if s["attrs"]["gen_ai.operation.name"] == "execute_tool"]
        assert tools == [("lookup", {"q": "answer"}), ("write_file", {"path": "answer.txt", "content": "42"})]
        assert root["attrs"]["gen_ai.provider.name"] == "anthropic" and root["attrs"]["gen_ai.request.model"] == "m1"

        # No residue: the run's workspace is gone on every host, no Claude Code process is left, and
        # the key is in no host file and no pulled file.
        for cfg in load_inventory(inventory).hosts:
            host = open_host(cfg)
            try:
                left = host.exec(["sh", "-c", f"ls -A {cfg.workspace_root}/runs 2>/dev/null; true"], 30).stdout
            finally:
                host.close()
            assert left.strip() == "", (cfg.name, left)
        assert not [p for p in os.listdir("/proc") if p.isdigit()
                    and _read(f"/proc/{p}/cmdline").split(b"\0")[0] == claude_code.encode()]
        for host in hosts:
            for sub in ("root", "tmp", "opt"):
                assert _files_holding(fleet.hosts[host].dir / sub, key.encode()) == [], (host, sub)
        assert _files_holding(run_dir, key.encode()) == []
    finally:
        shutil.rmtree(workspace_root, ignore_errors=True)


def test_claude_code_is_held_its_working_directory_set_aside(
    claude_code: str, sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claude Code tells its model its working directory (the attempt's, a path of each host's own)
    and a directory named after it: with that path set aside, every other host gets the reference's
    answers, and the attempts are paired again."""
    key = "sk-it-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    inventory, workspace_root = own_roots(sshd_hosts.fleet, tmp_path / "hosts.toml", ("box-a", "box-b"))
    try:
        with FakeProvider(script=SCRIPT, key=key) as provider:
            suite = claude_suite(tmp_path, claude_code, provider.base_url, hold=True)
            out = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs"))
        run_dir = out.run_dir.path
        rows = read_jsonl(run_dir / "results.jsonl")
        assert sorted((r["env"], r["verdict"]) for r in rows) == [
            ("box-a", "pass"), ("box-b", "pass"), ("local", "pass")
        ], [r.get("why") for r in rows]
        assert len(provider.requests) == 3  # the reference's; the others were answered from its record
        first = json.dumps(provider.requests[0].body)
        assert f"Primary working directory: {workspace_root}/runs/" in first  # local's own path, as sent
        hold = json.loads((run_dir / "model_hold.json").read_text())
        assert hold["held"] == {"box-a": {"answer.0": 3}, "box-b": {"answer.0": 3}}, hold["divergences"]
        [task] = json.loads((run_dir / "report.json").read_text())["tasks"]
        assert task["evidence"] == "held" and task["classification"] == "agree"
        for host in ("box-a", "box-b"):
            trace = read_jsonl(run_dir / "hosts" / host / "traces" / "answer.0.jsonl")
            turns = [t for t in trace if t.get("type") == "turn"]
            assert [(t["tool"], t["args"], t["model"]["held"]) for t in turns] == [
                ("lookup", {"q": "answer"}, True), ("write_file", {"path": "answer.txt", "content": "42"}, True),
            ], host  # fmt: skip
    finally:
        shutil.rmtree(workspace_root, ignore_errors=True)
