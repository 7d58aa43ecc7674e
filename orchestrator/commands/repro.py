"""Incident reproduction: replay one recorded trace on a named host and a good one, find where they part.

``crosshost repro TRACE --host NAME`` turns the trace (ours, or a JSON ``{"tool_calls": [...]}`` document)
into a one-task scripted suite: the agent repeats the recorded tool calls in order, the built-in tools
(shell, read_file, write_file, list_dir) run for real on each host, every other tool is answered from
the trace's recorded observations (sidecar ``.obs.jsonl``) - or every tool is, with
``--fixtures-from-trace``. The shell may run exactly the commands the trace ran. The suite is replayed
on both hosts by the ordinary replay machinery, and the two traces are compared step by step.

The reproduction is a run like any other: ``runs/<run_id>/`` with the suite it built (``repro-suite/``),
manifest, traces, report, and ``repro.json`` holding the divergence; it is recorded in the history
index with kind ``repro``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent_runner.checker import Contract
from agent_runner.jsonfile import JSONObject
from agent_runner.records import Fingerprint, TraceTurn
from agent_runner.redact import redact
from agent_runner.suite import TASK_ID
from agent_runner.suite_model import ScriptCall, ScriptTurn
from agent_runner.trace import CorruptLine, Trace, fp, iter_observations, read_trace
from orchestrator.analysis.attribution import fingerprint_differences
from orchestrator.errors import InputError, TraceError
from orchestrator.exit_policy import repro_exit
from orchestrator.store.records import ReproRecord
from orchestrator.store.rundir import RunDir, write_json_atomic

BUILTIN_TOOLS = ("shell", "read_file", "write_file", "list_dir")
OBS_SHOWN_CHARS = 800  # an observation shown side by side is cut here (the full one is in the traces)
OBS_SHOWN_LINES = 20
MISSING_OBS = "(no recorded observation: the trace has no .obs.jsonl sidecar for this step)"


# ---------------------------------------------------------------- reading the recorded trace


def sidecar_path(trace_path: Path) -> Path | None:
    """``<task>.<attempt>.obs.jsonl`` next to ``<task>.<attempt>.jsonl`` (or ``<trace>.obs.jsonl``)."""
    candidates = [Path(str(trace_path) + ".obs.jsonl")]
    if trace_path.suffix in (".jsonl", ".json"):
        candidates.insert(0, trace_path.with_suffix(".obs.jsonl"))
    return next((c for c in candidates if c.is_file() and c != trace_path), None)


def recorded_observations(trace_path: Path) -> dict[int, str]:
    """step -> observation content, from the sidecar if there is one."""
    side = sidecar_path(trace_path)
    if side is None:
        return {}
    obs: dict[int, str] = {}
    for number, rec in iter_observations(side):
        if isinstance(rec, CorruptLine):
            raise TraceError(f"{side}:{number}: {rec.error}")
        obs[rec["step"]] = rec["content"]
    return obs


def load_recorded(trace_path: Path) -> tuple[Trace, dict[int, str]]:
    """The trace and its observations; a trace that cannot drive a replay is an InputError (exit 2)."""
    if not trace_path.is_file():
        raise TraceError(f"{trace_path}: no such trace file")
    trace = read_trace(trace_path)
    observations = recorded_observations(trace_path)
    broken = [p for p in trace.problems if "no finish record" not in p and "no header record" not in p]
    if broken:
        raise TraceError(f"{broken[0]} (fix the trace; {len(broken)} problem(s) in all)")
    if not trace.turns:
        raise TraceError(f"{trace_path}: the trace has no tool calls; nothing to reproduce")
    return trace, observations


# ---------------------------------------------------------------- building the scripted suite


def _task_id(trace: Trace, trace_path: Path) -> str:
    for candidate in ((trace.header or {}).get("task"), trace_path.name.split(".")[0]):
        if isinstance(candidate, str) and TASK_ID.match(candidate):
            return candidate
    return "repro"


def _fixture_table(
    calls: list[tuple[str, JSONObject, str]],
) -> dict[str, str | dict[str, str]]:
    """tool -> observation, or tool -> {argument value -> observation} when the calls differ in an arg.

    The runner's fixtures key on one argument value; the first argument whose values tell every
    distinct observation apart is used. If none does, the first observation answers every call.
    """
    by_tool: dict[str, list[tuple[JSONObject, str]]] = {}
    for tool, args, obs in calls:
        by_tool.setdefault(tool, []).append((args, obs))
    table: dict[str, str | dict[str, str]] = {}
    for tool, seen in by_tool.items():
        if len({obs for _, obs in seen}) == 1:
            table[tool] = seen[0][1]
            continue
        keys = sorted({k for args, _ in seen for k in args})
        for key in keys:
            mapping: dict[str, str] = {}
            ok = True
            for args, obs in seen:
                value = args.get(key)
                if not isinstance(value, str | int | float | bool):
                    ok = False
                    break
                if mapping.setdefault(str(value), obs) != obs:
                    ok = False
                    break
            if ok:
                table[tool] = mapping
                break
        else:
            table[tool] = seen[0][1]
    return table


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _toml_fixtures(table: dict[str, str | dict[str, str]]) -> str:
    lines = ["[fixtures]"]
    nested = []
    for tool, value in sorted(table.items()):
        if isinstance(value, str):
            lines.append(f"{_toml_string(tool)} = {_toml_string(value)}")
        else:
            nested.append((tool, value))
    for tool, mapping in nested:
        lines.append(f"[fixtures.{_toml_string(tool)}]")
        lines.extend(f"{_toml_string(k)} = {_toml_string(v)}" for k, v in sorted(mapping.items()))
    return "\n".join(lines) + "\n"


@dataclass
class ReproSuite:
    path: Path
    name: str
    task: str
    steps: int
    fixture_tools: list[str]
    shell_commands: list[list[str]]


def build_suite(
    trace_path: Path,
    out_dir: Path,
    *,
    fixtures_from_trace: bool = False,
    suite_dir: Path | None = None,
) -> ReproSuite:
    """Write the one-task scripted suite that replays ``trace_path`` into ``out_dir``."""
    trace, observations = load_recorded(trace_path)
    task = _task_id(trace, trace_path)
    turns = trace.turns
    names = list(dict.fromkeys(t.tool for t in turns))

    if suite_dir is not None:
        # --suite: its contract and tools.json replace the ones derived from the trace
        from agent_runner.suite import load_suite

        given = load_suite(suite_dir)
        contract: Contract = given.contract
        tools_policy: dict[str, list[list[str]]] = {  # tools.json, as Suite.tools holds it
            "allow": given.tools.get("allow", []),
            "deny": given.tools.get("deny", []),
        }
    else:
        contract = {
            "contract_id": f"crosshost.repro.{task}",
            "tools": [{"name": n} for n in dict.fromkeys([*BUILTIN_TOOLS, *names])],
            "invariants": [],
        }
        allow: list[list[str]] = []
        for t in turns:
            argv = t.args.get("argv") if t.tool == "shell" else None
            if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
                command = [str(a) for a in argv]
                if command not in allow:
                    allow.append(command)
        tools_policy = {"allow": allow, "deny": []}

    answered = [
        (t.tool, dict(t.args), observations.get(t.step, MISSING_OBS))
        for t in turns
        if fixtures_from_trace or t.tool not in BUILTIN_TOOLS
    ]
    fixtures = _fixture_table(answered)

    budget = dict((trace.header or {}).get("pins", {}).get("budget") or {})
    budget["max_steps"] = max(int(budget.get("max_steps", 0) or 0), len(turns) + 1)
    budget.setdefault("max_bytes", 1_048_576)
    budget.setdefault("timeout_s", 120)

    script = [ScriptTurn(tool_calls=[ScriptCall(name=t.tool, args=t.args)]) for t in turns]
    final = (trace.finish or {}).get("final")
    script.append(ScriptTurn(content=final if isinstance(final, str) else "", finish="stop"))

    name = f"repro-{task}"
    if out_dir.exists():
        shutil.rmtree(out_dir)
    task_dir = out_dir / "tasks" / task
    task_dir.mkdir(parents=True)
    (out_dir / "suite.toml").write_text(
        "\n".join(
            [
                f"name = {_toml_string(name)}",
                "repeat = 1",
                'contract = "contract.json"',
                'tools = "tools.json"',
                "[agent]",
                'kind = "scripted"',
                "[budget]",
                *(
                    f"{k} = {json.dumps(v)}"
                    for k, v in sorted(budget.items())
                    if k in ("max_steps", "max_bytes", "timeout_s")
                ),
                "",
            ]
        )
    )
    (out_dir / "contract.json").write_text(json.dumps(contract, indent=2, sort_keys=True) + "\n")
    (out_dir / "tools.json").write_text(json.dumps(tools_policy, indent=2) + "\n")
    (task_dir / "task.toml").write_text(
        'must_finish = "stop"\n' + (_toml_fixtures(fixtures) if fixtures else "")
    )
    (task_dir / "prompt.md").write_text(f"Reproduce the recorded trace {trace_path.name} step by step.\n")
    (task_dir / "script.json").write_text(json.dumps(script, indent=2) + "\n")
    if suite_dir is not None and (suite_dir / "tasks" / task / "repo").is_dir():
        shutil.copytree(suite_dir / "tasks" / task / "repo", task_dir / "repo", symlinks=True)
    return ReproSuite(
        path=out_dir,
        name=name,
        task=task,
        steps=len(turns),
        fixture_tools=sorted(fixtures),
        shell_commands=[list(a) for a in tools_policy["allow"]],
    )


# ---------------------------------------------------------------- comparing the two replays


def shown(obs: str | None) -> str | None:
    """An observation as shown to a person: redacted, at most OBS_SHOWN_LINES lines / CHARS chars."""
    if obs is None:
        return None
    text = str(redact(obs))
    lines = text.splitlines(keepends=True)
    if len(lines) <= OBS_SHOWN_LINES and len(text) <= OBS_SHOWN_CHARS:
        return text
    cut = "".join(lines[:OBS_SHOWN_LINES])[:OBS_SHOWN_CHARS].rstrip("\n")
    return f"{cut}\n... ({len(obs)} chars in all)"


def fingerprint_diff(a: Fingerprint | None, b: Fingerprint | None) -> dict[str, list[Any]]:
    """field -> [value on a, value on b], for every fingerprint field whose values differ."""
    return {field: [left, right] for field, left, right in fingerprint_differences(a, b)}


@dataclass
class Side:
    host: str
    tool: str | None
    args: JSONObject | None
    obs_fp: str | None
    error: str | None
    observation: str | None  # redacted, truncated


@dataclass
class Divergence:
    step: int
    what: str  # "observation", "tool call", "error", "length"
    host: Side
    against: Side


@dataclass
class Comparison:
    host: str
    against: str
    steps_compared: int
    divergence: Divergence | None
    verdicts: dict[str, str | None]
    fingerprint_diff: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def parted(self) -> bool:
        return self.divergence is not None or len(set(self.verdicts.values())) > 1

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "parted": self.parted}


def _side(host: str, turn: TraceTurn | None, obs: dict[int, str]) -> Side:
    if turn is None:
        return Side(host, None, None, None, None, None)
    return Side(
        host=host,
        tool=turn.tool,
        args=turn.args,
        obs_fp=turn.obs_fp or None,  # a {"tool_calls": [...]} trace keeps none
        error=turn.error,
        observation=shown(obs.get(turn.step)),
    )


def compare_traces(
    host: str,
    host_trace: Path,
    against: str,
    against_trace: Path,
    host_fingerprint: Fingerprint | None = None,
    against_fingerprint: Fingerprint | None = None,
) -> Comparison:
    """Step by step: the first step whose tool call, error or observation (obs_fp) differs."""
    ta, tb = read_trace(host_trace), read_trace(against_trace)
    oa, ob = recorded_observations(host_trace), recorded_observations(against_trace)
    divergence = None
    n = max(len(ta.turns), len(tb.turns))
    for i in range(n):
        a = ta.turns[i] if i < len(ta.turns) else None
        b = tb.turns[i] if i < len(tb.turns) else None
        what = None
        if a is None or b is None:
            what = "length"
        elif (a.tool, a.args_fp or fp(a.args)) != (b.tool, b.args_fp or fp(b.args)):
            what = "tool call"
        elif a.obs_fp != b.obs_fp:
            what = "observation"
        elif a.error != b.error:
            what = "error"
        if what:
            divergence = Divergence(i + 1, what, _side(host, a, oa), _side(against, b, ob))
            break
    return Comparison(
        host=host,
        against=against,
        steps_compared=n,
        divergence=divergence,
        verdicts={host: (ta.finish or {}).get("verdict"), against: (tb.finish or {}).get("verdict")},
        fingerprint_diff=fingerprint_diff(host_fingerprint, against_fingerprint),
    )


def shell_commands(trace: Trace) -> list[str]:
    """Every shell command the trace's calls would run, as a person reads them (in order, once each)."""
    import shlex

    shown_commands: list[str] = []
    for turn in trace.turns:
        if turn.tool != "shell":
            continue
        args = turn.args
        argv = args.get("argv")
        if isinstance(argv, list) and all(isinstance(a, str) for a in argv):
            text = shlex.join(str(a) for a in argv)
        else:
            text = json.dumps(args, sort_keys=True)
        if text not in shown_commands:
            shown_commands.append(text)
    return shown_commands


def check_consent(request: ReproRequest, host: str, against: str) -> None:
    """Refuse, listing the commands, unless the user opted in to running what a host recorded.

    A trace is data a host wrote: its shell calls are replayed as real commands. They run only with
    ``--run-commands`` (or ``--suite``, whose tools.json the user vouches for), and on a ``local``
    host (the controller itself) only with ``--on-local`` as well."""
    if request.fixtures_from_trace:
        return  # every tool, shell included, is answered from the recording: nothing runs
    from orchestrator.hosts.inventory import load_inventory

    trace, _ = load_recorded(request.trace)
    commands = shell_commands(trace)
    if not commands:
        return
    inventory = load_inventory(request.inventory_path)
    local = [h for h in (host, against) if inventory.get(h).transport == "local"]
    listing = "".join(f"\n  $ {c}" for c in commands)
    if not (request.run_commands or request.suite_dir is not None):
        raise InputError(
            f"{request.trace}: replaying it runs {len(commands)} shell command(s) the trace recorded, "
            f"on {host} and {against}; read them, then add --run-commands to run them "
            f"(or --fixtures-from-trace to run none):{listing}"
        )
    if local and not request.on_local:
        raise InputError(
            f"{request.trace}: {', '.join(local)} is transport \"local\" (this machine); replaying the trace "
            f"runs {len(commands)} shell command(s) it recorded here; add --on-local to run them on this "
            f"machine, or name ssh hosts with --host/--against:{listing}"
        )


# ---------------------------------------------------------------- the reproduction run


@dataclass
class ReproRequest:
    trace: Path
    host: str
    inventory_path: Path = Path("hosts.toml")
    against: str | None = None
    fixtures_from_trace: bool = False
    suite_dir: Path | None = None  # --suite: its contract and tools.json instead of derived ones
    out: Path = Path("runs")
    accept_new: bool = False
    run_commands: bool = False  # the trace's shell calls may run (the user read them)
    on_local: bool = False  # ... also on a `local` host, the controller itself

    def command_words(self) -> list[str]:
        """The ``crosshost repro`` command that ran this, complete, for hints to repeat."""
        from orchestrator.hints import inventory_words, out_words

        words = ["repro", str(self.trace), "--host", self.host, *inventory_words(self.inventory_path)]
        if self.against:
            words += ["--against", self.against]
        if self.fixtures_from_trace:
            words.append("--fixtures-from-trace")
        if self.suite_dir is not None:
            words += ["--suite", str(self.suite_dir)]
        if self.run_commands:
            words.append("--run-commands")
        if self.on_local:
            words.append("--on-local")
        return [*words, *out_words(self.out)]


@dataclass
class ReproOutcome:
    run_dir: Path
    host: str
    against: str
    exit_code: int
    comparison: Comparison | None = None
    errors: dict[str, str] = field(default_factory=dict)
    recorded_match: list[str] = field(
        default_factory=list
    )  # hosts whose diverging step matches the recording
    record: ReproRecord | None = None  # what repro.json holds


def _pick_hosts(request: ReproRequest) -> tuple[str, str]:
    from orchestrator.hosts.inventory import load_inventory

    inventory = load_inventory(request.inventory_path)
    inventory.get(request.host)  # an unknown name is an InventoryError naming the file
    against = request.against or inventory.reference.name
    inventory.get(against)
    if against == request.host:
        raise InputError(
            f"{request.inventory_path}: --host {request.host} is the host to compare against; "
            "name a different good host with --against"
        )
    return request.host, against


def _trace_of(run_dir: Path, host: str, task: str) -> Path | None:
    path = RunDir(run_dir).trace_path(host, task, 0)
    return path if path.is_file() else None


def _fingerprint_of(run_dir: Path, host: str) -> Fingerprint | None:
    return RunDir(run_dir).read_fingerprint(host)[0]


def repro(request: ReproRequest, *, opener: Any = None, on_event: Any = None) -> ReproOutcome:
    """Replay the trace on ``host`` and the reference (or ``against``) and compare step by step."""
    import tempfile

    from orchestrator.commands.replay import ReplayRequest, replay
    from orchestrator.store import history

    host, against = _pick_hosts(request)
    check_consent(request, host, against)
    request.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".repro-", dir=request.out) as tmp:
        built = build_suite(
            request.trace,
            Path(tmp) / "suite",
            fixtures_from_trace=request.fixtures_from_trace,
            suite_dir=request.suite_dir,
        )
        # A run of its own kind, its suite kept in the run directory: the manifest says so from the start.
        replayed = replay(
            ReplayRequest(
                suite_dir=built.path,
                inventory_path=request.inventory_path,
                hosts=[host, against],
                out=request.out,
                accept_new=request.accept_new,
                rerun=request.command_words(),
                kind="repro",
                keep_suite="repro-suite",
            ),
            opener=opener,
            on_event=on_event,
        )
        run_dir = replayed.run_dir.path

    outcome = ReproOutcome(run_dir, host, against, exit_code=0, errors=dict(replayed.errors))
    host_trace, against_trace = (_trace_of(run_dir, h, built.task) for h in (host, against))
    for h, path in ((host, host_trace), (against, against_trace)):
        if path is None and h not in outcome.errors:
            outcome.errors[h] = f"{h}: no trace of {built.task} came back"
    if host_trace is not None and against_trace is not None:
        outcome.comparison = compare_traces(
            host,
            host_trace,
            against,
            against_trace,
            _fingerprint_of(run_dir, host),
            _fingerprint_of(run_dir, against),
        )
        div = outcome.comparison.divergence
        if div is not None:
            recorded, _ = load_recorded(request.trace)
            rec_turn = recorded.turns[div.step - 1] if div.step <= len(recorded.turns) else None
            rec_fp = rec_turn.obs_fp if rec_turn is not None else None
            outcome.recorded_match = [
                s.host for s in (div.host, div.against) if rec_fp and s.obs_fp == rec_fp
            ]
    parted = None if outcome.comparison is None else outcome.comparison.parted
    outcome.exit_code = repro_exit(replayed.exit_code, outcome.errors, parted)

    outcome.record = ReproRecord(
        run_id=run_dir.name,
        trace=str(request.trace.absolute()),
        suite=built.name,
        task=built.task,
        host=host,
        against=against,
        hosts=[host, against],
        fixtures_from_trace=request.fixtures_from_trace,
        fixture_tools=built.fixture_tools,
        steps=built.steps,
        errors=outcome.errors,
        parted=None if outcome.comparison is None else outcome.comparison.parted,
        comparison=None if outcome.comparison is None else outcome.comparison.to_json(),
        recorded_match=outcome.recorded_match,
        exit_code=outcome.exit_code,
    )
    write_json_atomic(RunDir(run_dir).repro_path, outcome.record.to_json())
    history.record_run(request.out, run_dir)
    return outcome
