"""The agent loop: the runner, not the agent, enforces max_steps, max_bytes and timeout_s."""

from __future__ import annotations

import time
from typing import List, Optional

from .agents import Agent, AgentFailed, AgentInfraError, AgentStopped, AgentTimeout, Observation
from .model_records import AgentFinish
from .recordclass import dataclass, field
from .records import TraceTurnJSON
from .suite import Budget
from .tools import ToolBox
from .trace import TraceWriter

MAX_FINAL_CHARS = 4000


@dataclass
class LoopOutcome:
    """How an agent's loop ended and the turns it wrote."""

    reason: str  # stop | budget_steps | budget_bytes | timeout | agent_error
    final: str = ""
    turns: List[TraceTurnJSON] = field(default_factory=list)  # as written (redacted)
    observation_bytes: int = 0
    infra_error: Optional[str] = None  # set when the failure is the harness's, not the agent's
    agent_record: AgentFinish = field(default_factory=AgentFinish)  # Agent.finish_record(), for the finish record


def drive(agent: Agent, toolbox: ToolBox, budget: Budget, writer: TraceWriter, deadline: float) -> LoopOutcome:
    """Run ``agent`` (already started) until it finishes or a budget stops it; write one turn per call."""
    outcome = LoopOutcome(reason="stop")
    observation: Optional[Observation] = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            outcome.reason = "timeout"
            agent.abort("timeout")
            return outcome
        asked = time.monotonic()
        try:
            action = agent.next_action(observation, remaining)
        except AgentTimeout as exc:
            outcome.reason, outcome.final = "timeout", str(exc)
            return outcome
        except AgentStopped as exc:  # a cap kept outside the runner (the model proxy's): budget_model
            outcome.reason, outcome.final = exc.reason, str(exc)[:MAX_FINAL_CHARS]
            return outcome
        except AgentInfraError as exc:
            outcome.reason, outcome.final, outcome.infra_error = "agent_error", str(exc)[:MAX_FINAL_CHARS], str(exc)
            return outcome
        except AgentFailed as exc:
            outcome.reason, outcome.final = "agent_error", str(exc)[:MAX_FINAL_CHARS]
            return outcome
        if action.kind == "final":
            outcome.reason, outcome.final = "stop", action.content[:MAX_FINAL_CHARS]
            return outcome
        if len(outcome.turns) >= budget.max_steps:
            # The call that would exceed the budget is neither run nor recorded.
            outcome.reason = "budget_steps"
            agent.abort("budget_steps")
            return outcome
        result = toolbox.call(action.name, action.args, max(deadline - time.monotonic(), 0.0))
        record = writer.turn(tool=action.name, args=action.args if isinstance(action.args, dict) else {},
                             observation=result.observation, error=result.error,
                             prompt_tokens=action.prompt_tokens, completion_tokens=action.completion_tokens,
                             latency_ms=int((time.monotonic() - asked) * 1000), model=action.model)
        outcome.turns.append(record)
        size = len(result.observation.encode("utf-8"))
        if outcome.observation_bytes + size > budget.max_bytes:
            outcome.reason = "budget_bytes"
            agent.abort("budget_bytes")
            return outcome
        outcome.observation_bytes += size
        observation = Observation(result.observation, result.error)
