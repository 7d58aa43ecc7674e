"""The typed model of a suite, as the one validator (``suite.suite_from_dict``) builds it: ``Suite``,
its ``Task``s, their ``AgentSpec``, ``Budget`` and the suite's ``Gate``, the script and budget shapes
as JSON, and the values their fields may take. The reader (TOML layout or ``suite.json``) is
``suite.py``, which re-exports these names. Standard library only, Python 3.9.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, TypedDict, Union

from .checker import Contract
from .errors import SuiteError
from .jsonfile import JSONObject, JSONValue
from .recordclass import dataclass, field

SCHEMA = "crosshost.suite/1"
AGENT_KINDS = ("scripted", "command", "openai", "exec", "none")
#: kinds that talk to a live model through the controller's proxy
MODEL_KINDS = ("openai", "exec")
#: the wire API families an exec agent may speak through the model proxy
EXEC_APIS = ("openai", "anthropic", "gemini")


class BudgetJSON(TypedDict):
    """``[budget]`` as the pins hold it."""

    max_steps: int
    max_bytes: int
    timeout_s: float


DEFAULT_BUDGET: BudgetJSON = {"max_steps": 8, "max_bytes": 32768, "timeout_s": 120}
#: the most attempts of one task a suite may ask for (and so the most a run directory may hold)
MAX_REPEAT = 1000
#: ``network``: "isolated" (the default: an attempt reaches its model proxy and nothing else, where the
#: host gives a network namespace) or "open" (the host's network, outbound included)
NETWORK_MODES = ("isolated", "open")
#: how host differences are declared across a suite: Benjamini–Hochberg (false discovery rate) or Holm
CORRECTIONS = ("bh", "holm")
#: a task's ``[fixtures]`` entry: one observation, or observations keyed by an argument value ("*": any other)
Fixture = Union[str, Dict[str, str]]


class _ScriptCallName(TypedDict):
    name: str


class ScriptCall(_ScriptCallName, total=False):
    """One tool call of a scripted turn."""

    args: JSONObject


class ScriptTurn(TypedDict, total=False):
    """One turn of ``script.json``: tool calls, or the final answer (``content``, ``finish`` = "stop")."""

    tool_calls: List[ScriptCall]
    content: str
    finish: str


@dataclass
class Budget:
    """What an attempt may spend: steps, bytes and seconds."""

    max_steps: int = 8
    max_bytes: int = 32768
    timeout_s: float = 120

    def to_dict(self) -> BudgetJSON:
        return {"max_steps": self.max_steps, "max_bytes": self.max_bytes, "timeout_s": self.timeout_s}


@dataclass
class Gate:
    """``[gate]``: the highest flip rate that passes, and the significance level a sampled agent's
    difference must reach to count as a flip."""

    flip_rate: float = 0.1
    alpha: float = 0.05
    burn_invalidates: bool = False  # a host's burn isolation finding makes the run invalid
    correction: str = "bh"  # one of CORRECTIONS: the error rate alpha bounds across the suite's tasks
    undecided: int = 0  # comparable tasks a run may leave undecided and still pass

    def to_dict(self) -> "GateJSON":
        return {
            "flip_rate": self.flip_rate, "alpha": self.alpha, "burn_invalidates": self.burn_invalidates,
            "correction": self.correction, "undecided": self.undecided,
        }


class GateJSON(TypedDict):
    """``[gate]`` as written back (``Gate.to_dict``)."""

    flip_rate: float
    alpha: float
    burn_invalidates: bool
    correction: str
    undecided: int


@dataclass
class AgentSpec:
    """Which agent a task runs and its kind's options."""

    kind: str
    command: Optional[List[str]] = None
    #: kind-specific keys (e.g. model, api_key_env), each checked by its kind's rule (``_OPENAI_KEYS``)
    options: JSONObject = field(default_factory=dict)

    def to_dict(self) -> JSONObject:
        """``[agent]`` as the suite wrote it (its options are the kind's own)."""
        out: JSONObject = {"kind": self.kind}
        if self.command is not None:
            command: List[JSONValue] = list(self.command)
            out["command"] = command
        out.update(self.options)
        return out


@dataclass
class Task:
    """One task of a suite, validated."""

    id: str
    prompt: str
    agent: AgentSpec
    budget: Budget
    script: Optional[List[ScriptTurn]] = None
    fixtures: Dict[str, Fixture] = field(default_factory=dict)
    expect_tools: List[str] = field(default_factory=list)
    forbid_tools: List[str] = field(default_factory=list)
    must_finish: Optional[str] = "stop"
    repo_dir: Optional[Path] = None
    tags: List[str] = field(default_factory=list)  # for selecting tasks (crosshost replay --tags)
    #: a negative golden task: the contract findings ("kind:tool") its agent's calls must draw; the
    #: checker finding them is the pass, missing one is the fail
    expect_findings: List[str] = field(default_factory=list)

    @property
    def predicate(self) -> Optional[Path]:
        if self.repo_dir is None:
            return None
        path = self.repo_dir / "run_tests.sh"
        return path if path.is_file() else None


@dataclass
class Suite:
    """A suite, validated: its tasks, contract, tools and defaults."""

    name: str
    root: Path
    repeat: int
    agent: AgentSpec
    budget: Budget
    gate: Gate
    contract: Contract
    tools: Dict[str, List[List[str]]]
    tasks: List[Task]
    data: JSONObject  # the normalised document (what suite.json holds), as validated
    network: str = "isolated"  # one of NETWORK_MODES

    @property
    def task_ids(self) -> List[str]:
        return [task.id for task in self.tasks]

    def sampled_task_ids(self) -> List[str]:
        """The tasks whose agent is sampled (``is_sampled``): their verdicts are draws."""
        return [task.id for task in self.tasks if is_sampled(task.agent)]

    def task(self, task_id: str) -> Task:
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise SuiteError(f"{self.root}: no task {task_id!r} (tasks: {', '.join(t.id for t in self.tasks)})")


def is_sampled(agent: AgentSpec) -> bool:
    """Whether the agent's verdicts are draws: a live model unless ``sampled = false``, a command agent
    only with ``sampled = true``. One attempt of a sampled agent is never evidence of a host difference."""
    default = agent.kind in MODEL_KINDS
    return bool(agent.options.get("sampled", default))
