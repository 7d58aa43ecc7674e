"""agent.kind = "exec": any program that calls the model itself (an SDK agent, an agent CLI).

The runner starts ``command`` in the attempt's workspace, with the attempt's allowlisted environment
(disposable HOME and TMPDIR) plus the variables its SDK reads, pointing at the controller's model proxy
for this attempt (``<proxy>/attempt/<task>.<attempt>``) with the attempt's own placeholder as the API
key (``wire.attempt_token``: it opens this attempt's record on its host's proxy and nothing else):

- ``api = "openai"``: ``OPENAI_BASE_URL`` (``.../v1``) and ``OPENAI_API_KEY``;
- ``api = "anthropic"``: ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY``;
- ``api = "gemini"``: ``GOOGLE_GEMINI_BASE_URL``, ``GEMINI_API_KEY`` and ``GOOGLE_API_KEY``;
- both: ``CROSSHOST_MODEL`` (the suite's model), ``CROSSHOST_PROMPT_FILE`` and a short
  ``XDG_RUNTIME_DIR`` of its own for its sockets.

The program runs its own tools; the runner keeps the budget (``timeout_s``; ``max_bytes`` of its
stdout and stderr) and, once it has exited, asks the proxy for the trace turns it built from the
exchanges. A cap the proxy enforced is the finish reason ``budget_model``; a provider failure is an
``error`` verdict, never the agent's ``fail``.

Standard library only, Python 3.9 syntax: this travels in the runner zipapp.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

from .agents import Agent, AgentFailed, register
from .capped import death
from .jsonfile import JSONObject, JSONValue
from .loop import MAX_FINAL_CHARS, LoopOutcome
from .model_records import ModelUsage, call_record_of
from .pins import runner_home
from .presets import PRESETS, McpServerConfig
from .sandbox import NONE, Sandbox, reachable_by_others
from .suite import AgentSpec, Task
from .trace import TraceWriter
from .wire import (
    API_BASE_PATH,
    ATTEMPT_PATH,
    EXEC_PREFIX,
    MODEL_PASS_ENV,
    MODEL_URL_ENV,
    TURNS_PATH,
    attempt_token,
    proxy_root,
)

MCP_CONFIG = ".mcp.json"
#: the MCP server's name in ``.mcp.json``; agent CLIs show its tools to the model as
#: ``mcp__crosshost__<tool>`` (Claude Code; Codex, as the namespace ``mcp__crosshost``),
#: ``mcp_crosshost_<tool>`` (Gemini CLI), ``crosshost_<tool>`` (opencode) or ``crosshost__<tool>``
MCP_SERVER = "crosshost"
_MCP_PREFIXES = (f"mcp__{MCP_SERVER}__", f"{MCP_SERVER}__", f"mcp_{MCP_SERVER}_", f"{MCP_SERVER}_")
_PLACEHOLDER = re.compile(r"\{(prompt|prompt_file|workspace|suite|mcp_config|model)\}")
_TAIL = 2000  # of the agent's stderr kept in the trace when it fails: the cause is rarely the last line


class _DrivenByRunner(Agent):
    """Registered so ``exec`` is a known kind; the runner drives it with ``run_exec``, not the loop."""

    def start(self, ctx: Any) -> None:
        raise AgentFailed("an exec agent is driven by agent_runner.exec_agent.run_exec")


register("exec", lambda spec: _DrivenByRunner())


def attempt_key(task: Task, attempt: int) -> str:
    return f"{task.id}.{attempt}"


def sdk_env(spec: AgentSpec, base: str, token: str) -> Dict[str, str]:
    """The variables an exec agent's SDK reads, for a proxy base of this attempt."""
    model = str(spec.options.get("model", ""))
    if spec.options.get("api") == "anthropic":
        return {"ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": token, "CROSSHOST_MODEL": model}
    if spec.options.get("api") == "gemini":  # the Google GenAI SDKs append /v1beta themselves
        return {"GOOGLE_GEMINI_BASE_URL": base, "GEMINI_API_KEY": token, "GOOGLE_API_KEY": token,
                "CROSSHOST_MODEL": model}
    return {"OPENAI_BASE_URL": base + API_BASE_PATH, "OPENAI_API_KEY": token, "CROSSHOST_MODEL": model}


def argv_of(spec: AgentSpec, prompt: str, prompt_file: Path, workspace: Path, suite_dir: Path) -> List[str]:
    """``command`` with its placeholders replaced, in one pass (a prompt that names a placeholder
    keeps it as text)."""
    values = {"prompt": prompt, "prompt_file": str(prompt_file), "workspace": str(workspace),
              "suite": str(suite_dir), "mcp_config": str(workspace / MCP_CONFIG),
              "model": str(spec.options.get("model", ""))}
    return [_PLACEHOLDER.sub(lambda m: values[m.group(1)], arg) for arg in spec.command or []]


def mcp_server(task: Task, suite_dir: Path, work: Path, env: Dict[str, str], turns: Path) -> McpServerConfig:
    """This runner's ``mcp`` command serving the task's contract tools, with the attempt's allowlisted
    environment and nothing else (``command``, ``args``, ``env``)."""
    root = runner_home()  # the zipapp, its compiled copy, or the directory holding agent_runner
    args = ["-m", "agent_runner", "mcp", "--suite", str(suite_dir), "--task", task.id, "--workspace", str(work),
            "--turns", str(turns), "--env-keys", ",".join(sorted(env))]
    return {"type": "stdio", "command": _python_for_others(env), "args": args, "env": {**env, "PYTHONPATH": root}}


def write_mcp_config(path: Path, server: McpServerConfig) -> None:
    """``.mcp.json`` (the layout agent CLIs read) with the one server ``crosshost``."""
    path.write_text(json.dumps({"mcpServers": {MCP_SERVER: server}}, indent=2) + "\n", encoding="utf-8")


def _python_for_others(env: Dict[str, str]) -> str:
    """A Python the attempt's own uid can run: this runner's, unless it lives where that uid cannot
    pass (a pyenv under /root), then the first ``python3`` of the attempt's PATH that it can."""
    on_path = [os.path.join(d, "python3") for d in env.get("PATH", os.defpath).split(os.pathsep) if d]
    for candidate in (sys.executable, *on_path):
        real = os.path.realpath(candidate)
        if os.access(real, os.X_OK) and reachable_by_others(real) and os.stat(real).st_mode & 0o001:
            return candidate
    return sys.executable


def contract_name(tool: str) -> str:
    """The contract's name of a tool the model asked for: an agent CLI shows the MCP server's tool
    ``lookup`` to its model as ``mcp__crosshost__lookup``; the trace and the contract check use ``lookup``."""
    for prefix in _MCP_PREFIXES:
        if tool.startswith(prefix) and len(tool) > len(prefix):
            return tool[len(prefix):]
    return tool


def merge_mcp_turns(turns: JSONValue, path: Path) -> List[JSONObject]:
    """The proxy's turns with the MCP server's calls (``mcp_server.McpTurn``): a call the model asked
    for (same tool, same arguments) takes the MCP result as its observation; any other MCP call is a
    turn of its own. Both are read as the JSON they are, each field narrowed where it is read."""
    merged: List[JSONObject] = [{**t, "tool": contract_name(str(t.get("tool", "")))}
                                for t in (turns if isinstance(turns, list) else []) if isinstance(t, dict)]
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return merged
    used: set = set()
    for line in lines:
        try:
            call: JSONValue = json.loads(line)
        except ValueError:
            continue
        if not isinstance(call, dict):
            continue
        match = next((i for i, t in enumerate(merged) if i not in used and t.get("tool") == call.get("tool")
                      and t.get("args") == call.get("args")), None)
        if match is None:
            merged.append({**call, "prompt_tokens": 0, "completion_tokens": 0})
            used.add(len(merged) - 1)
        else:
            merged[match].update(observation=call.get("observation"), error=call.get("error"))
            used.add(match)
    return merged


def _runtime_dir(box: Sandbox) -> Optional[str]:
    """A short ``XDG_RUNTIME_DIR`` of the attempt's own, removed when the agent has exited: a Unix
    socket's path must fit in 108 bytes, and under the attempt's deep TMPDIR it may not, so an agent
    would put its sockets into /tmp itself and leave them (Claude Code: /tmp/cc-socks-<uid>)."""
    try:
        path = tempfile.mkdtemp(prefix="crosshost-rt-", dir="/tmp")
    except OSError:
        return None
    os.chmod(path, 0o700)
    box.give(path)
    return path


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()[-_TAIL:].decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return data


def _last_line(text: str) -> str:
    return text.splitlines()[-1] if text else ""


def model_record(spec: AgentSpec, seen: JSONObject) -> ModelUsage:
    """The finish record's ``model``, as the built-in agent writes it: the pinned settings (the model
    and the wire format), requests, retries, tokens and each request's record from the proxy."""
    found = seen.get("calls")
    calls = [c for c in (call_record_of(v) for v in found) if c is not None] if isinstance(found, list) else []
    model, api = spec.options.get("model"), spec.options.get("api", "openai")
    return {"settings": {"model": model if isinstance(model, str) else None, "api": str(api)},
            "requests": _count(seen.get("requests")), "retries": sum(c.get("retries", 0) for c in calls),
            "prompt_tokens": _count(seen.get("prompt_tokens")),
            "completion_tokens": _count(seen.get("completion_tokens")), "calls": calls}


def _count(value: JSONValue) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _ask_proxy(root: str, path: str, token: str, body: Dict[str, str], timeout_s: float) -> JSONValue:
    request = urllib.request.Request(root + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - the proxy on loopback
        return json.loads(resp.read())


def fetch_turns(root: str, token: str, key: str, timeout_s: float = 30.0) -> JSONObject:
    """The proxy's record of the attempt's turns (``TURNS_PATH``), read as the JSON it is: each field is
    narrowed where it is read."""
    answer = _ask_proxy(root, TURNS_PATH, token, {"attempt": key}, timeout_s)
    if not isinstance(answer, dict) or not isinstance(answer.get("turns"), list):
        raise ValueError("the model proxy's turns answer has no 'turns' list")
    return answer


def run_exec(task: Task, attempt: int, work: Path, env: Dict[str, str], scratch: Path, suite_dir: Path,
             writer: TraceWriter, deadline: float, box: Optional[Sandbox] = None) -> LoopOutcome:
    """Run one exec attempt to its end; write the turns the proxy saw; return the loop's outcome."""
    url, secret = os.environ.get(MODEL_URL_ENV, ""), os.environ.get(MODEL_PASS_ENV, "")
    if not url or not secret:
        why = f"no model proxy for an exec agent ({MODEL_URL_ENV} and {MODEL_PASS_ENV} unset; crosshost replay sets them)"
        return LoopOutcome(reason="agent_error", final=why, infra_error=why)
    key = attempt_key(task, attempt)
    token = attempt_token(secret, key)  # this attempt's own: it opens no other attempt's record
    root = proxy_root(url)
    base = root + EXEC_PREFIX + urllib.parse.quote(key, safe="")
    box = box or Sandbox(NONE)
    # the attempt's TMPDIR: outside the workspace, and readable by the attempt's own uid
    own = Path(env.get("TMPDIR") or str(scratch))
    prompt_file = own / "crosshost-prompt.md"
    prompt_file.write_text(task.prompt, encoding="utf-8")
    agent_env = dict(env)
    agent_env.update(sdk_env(task.agent, base, token))
    agent_env["CROSSHOST_PROMPT_FILE"] = str(prompt_file)
    argv = argv_of(task.agent, task.prompt, prompt_file, work, suite_dir)
    mcp_turns = own / "crosshost-mcp-turns.jsonl"  # written by the MCP server, as the attempt's uid
    server = mcp_server(task, suite_dir, work, env, mcp_turns)
    if any("{mcp_config}" in a for a in task.agent.command or []):
        write_mcp_config(work / MCP_CONFIG, server)
    preset = PRESETS.get(str(task.agent.options.get("preset") or ""))
    if preset is not None and agent_env.get("HOME"):
        # the CLI's own configuration, in the attempt's disposable HOME, owned by the attempt's uid
        agent_env.update(preset.env)
        agent_env.update(preset.configure(Path(agent_env["HOME"]), base, token, server,
                                          str(task.agent.options.get("model", ""))))
        box.give(agent_env["HOME"])
    try:  # the attempt's directory (workspace, HOME, TMPDIR): a path of this host's own
        _ask_proxy(root, ATTEMPT_PATH, token, {"attempt": key, "root": str(work.parent)}, 30.0)
    except (OSError, ValueError, urllib.error.URLError) as exc:
        why = f"could not reach the model proxy for the exec agent: {exc}"
        return LoopOutcome(reason="agent_error", final=why, infra_error=why)
    stdout_path, stderr_path = scratch / "agent.stdout", scratch / "agent.stderr"
    reason, final = "stop", ""
    runtime = _runtime_dir(box)
    if runtime is not None:
        agent_env["XDG_RUNTIME_DIR"] = runtime
    try:
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            missing = box.cannot_start(argv[0], str(work), agent_env)
            if missing:
                return LoopOutcome(reason="agent_error", final=f"cannot start the agent {argv[0]!r}: {missing}")
            # in a network namespace of its own, the agent reaches the proxy (and nothing else)
            # through a forwarder its sandbox's init keeps on the same loopback port
            with box.reaching(root, str(scratch)) as agent_box:
                try:
                    proc = agent_box.popen(argv, cwd=str(work), env=agent_env, stdin=subprocess.DEVNULL,
                                           stdout=out, stderr=err)
                except OSError as exc:
                    return LoopOutcome(reason="agent_error",
                                       final=f"cannot start the agent {argv[0]!r}: {exc.strerror or exc}")
                try:
                    while proc.poll() is None:
                        if time.monotonic() >= deadline:
                            reason, final = "timeout", "the agent did not finish in time"
                            break
                        if out.tell() + err.tell() > task.budget.max_bytes:
                            reason = "budget_bytes"
                            final = f"the agent wrote more than max_bytes = {task.budget.max_bytes}"
                            break
                        time.sleep(0.05)
                finally:
                    proc.kill_group()  # the agent's children die with it (its wait killed them, had it ended)
                    proc.wait()
    finally:
        if runtime is not None:
            shutil.rmtree(runtime, ignore_errors=True)
    try:
        seen = fetch_turns(root, token, key)
    except (OSError, ValueError, urllib.error.URLError) as exc:
        why = f"could not read the exec agent's turns from the model proxy: {exc}"
        return LoopOutcome(reason="agent_error", final=why, infra_error=why)
    outcome = LoopOutcome(reason=reason, final=final)
    for turn in merge_mcp_turns(seen["turns"], mcp_turns):
        if len(outcome.turns) >= task.budget.max_steps:
            outcome.reason = "budget_steps"
            break
        observation, args, error = turn.get("observation"), turn.get("args"), turn.get("error")
        outcome.turns.append(writer.turn(
            tool=str(turn.get("tool", "")), args=args if isinstance(args, dict) else {},
            observation=observation if isinstance(observation, str) else "",
            error=None if error is None else str(error),
            prompt_tokens=_count(turn.get("prompt_tokens")), completion_tokens=_count(turn.get("completion_tokens")),
            model=call_record_of(turn.get("model"))))
    outcome.agent_record = {"model": model_record(task.agent, seen)}
    if seen.get("error"):
        outcome.reason, outcome.final, outcome.infra_error = "agent_error", str(seen["error"]), str(seen["error"])
    elif seen.get("stopped"):
        outcome.reason, outcome.final = str(seen["stopped"]), f"the model proxy stopped the agent: {seen['stopped']}"
    elif reason == "stop" and proc.returncode != 0:
        note = _tail(stderr_path)
        outcome.reason = "agent_error"
        ended = death(proc.returncode, proc.oom_killed()) if proc.returncode < 0 else f"exited {proc.returncode}"
        outcome.final = (f"the agent {ended}" + (f"; stderr: {note}" if note else ""))[:MAX_FINAL_CHARS]
    elif reason == "stop":  # what the model said last, else the end of what the agent printed
        outcome.final = str(seen.get("text") or "") or _last_line(_tail(stdout_path))
    return outcome
