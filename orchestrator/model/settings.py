"""The model proxy's settings, read before any host is touched: ``ProxyConfig`` (what every
live-model task of a run agrees on) and the API key check. A module of its own so that a replay
with no live model never loads the proxy (its HTTP server, wire APIs and held model)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent_runner.jsonfile import JSONValue
from agent_runner.suite import MODEL_KINDS
from orchestrator.errors import ApiKeyMissing, SuiteError

if TYPE_CHECKING:
    from agent_runner.suite import Suite


@dataclass(frozen=True)
class ProxyConfig:
    """The model proxy's settings: what every live-model task of a run agrees on (``openai_agent_config``)."""

    base_url: str
    api_key_env: str
    api: str = "openai"  # the wire API family (orchestrator/model/apis/)
    kind: str = "openai"  # "exec" when a task runs its own program (the placeholder is for it)
    model: str | None = None  # pinned only when every task names the same model
    max_requests: int | None = None
    max_total_tokens: int | None = None
    hold_model: bool | str = True  # the suite's ``hold_model``: true, false or "strict"



def _whole(value: JSONValue) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def openai_agent_config(suite: Suite, tasks: list[str] | None = None) -> ProxyConfig | None:
    """The proxy's settings for a suite whose (selected) tasks use ``kind = "openai"`` or ``"exec"``.

    None when no selected task talks to a model. Each task's agent is the validated one (the suite's
    inherited by the suite's one rule). One proxy serves a host's whole run, so every such task must
    agree on ``base_url``, ``api_key_env`` and the caps; ``model`` is pinned only when they agree on it.
    """
    agents = [
        {**task.agent.to_dict(), "api": task.agent.options.get("api", "openai")}
        for task in suite.tasks
        if task.agent.kind in MODEL_KINDS and (tasks is None or task.id in tasks)
    ]
    if not agents:
        return None
    for key in ("base_url", "api_key_env", "max_requests", "max_total_tokens", "api"):
        if len({json.dumps(a.get(key)) for a in agents}) > 1:
            raise SuiteError(f"[agent] {key}: every live-model task of a suite must use the same {key}")
    first = agents[0]
    models = {json.dumps(a.get("model")) for a in agents}
    model, hold = first.get("model"), first.get("hold_model", True)
    return ProxyConfig(
        base_url=str(first.get("base_url", "")),
        api_key_env=str(first.get("api_key_env", "")),
        api=str(first.get("api", "openai")),
        kind="exec" if any(a.get("kind") == "exec" for a in agents) else str(first.get("kind")),
        model=model if isinstance(model, str) and len(models) == 1 else None,
        max_requests=_whole(first.get("max_requests")),
        max_total_tokens=_whole(first.get("max_total_tokens")),
        hold_model=hold if isinstance(hold, (bool, str)) else True,
    )


def require_api_key(
    api_key_env: str, environ: Mapping[str, str] | None = None, *, where: str = "suite.toml"
) -> str:
    """Return the key named by ``api_key_env`` or raise a one-line ``ApiKeyMissing`` before any run."""
    env = os.environ if environ is None else environ
    if not api_key_env:
        raise ApiKeyMissing(
            f"{where}: [agent] api_key_env is empty; name the variable that holds the API key"
        )
    value = env.get(api_key_env, "")
    if not value.strip():
        raise ApiKeyMissing(
            f"{where}: [agent] api_key_env = {api_key_env!r} is not set in the controller's environment; "
            f"export {api_key_env}=<key> and rerun (the key stays on the controller)"
        )
    return value.strip()
