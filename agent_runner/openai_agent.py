"""agent.kind = "openai": a chat-completions client that holds no key.

The runner is given only ``CROSSHOST_MODEL_URL`` (``http://127.0.0.1:<port>/v1``): the controller's
``ModelProxy``, reached directly on the controller or through a reverse SSH port forward on a host.
The proxy adds the key, enforces the caps and retries; this module speaks the protocol:

- ``contract_tools`` turns the contract into the ``tools`` parameter (each tool's ``parameters``
  schema, else a built-in tool's schema, else one derived from ``required_args``);
- ``ChatClient.complete`` POSTs ``/chat/completions`` and returns a ``ModelTurn`` (tool calls, usage,
  latency and the proxy's ``X-Crosshost-Call`` record), or raises ``ModelError``;
- ``Conversation`` keeps the messages: the prompt, each assistant turn, one ``tool`` message per call.

``ModelError.reason`` is the trace's finish reason: ``budget_model`` when the proxy's cap is reached
(the agent spent its allowance: judged like any other budget stop), ``agent_error`` with
``verdict_error = True`` when the model could not be reached or answered nonsense (a harness failure,
never the agent's ``fail``).

Standard library only, Python 3.9 syntax: this travels in the runner zipapp.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from email.message import Message
from typing import Dict, List, Optional, Tuple, TypedDict

from .agents import (
    Action,
    Agent,
    AgentContext,
    AgentInfraError,
    AgentStopped,
    AgentTimeout,
    Observation,
    register,
)
from .checker import ContractTool
from .jsonfile import JSONObject, JSONValue, int_or_none, str_or_none
from .model_records import AgentFinish, CallRecord, ModelSettings, TryRecord, try_record_of
from .recordclass import dataclass, field
from .suite import AgentSpec
from .wire import (
    ATTEMPT_HEADER,
    CALL_HEADER,
    CHAT_PATH,
    ERR_BUDGET,
    ERR_DIVERGED,
    FINISH_BUDGET_MODEL,
    FINISH_MODEL_DIVERGED,
    MODEL_PASS_ENV,
    MODEL_URL_ENV,
    attempt_token,
)

FINISH_AGENT_ERROR = "agent_error"
FINISH_TIMEOUT = "timeout"
_MAX_ANSWER_BYTES = 16 * 1024 * 1024



class _FunctionBase(TypedDict):
    name: str
    parameters: JSONObject  # a JSON schema, passed on as the contract gives it


class FunctionSchema(_FunctionBase, total=False):
    description: str


class ToolSchema(TypedDict):
    """One entry of a chat request's ``tools``."""

    type: str  # "function"
    function: FunctionSchema


class ChatMessage(TypedDict, total=False):
    """One message of the conversation: the user's prompt, an assistant turn (its ``tool_calls`` passed
    back as the model wrote them), or a ``tool`` message answering one call."""

    role: str
    content: JSONValue  # a string, or null for an assistant turn that only calls tools
    tool_calls: JSONValue
    tool_call_id: str


class _ChatRequestBase(TypedDict):
    model: str
    messages: List[ChatMessage]


class ChatRequest(_ChatRequestBase, total=False):
    """The body POSTed to ``/chat/completions``."""

    tools: List[ToolSchema]
    temperature: float
    seed: int
    max_tokens: int


# Schemas of the tools the runner provides itself, used when the contract gives no `parameters`.
BUILTIN_PARAMETERS: Dict[str, JSONObject] = {
    "shell": {
        "type": "object",
        "properties": {"argv": {"type": "array", "items": {"type": "string"},
                                "description": "the command and its arguments; no shell is involved"}},
        "required": ["argv"],
    },
    "read_file": {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "a path inside the workspace"}},
        "required": ["path"],
    },
    "write_file": {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "a path inside the workspace"},
                       "content": {"type": "string"}},
        "required": ["path", "content"],
    },
    "list_dir": {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "a directory inside the workspace"}},
        "required": ["path"],
    },
}


class ModelError(Exception):
    """The model could not give a turn. ``reason`` is the finish reason for the trace."""

    def __init__(self, reason: str, message: str, *, verdict_error: bool, call: Optional["ProxyCall"] = None):
        super().__init__(message)
        self.reason = reason
        self.verdict_error = verdict_error
        self.call = call


@dataclass
class OpenAISettings:
    """The sampling settings of suite.toml [agent]; they are part of the pins."""

    model: str
    temperature: Optional[float] = None
    seed: Optional[int] = None
    max_tokens: Optional[int] = None
    timeout_s: float = 300.0

    @classmethod
    def from_agent(cls, agent: JSONObject) -> "OpenAISettings":
        """From ``[agent]``'s options, which the suite validated (a number where a number belongs)."""
        model = agent.get("model")
        if not isinstance(model, str) or not model:
            raise ValueError("[agent] kind = \"openai\" needs model = \"<name>\"")
        temperature, seed, max_tokens = agent.get("temperature"), agent.get("seed"), agent.get("max_tokens")
        timeout = agent.get("request_timeout_s", 300.0)
        return cls(model=model,
                   temperature=temperature if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) else None,
                   seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
                   max_tokens=max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else None,
                   timeout_s=float(timeout) if isinstance(timeout, (int, float)) else 300.0)

    def pins(self) -> ModelSettings:
        return {"model": self.model, "temperature": self.temperature, "seed": self.seed,
                "max_tokens": self.max_tokens}


@dataclass
class ProxyCall:
    """The proxy's record of one request (its ``X-Crosshost-Call`` header), fields of the wrong type
    read as empty."""

    id: Optional[int] = None
    status: Optional[int] = None
    retries: int = 0
    attempts: List[TryRecord] = field(default_factory=list)
    model: Optional[str] = None
    system_fingerprint: Optional[str] = None
    error: Optional[str] = None

    @classmethod
    def from_json(cls, obj: JSONObject) -> "ProxyCall":
        attempts = obj.get("attempts")
        return cls(id=int_or_none(obj.get("id")), status=int_or_none(obj.get("status")), retries=int_or_none(obj.get("retries")) or 0,
                   attempts=[try_record_of(a) for a in attempts if isinstance(a, dict)]
                   if isinstance(attempts, list) else [],
                   model=str_or_none(obj.get("model")), system_fingerprint=str_or_none(obj.get("system_fingerprint")),
                   error=str_or_none(obj.get("error")))

    def record(self, finish_reason: str) -> CallRecord:
        """What a trace turn keeps about an answered request (no prompt, no key)."""
        return {"request": self.id, "status": self.status, "retries": self.retries, "attempts": self.attempts,
                "model": self.model, "system_fingerprint": self.system_fingerprint, "finish_reason": finish_reason}

    def error_record(self, message: str) -> CallRecord:
        """What the finish record keeps about a request the proxy refused or could not answer."""
        return {"request": self.id, "status": self.status, "retries": self.retries, "attempts": self.attempts,
                "error": self.error, "message": message}


@dataclass
class ToolCall:
    """One tool call a model asked for."""

    id: str
    name: str
    args: JSONObject
    args_error: Optional[str] = None  # the model's arguments were not a JSON object


@dataclass
class ModelTurn:
    """One chat completion as the agent loop needs it."""

    message: ChatMessage  # the assistant message, to be appended to the conversation as is
    tool_calls: List[ToolCall]
    content: str
    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: int = 0
    call: Optional[ProxyCall] = None  # the proxy's record: status, attempts, model, fingerprint

    def model_record(self) -> CallRecord:
        """What a trace turn keeps about the request (no prompt, no key)."""
        return (self.call or ProxyCall()).record(self.finish_reason)


def contract_tools(tools: List[ContractTool]) -> List[ToolSchema]:
    """The chat-completions ``tools`` parameter for the contract's tools."""
    out: List[ToolSchema] = []
    for tool in tools:
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            continue
        parameters = tool.get("parameters")
        if not isinstance(parameters, dict) or not parameters:
            parameters = BUILTIN_PARAMETERS.get(name) or _derived_parameters(tool)
        function: FunctionSchema = {"name": name, "parameters": parameters}
        description = tool.get("description")
        if isinstance(description, str) and description:
            function["description"] = description
        out.append({"type": "function", "function": function})
    return out


def _derived_parameters(tool: ContractTool) -> JSONObject:
    required: List[JSONValue] = [a for a in tool.get("required_args", []) if isinstance(a, str)]
    # No type is known for a required arg, so none is claimed; the checker judges the values.
    properties: JSONObject = {str(a): {"description": a} for a in required}
    return {"type": "object", "properties": properties, "required": required}


class ChatClient:
    """POSTs to ``<CROSSHOST_MODEL_URL>/chat/completions``; never sends or holds a key: its attempt's
    placeholder (``attempt_token``) is its bearer token."""

    def __init__(self, url: str, settings: OpenAISettings, attempt_key: Optional[str] = None,
                 token: Optional[str] = None) -> None:
        self.url = url.rstrip("/") + CHAT_PATH
        self.settings = settings
        self.attempt_key = attempt_key  # "<task>.<attempt>": a held model answers by it
        self.token = token

    def request_body(self, messages: List[ChatMessage], tools: List[ToolSchema]) -> ChatRequest:
        body: ChatRequest = {"model": self.settings.model, "messages": messages}
        if tools:
            body["tools"] = tools
        if self.settings.temperature is not None:
            body["temperature"] = self.settings.temperature
        if self.settings.seed is not None:
            body["seed"] = self.settings.seed
        if self.settings.max_tokens is not None:
            body["max_tokens"] = self.settings.max_tokens
        return body

    def complete(self, messages: List[ChatMessage], tools: List[ToolSchema],
                 timeout_s: Optional[float] = None) -> ModelTurn:
        timeout_s = self.settings.timeout_s if timeout_s is None else max(0.1, min(timeout_s, self.settings.timeout_s))
        data = json.dumps(self.request_body(messages, tools)).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self.attempt_key is not None:
            headers[ATTEMPT_HEADER] = self.attempt_key
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url, data=data, method="POST", headers=headers)
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                raw = resp.read(_MAX_ANSWER_BYTES + 1)
                call = _call_header(resp.headers)
        except urllib.error.HTTPError as exc:
            raise _proxy_error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, (socket.timeout, TimeoutError)):
                raise ModelError(FINISH_TIMEOUT, f"no model answer within {timeout_s:.0f} s", verdict_error=False) from None
            raise ModelError(FINISH_AGENT_ERROR, f"model proxy {self.url} unreachable: {reason}",
                             verdict_error=True) from None
        latency_ms = int((time.monotonic() - started) * 1000)
        return parse_completion(raw, latency_ms, call)


def _call_header(headers: Optional["Message[str, str]"]) -> Optional[ProxyCall]:
    value = headers.get(CALL_HEADER) if headers is not None else None
    if not value:
        return None
    try:
        call: JSONValue = json.loads(value)
    except ValueError:
        return None
    return ProxyCall.from_json(call) if isinstance(call, dict) else None


def _proxy_error(exc: urllib.error.HTTPError) -> ModelError:
    call = _call_header(exc.headers)
    try:
        body = json.loads(exc.read(64 * 1024) if exc.fp is not None else b"")
        err = body.get("error") if isinstance(body, dict) else None
    except ValueError:
        err = None
    kind = err.get("type") if isinstance(err, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    text = " ".join(str(message or f"HTTP {exc.code} from the model proxy").split())
    if kind == ERR_BUDGET:
        return ModelError(FINISH_BUDGET_MODEL, text, verdict_error=False, call=call)
    if kind == ERR_DIVERGED:
        return ModelError(FINISH_MODEL_DIVERGED, text, verdict_error=False, call=call)
    return ModelError(FINISH_AGENT_ERROR, text, verdict_error=True, call=call)


def parse_completion(raw: bytes, latency_ms: int = 0, call: Optional[ProxyCall] = None) -> ModelTurn:
    """A chat completion body -> ModelTurn; anything that is not one raises ModelError (harness error)."""
    if len(raw) > _MAX_ANSWER_BYTES:
        raise ModelError(FINISH_AGENT_ERROR, "model answer too large", verdict_error=True, call=call)
    try:
        body: JSONValue = json.loads(raw)
        if not isinstance(body, dict):
            raise TypeError("the answer is not an object")
        choices = body["choices"]
        if not isinstance(choices, list):
            raise TypeError("choices is not a list")
        choice = choices[0]
        if not isinstance(choice, dict):
            raise TypeError("choices[0] is not an object")
        message = choice["message"]
        if not isinstance(message, dict):
            raise TypeError("message is not an object")
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ModelError(FINISH_AGENT_ERROR, f"model answer is not a chat completion ({exc})",
                         verdict_error=True, call=call) from None
    calls: List[ToolCall] = []
    tool_calls = message.get("tool_calls") or []
    for index, item in enumerate(tool_calls if isinstance(tool_calls, list) else []):
        function = item.get("function") if isinstance(item, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(function, dict) or not isinstance(name, str) or not isinstance(item, dict):
            raise ModelError(FINISH_AGENT_ERROR, f"model tool_calls[{index}] has no function name",
                             verdict_error=True, call=call)
        args, error = _parse_args(function.get("arguments"))
        calls.append(ToolCall(id=str(item.get("id") or f"call_{index}"), name=name, args=args, args_error=error))
    found = body.get("usage")
    usage: JSONObject = found if isinstance(found, dict) else {}
    content = message.get("content")
    # Keep only what the protocol needs in the history; providers add fields the next request rejects.
    history: ChatMessage = {"role": "assistant", "content": content}
    if message.get("tool_calls"):
        history["tool_calls"] = message["tool_calls"]
    return ModelTurn(message=history, tool_calls=calls, content=content if isinstance(content, str) else "",
                     finish_reason=str(choice.get("finish_reason") or ""),
                     prompt_tokens=_count(usage.get("prompt_tokens")),
                     completion_tokens=_count(usage.get("completion_tokens")),
                     latency_ms=latency_ms, call=call)


def _parse_args(arguments: JSONValue) -> Tuple[JSONObject, Optional[str]]:
    if isinstance(arguments, dict):
        return arguments, None
    if arguments in (None, ""):
        return {}, None
    if not isinstance(arguments, str):
        return {}, "the model's arguments are not valid JSON"
    try:
        value: JSONValue = json.loads(arguments)
    except ValueError:
        return {}, "the model's arguments are not valid JSON"
    if not isinstance(value, dict):
        return {}, "the model's arguments are not a JSON object"
    return value, None


def _count(value: JSONValue) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


@dataclass
class Conversation:
    """The messages of one attempt: the prompt, then assistant turns and tool results."""

    client: ChatClient
    tools: List[ToolSchema]
    messages: List[ChatMessage] = field(default_factory=list)

    @classmethod
    def start(cls, client: ChatClient, prompt: str, contract: List[ContractTool]) -> "Conversation":
        return cls(client=client, tools=contract_tools(contract), messages=[{"role": "user", "content": prompt}])

    def next_turn(self, timeout_s: Optional[float] = None) -> ModelTurn:
        turn = self.client.complete(self.messages, self.tools, timeout_s)
        self.messages.append(turn.message)
        return turn

    def observe(self, call: ToolCall, content: str) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call.id, "content": content})


class OpenAIAgent(Agent):
    """The runner's agent for ``kind = "openai"``: one model request per turn, one action per tool call.

    A turn with several tool calls becomes several actions (the first carries the turn's tokens and
    request record); their observations go back as ``tool`` messages before the next request.
    """

    def __init__(self, spec: AgentSpec) -> None:
        try:
            self.settings = OpenAISettings.from_agent(spec.options)
        except ValueError as exc:
            raise AgentInfraError(str(exc)) from None
        self._conversation: Optional[Conversation] = None
        self._pending: List[ToolCall] = []
        self._asked: Optional[ToolCall] = None
        self._requests: List[CallRecord] = []
        self._tokens = [0, 0]

    def start(self, ctx: AgentContext) -> None:
        # The runner's own environment (env -i + allowlist), not the attempt's: tools never see it.
        url = os.environ.get(MODEL_URL_ENV) or ctx.env.get(MODEL_URL_ENV)
        if not url:
            raise AgentInfraError(f"{MODEL_URL_ENV} is not set: an openai agent reaches the model only through "
                                  f"the controller's proxy (crosshost replay sets it)")
        key = f"{ctx.task.id}.{ctx.attempt}"
        secret = os.environ.get(MODEL_PASS_ENV) or ctx.env.get(MODEL_PASS_ENV)
        client = ChatClient(url, self.settings, key, attempt_token(secret, key) if secret else None)
        self._conversation = Conversation.start(client, ctx.prompt, ctx.tools)

    def next_action(self, observation: Optional[Observation], timeout_s: float) -> Action:
        conversation = self._conversation
        if conversation is None:
            raise AgentInfraError("the openai agent was not started")
        if self._asked is not None:
            content = observation.content if observation is not None else ""
            if observation is not None and observation.error and not content:
                content = f"error: {observation.error}"
            conversation.observe(self._asked, content)
            self._asked = None
        if self._pending:
            return self._action(self._pending.pop(0), None)
        try:
            turn = conversation.next_turn(timeout_s)
        except ModelError as exc:
            if exc.call is not None:
                self._requests.append(_error_record(exc))
            if exc.reason == FINISH_TIMEOUT:
                raise AgentTimeout(str(exc)) from None
            if exc.verdict_error:
                raise AgentInfraError(str(exc)) from None
            raise AgentStopped(exc.reason, str(exc)) from None
        record = turn.model_record()
        self._requests.append(record)
        self._tokens[0] += turn.prompt_tokens
        self._tokens[1] += turn.completion_tokens
        if not turn.tool_calls:
            # "stop", or "length"/"content_filter" without a call: the model is done talking.
            return Action(kind="final", content=turn.content, finish="stop", prompt_tokens=turn.prompt_tokens,
                          completion_tokens=turn.completion_tokens, model=record)
        self._pending = list(turn.tool_calls)
        return self._action(self._pending.pop(0), turn)

    def _action(self, call: ToolCall, turn: Optional[ModelTurn]) -> Action:
        self._asked = call
        model: Optional[CallRecord] = turn.model_record() if turn is not None else None
        if call.args_error:
            model = {} if model is None else model
            model["args_error"] = call.args_error
        return Action(kind="tool_call", name=call.name, args=call.args,
                      prompt_tokens=turn.prompt_tokens if turn is not None else 0,
                      completion_tokens=turn.completion_tokens if turn is not None else 0, model=model)

    def finish_record(self) -> AgentFinish:
        retries = sum(r.get("retries", 0) for r in self._requests)
        return {"model": {"settings": self.settings.pins(), "requests": len(self._requests), "retries": retries,
                          "prompt_tokens": self._tokens[0], "completion_tokens": self._tokens[1],
                          "calls": self._requests}}


def _error_record(exc: ModelError) -> CallRecord:
    return (exc.call or ProxyCall()).error_record(str(exc))


register("openai", OpenAIAgent)
