"""The controller's own records in a run directory: ``manifest.json`` (``Manifest``, its hosts,
shard and rounds) and ``repro.json`` (``ReproRecord``); fields in docs/run-directory.md.

Old manifest shapes are accepted in one place, ``migrate_manifest``; ``RunDir`` reads and writes
these files (``store/rundir.py``).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent_runner.records import migrate_pins
from orchestrator.hosts.transport.base import ConnectRetry, ContainerFacts

MANIFEST_SCHEMA = "crosshost.manifest/2"
REPRO_SCHEMA = "crosshost.repro/1"
#: /1 named the runner zipapp's digest ``runner_sha``; /2 calls it ``zipapp_sha``
OLD_MANIFEST_SCHEMAS = ("crosshost.manifest/1",)


class SuiteRef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    sha: str | None = None
    path: str | None = None


class HostRecord(BaseModel):
    """What happened on one host. ``reachable`` false means no verdict of it is the agent's."""

    model_config = ConfigDict(extra="ignore")
    reachable: bool = False
    error: str | None = None
    fingerprint: str | None = None
    python: str | None = None
    bundle_pushed: bool | None = None
    bundle_replaced: bool | None = None  # the host's cached bundle had changed since pushed: replaced
    runner_exit: int | None = None
    workspace_removed: bool | None = None
    stages: dict[str, float] = Field(default_factory=dict)  # stage -> seconds
    #: what the transport says of a container host (image id and digests, daemon, runtime); None elsewhere
    container: ContainerFacts | None = None


class ReproRecord(BaseModel):
    """``repro.json``: what ``crosshost repro`` replayed and where the two hosts parted
    (docs/run-directory.md). ``comparison`` is the step-by-step comparison as ``repro`` made it."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    schema_: str = Field(default=REPRO_SCHEMA, alias="schema")
    run_id: str
    trace: str = ""
    suite: str | None = None
    task: str | None = None
    host: str | None = None
    against: str | None = None
    hosts: list[str] = Field(default_factory=list)
    fixtures_from_trace: bool = False
    fixture_tools: list[str] = Field(default_factory=list)
    steps: int = 0
    errors: dict[str, str] = Field(default_factory=dict)
    parted: bool | None = None
    comparison: dict[str, Any] | None = None
    recorded_match: list[str] = Field(default_factory=list)
    exit_code: int | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)


class ShardRecord(BaseModel):
    """A shard's place in its run (``crosshost replay --shard K/N``; docs/scale.md)."""

    model_config = ConfigDict(extra="ignore")
    run_id: str  # the whole run's id: the name of the directory ``crosshost merge`` writes
    index: int  # 1..count
    count: int
    by: str = "task"  # what is split: the tasks (every shard replays on every host, the reference too)
    tasks: list[str] = Field(default_factory=list)  # every task of the whole run, in suite order

    @property
    def label(self) -> str:
        return f"shard {self.index}/{self.count}"


class RoundRecord(BaseModel):
    """One round of ``replay --until-decided``: its run directory under ``rounds/``, the attempts per
    host it aimed for, the tasks it ran."""

    model_config = ConfigDict(extra="ignore")
    round: int
    run_id: str
    repeat: int
    tasks: list[str] = Field(default_factory=list)


class Manifest(BaseModel):
    """``manifest.json``. Fields a replay always writes may be absent in a run another tool made;
    readers treat an absent one as unknown. Unknown keys are ignored (a newer crosshost's)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    schema_: str = Field(default=MANIFEST_SCHEMA, alias="schema")
    run_id: str
    kind: str = "replay"  # "replay" or "repro"
    started: str | None = None
    finished: str | None = None
    suite: SuiteRef | None = None
    bundle_sha: str | None = None
    zipapp_sha: str | None = None  # sha256 of the runner.pyz shipped (pins.runner_source_sha: its sources)
    gate: float | None = None
    alpha: float | None = None  # the suite's [gate] alpha: significance of a host difference
    burn_invalidates: bool = False  # the suite's [gate] burn_invalidates: a host's burn finding invalidates
    correction: str | None = None  # the suite's [gate] correction ("bh" or "holm"); None: the default
    allow_undecided: int = 0  # the suite's [gate] undecided: undecided tasks a run may leave and pass
    looks: int = 1  # how many times --until-decided looked at the evidence (docs/statistics.md)
    first_attempt: int = 0  # the number of the run's first attempt (a later round of --until-decided)
    #: --until-decided: the attempts per host each task got (tasks decided early got fewer)
    task_repeat: dict[str, int] = Field(default_factory=dict)
    #: --until-decided: per round, its run directory under rounds/, the attempts per host it aimed
    #: for and the tasks it ran
    rounds: list[RoundRecord] = Field(default_factory=list)
    #: negative golden tasks: task -> the contract findings ("kind:tool") its task.toml expects
    expect_findings: dict[str, list[str]] = Field(default_factory=dict)
    sampled: list[str] = Field(default_factory=list)  # tasks whose agent is sampled
    task_tags: dict[str, list[str]] = Field(default_factory=dict)  # task.toml tags (report/diff --tags)
    hold_model: str | None = None  # "true" or "strict" when the model was held (orchestrator/model/hold.py)
    tasks: list[str] = Field(default_factory=list)
    repeat: int | None = None
    pins: dict[str, dict[str, Any]] = Field(default_factory=dict)  # task -> the pins of its trace header
    inventory: dict[str, Any] = Field(default_factory=dict)
    reference: str | None = None
    crosshost_version: str | None = None
    retries: list[ConnectRetry] = Field(default_factory=list)
    hosts: dict[str, HostRecord] = Field(default_factory=dict)
    interrupted: bool = False
    #: said once per run (summary, report.json): inventory values crosshost replaced or ignored
    notes: list[str] = Field(default_factory=list)
    shard: ShardRecord | None = None  # this directory is one shard of a run (``replay --shard``)
    shards: list[str] = Field(default_factory=list)  # the shard directories ``crosshost merge`` joined into this run

    @property
    def suite_name(self) -> str | None:
        return self.suite.name if self.suite is not None else None

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def _iso(value: Any) -> Any:
    """Epoch seconds as the ISO-8601 UTC text a manifest holds (any other value as it is)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _dt.datetime.fromtimestamp(value, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value




def migrate_manifest(data: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """A manifest of any known shape as today's; the one place old manifest shapes are accepted.

    - schema /1: ``runner_sha`` (the zipapp's digest) is ``zipapp_sha``; the pins' ``runner_sha``
      (the runner's source digest) is ``runner_source_sha``.
    - no ``run_id``: the directory's name.
    - ``suite`` as a bare name, or ``suite_name``/``suite_sha`` beside it, or ``suite.sha256``;
      a ``gate`` kept in the suite, or as the suite's ``[gate]`` table ``{"flip_rate": x, "alpha": a}``.
    - ``hosts`` as a list (of names or of ``{"name": ...}`` objects); ``inventory`` as a bare list.
    - ``started``/``finished`` as epoch seconds.
    """
    out = dict(data)
    if out.get("schema") in OLD_MANIFEST_SCHEMAS:
        out["schema"] = MANIFEST_SCHEMA
        if "runner_sha" in out:
            out.setdefault("zipapp_sha", out.pop("runner_sha"))
        pins = out.get("pins")
        if isinstance(pins, dict):
            out["pins"] = {t: migrate_pins(p) if isinstance(p, dict) else p for t, p in pins.items()}
    if not isinstance(out.get("run_id"), str) or not out["run_id"]:
        out["run_id"] = run_dir.name
    suite = out.get("suite")
    if isinstance(suite, str):
        suite = {"name": suite}
    if suite is None and isinstance(out.get("suite_name"), str):
        suite = {"name": out["suite_name"]}
    if isinstance(suite, dict):
        suite = dict(suite)
        suite.setdefault("sha", suite.pop("sha256", None) or out.get("suite_sha"))
        if out.get("gate") is None and suite.get("gate") is not None:
            out["gate"] = suite["gate"]
        out["suite"] = suite
    out.pop("suite_name", None)
    out.pop("suite_sha", None)
    gate = out.get("gate")
    if isinstance(gate, dict):
        out["gate"] = gate.get("flip_rate")
        if out.get("alpha") is None:
            out["alpha"] = gate.get("alpha")
        if out.get("burn_invalidates") is None and isinstance(gate.get("burn_invalidates"), bool):
            out["burn_invalidates"] = gate["burn_invalidates"]
        if out.get("correction") is None and isinstance(gate.get("correction"), str):
            out["correction"] = gate["correction"]
        if out.get("allow_undecided") is None and isinstance(gate.get("undecided"), int):
            out["allow_undecided"] = gate["undecided"]
    hosts = out.get("hosts")
    if isinstance(hosts, list):
        listed = [h if isinstance(h, dict) else {"name": h} for h in hosts]
        out["hosts"] = {str(h["name"]): h for h in listed if h.get("name")}
    inventory = out.get("inventory")
    if isinstance(inventory, list):
        out["inventory"] = {"hosts": inventory}
    for key in ("started", "finished"):
        out[key] = _iso(out.get(key))
    return out
