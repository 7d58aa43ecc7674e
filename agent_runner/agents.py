"""Agents and their registry (kind -> factory).

An agent is driven by the runner's loop (``loop.py``), never the other way round: the runner asks
``next_action(observation, timeout_s)`` and enforces every budget itself. A factory takes the
``AgentSpec`` (the suite's ``[agent]`` merged with the task's) and returns an ``Agent``.

Plugging in a kind: ``register("openai", factory)`` from ``agent_runner/openai_agent.py`` (``exec``
from ``exec_agent.py``); this module imports those files when a kind it does not know is asked for,
so a run of built-in kinds never pays for their imports. Without the file ``openai`` is refused with
a clear message.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Callable, Dict, List, Optional, TypedDict

from .checker import ContractTool
from .errors import InputError
from .jsonfile import JSONObject, JSONValue
from .model_records import AgentFinish, CallRecord
from .recordclass import dataclass, field
from .sandbox import NONE, Sandbox, Started
from .suite import AgentSpec, Task

MAX_LINE_BYTES = 1024 * 1024  # one protocol message from a command agent


class AgentFailed(Exception):
    """The agent crashed or broke the protocol: the attempt finishes with ``agent_error``."""


class AgentInfraError(AgentFailed):
    """Not the agent's fault (e.g. the model provider is down): ``agent_error`` with verdict ``error``."""


class AgentTimeout(Exception):
    """The agent did not answer within the time left: the attempt finishes with ``timeout``."""


class AgentStopped(Exception):
    """A budget kept outside the runner (the proxy's model caps) stopped the agent; ``reason`` is the
    finish reason (``budget_model``), judged like any other budget stop."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class Action:
    """What an agent does next: call a tool, or answer and stop."""

    kind: str  # "tool_call" or "final"
    name: str = ""
    #: the call's arguments: an object, unless a command agent sent something else (the tool refuses it)
    args: JSONValue = field(default_factory=dict)
    content: str = ""
    finish: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: Optional[CallRecord] = None  # the model request behind this action (openai), for the trace


@dataclass
class Observation:
    """What a tool call gave the agent back (its error, if it failed)."""

    content: str
    error: Optional[str] = None


@dataclass
class AgentContext:
    """What an agent of an attempt is given: its task, prompt, tools and workspace."""

    task: Task
    prompt: str
    tools: List[ContractTool]  # the contract's tool entries
    workspace: Path  # the agent's working directory
    env: Dict[str, str]  # the allowlisted environment (HOME points into the attempt)
    suite_dir: Path
    scratch: Path  # a directory of the attempt outside the workspace (e.g. agent stderr)
    attempt: int = 0
    sandbox: Sandbox = field(default_factory=lambda: Sandbox(NONE))  # where its processes run


class Agent:
    def start(self, ctx: AgentContext) -> None:
        raise NotImplementedError

    def next_action(self, observation: Optional[Observation], timeout_s: float) -> Action:
        """The agent's next move, given the observation of its previous tool call (None at first)."""
        raise NotImplementedError

    def abort(self, reason: str) -> None:
        """Tell the agent the runner stopped it (budget); best effort."""

    def finish_record(self) -> AgentFinish:
        """Extra fields for the attempt's finish record (the openai agent's per-request accounting)."""
        return {}

    def close(self) -> None:
        """Release everything; must not raise and must leave no process behind."""


Factory = Callable[[AgentSpec], Agent]
_REGISTRY: Dict[str, Factory] = {}
_PLUGINS_LOADED = False


def register(kind: str, factory: Factory) -> None:
    _REGISTRY[kind] = factory


def _load_plugins() -> None:
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True
    import importlib.util  # here: a start that needs no plugin never pays for it

    for name in ("exec_agent", "openai_agent"):  # imported when a suite names their kind, never before
        if importlib.util.find_spec(f"{__package__}.{name}") is not None:
            importlib.import_module(f"{__package__}.{name}")


def check_available(kind: str, where: str = "") -> None:
    """InputError when this runner cannot build agents of ``kind``."""
    if kind not in _REGISTRY:  # a built-in kind needs no plugin (openai's urllib costs ~15 ms a start)
        _load_plugins()
    if kind not in _REGISTRY:
        prefix = f"{where}: " if where else ""
        if kind == "openai":
            raise InputError(f"{prefix}agent kind 'openai' is not available in this runner yet; "
                             f"use kind = \"scripted\", \"command\" or \"none\"")
        raise InputError(f"{prefix}unknown agent kind {kind!r} (available: {', '.join(sorted(_REGISTRY))})")


def make_agent(spec: AgentSpec) -> Agent:
    check_available(spec.kind)
    return _REGISTRY[spec.kind](spec)


# --- none: the environment probe ---------------------------------------------------------------------


class NoneAgent(Agent):
    """No model at all: the attempt runs the predicate only, which holds the model fixed."""

    def start(self, ctx: AgentContext) -> None:
        pass

    def next_action(self, observation: Optional[Observation], timeout_s: float) -> Action:
        return Action(kind="final", content="", finish="stop")


# --- scripted ----------------------------------------------------------------------------------------


class ScriptedAgent(Agent):
    """Replays script.json: each tool call is one action; a content/finish turn ends the attempt."""

    def __init__(self) -> None:
        self._actions: List[Action] = []

    def start(self, ctx: AgentContext) -> None:
        for turn in ctx.task.script or []:
            for call in turn.get("tool_calls", []):
                self._actions.append(Action(kind="tool_call", name=call["name"], args=dict(call.get("args", {}))))
            if "tool_calls" not in turn:
                self._actions.append(Action(kind="final", content=turn.get("content", ""), finish="stop"))
                break
        self._actions.reverse()

    def next_action(self, observation: Optional[Observation], timeout_s: float) -> Action:
        if not self._actions:
            return Action(kind="final", content="(script ended)", finish="stop")
        return self._actions.pop()


# --- command: the JSON-lines protocol (docs/agent-protocol.md) ---------------------------------------


class ProtocolMessage(TypedDict, total=False):
    """A message the runner sends a command agent (docs/agent-protocol.md): ``task`` (prompt, tools),
    ``observation`` (content, error) or ``abort`` (reason)."""

    type: str
    prompt: str
    tools: List[ContractTool]
    content: str
    error: Optional[str]
    reason: str


def _token_count(message: JSONObject, key: str) -> int:
    """A usage message's count (absent or null: 0); anything but a non-negative integer breaks the protocol."""
    value = message.get(key)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise AgentFailed(f"the agent sent a usage message whose {key} is not a non-negative integer: {value!r}")
    return value


class CommandAgent(Agent):
    def __init__(self, spec: AgentSpec) -> None:
        self.spec = spec
        self._proc: Optional[Started] = None
        import queue  # here: only a command agent reads its lines through one

        self._lines: "queue.Queue[Optional[bytes]]" = queue.Queue()
        self._stderr: Optional[IO[bytes]] = None
        self._stderr_path: Optional[Path] = None
        self._tokens = [0, 0]

    def start(self, ctx: AgentContext) -> None:
        argv = [a.replace("{suite}", str(ctx.suite_dir)) for a in self.spec.command or []]
        self._stderr_path = ctx.scratch / "agent.stderr"
        self._stderr = open(self._stderr_path, "wb")  # noqa: SIM115 - closed in close()
        missing = ctx.sandbox.cannot_start(argv[0], str(ctx.workspace), ctx.env) if argv else None
        if missing:
            raise AgentFailed(f"cannot start the agent {argv[0]!r}: {missing}")
        try:
            self._proc = ctx.sandbox.popen(argv, cwd=str(ctx.workspace), env=ctx.env, stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=self._stderr)
        except OSError as exc:
            raise AgentFailed(f"cannot start the agent {argv[0]!r}: {exc.strerror or exc}") from exc
        threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True).start()
        self._send({"type": "task", "prompt": ctx.prompt, "tools": ctx.tools})

    def _read(self, stream: Optional[IO[bytes]]) -> None:
        if stream is None:
            self._lines.put(None)
            return
        try:
            while True:
                line = stream.readline(MAX_LINE_BYTES)
                if not line:
                    break
                self._lines.put(line)
        except (OSError, ValueError):
            pass
        self._lines.put(None)

    def _send(self, message: ProtocolMessage) -> None:
        if self._proc is None or self._proc.stdin is None:
            raise AgentFailed("the agent is not running")
        try:
            self._proc.stdin.write((json.dumps(message) + "\n").encode("utf-8"))
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise AgentFailed(f"the agent stopped reading its input{self._exit_note()}") from None

    def _exit_note(self) -> str:
        code = self._proc.poll() if self._proc else None
        tail = ""
        if self._stderr_path is not None and self._stderr_path.exists():
            if self._stderr is not None:
                self._stderr.flush()
            data = self._stderr_path.read_bytes()[-400:].decode("utf-8", "replace").strip()
            tail = f"; stderr: {data.splitlines()[-1]}" if data else ""
        return (f" (exit {code})" if code is not None else "") + tail

    def next_action(self, observation: Optional[Observation], timeout_s: float) -> Action:
        import queue  # loaded by __init__ already

        if observation is not None:
            self._send({"type": "observation", "content": observation.content, "error": observation.error})
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AgentTimeout("the agent did not answer in time")
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                raise AgentTimeout("the agent did not answer in time") from None
            if line is None:
                if self._proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self._proc.wait(timeout=1)
                raise AgentFailed(f"the agent ended without a final message{self._exit_note()}")
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                raise AgentFailed(f"the agent wrote a line that is not JSON: {line[:120]!r}") from None
            if not isinstance(message, dict):
                raise AgentFailed(f"the agent wrote a JSON {type(message).__name__}, not a message object")
            kind = message.get("type")
            if kind == "usage":
                self._tokens[0] += _token_count(message, "prompt_tokens")
                self._tokens[1] += _token_count(message, "completion_tokens")
                continue
            prompt_tokens, completion_tokens = self._tokens
            self._tokens = [0, 0]
            if kind == "tool_call":
                name, args = message.get("name"), message.get("args", {})
                if not isinstance(name, str) or not name:
                    raise AgentFailed("the agent sent a tool_call without a 'name'")
                return Action(kind="tool_call", name=name, args=args if isinstance(args, dict) else args,
                              prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
            if kind == "final":
                content = message.get("content", "")
                return Action(kind="final", content=content if isinstance(content, str) else json.dumps(content),
                              finish="stop", prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
            raise AgentFailed(f"the agent sent an unknown message type {kind!r}")

    def abort(self, reason: str) -> None:
        with contextlib.suppress(AgentFailed):
            self._send({"type": "abort", "reason": reason})

    def close(self) -> None:
        proc = self._proc
        if proc is not None:
            for stream in (proc.stdin,):
                try:
                    if stream is not None:
                        stream.close()
                except OSError:
                    pass
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.5)
            proc.kill_group()  # the agent's children die with it (its wait killed them, had it ended)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if proc.stdout is not None:
                proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()


register("none", lambda spec: NoneAgent())
register("scripted", lambda spec: ScriptedAgent())
register("command", CommandAgent)
