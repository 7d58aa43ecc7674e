"""Suite input: a suite directory (suite.toml + tasks/<id>/task.toml) or its normalised ``suite.json``.

There is exactly one validator (``suite_from_dict``). ``read_suite(dir)`` reads the TOML layout (or a
shipped ``suite.json``) into the typed ``Suite``, whose ``data`` is the JSON-able dict the controller
ships as ``suite.json``; ``load_suite(dir)`` does the same for an absolute path. A task's agent
inherits the suite's by one rule (``inherit_agent``). Every problem is a ``SuiteError`` whose message names the file and what is
wrong. Files that stay files (``tasks/<id>/repo/``, ``agent/``) live next to ``suite.json``.
The typed model it builds is ``suite_model.py`` (its names are imported from here too).
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

from .checker import Contract, validate_contract
from .errors import InputError, SuiteError
from .jsonfile import JSONObject, JSONValue, decode_text, loads, read_regular
from .presets import PRESETS
from .suite_model import (
    AGENT_KINDS,
    CORRECTIONS,
    DEFAULT_BUDGET,
    EXEC_APIS,
    MAX_REPEAT,
    MODEL_KINDS,
    NETWORK_MODES,
    SCHEMA,
    AgentSpec,
    Budget,
    BudgetJSON,
    Gate,
    ScriptTurn,
    Suite,
    Task,
)
from .textguard import control_char
from .trace import FINISH_REASONS

TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}\Z")
SUITE_KEYS = {"name", "description", "repeat", "contract", "tools", "agent", "budget", "gate", "network"}
TASK_KEYS = {"description", "expect_tools", "forbid_tools", "must_finish", "fixtures", "budget", "agent", "tags",
             "expect_findings"}
#: what a negative golden task may declare it expects the checker to find ("kind:tool")
EXPECTABLE_FINDINGS = ("unknown_tool", "missing_args", "forbidden_args")
BUDGET_KEYS = set(DEFAULT_BUDGET)
MAX_TIMEOUT_S = 86400
#: the most steps and observation bytes an attempt may be given: far above any real task, and finite
MAX_BUDGET = {"max_steps": 100_000, "max_bytes": 1 << 30}
GATE_KEYS = {"flip_rate", "alpha", "burn_invalidates", "correction", "undecided"}

Where = Callable[[Optional[str], str], str]  # (task id or None, part) -> "file: location"
#: an ``[agent]`` key's rule: (required, check, what it must be)
OptionRule = Tuple[bool, Callable[[JSONValue], bool], str]
# --- reading files ---------------------------------------------------------------------------------


def _read_text(path: Path, what: str) -> str:
    """A suite file: a regular file (never a link, FIFO or device, refused before it is read), UTF-8."""
    try:
        return decode_text(read_regular(path, follow_links=False))
    except FileNotFoundError as exc:
        raise SuiteError(f"{path}: missing ({what})") from exc
    except OSError as exc:
        raise SuiteError(f"{path}: cannot read {what}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise SuiteError(f"{path}: cannot read {what}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def _read_json(path: Path, what: str) -> Any:
    text = _read_text(path, what)
    try:
        return loads(text)
    except ValueError as exc:
        raise SuiteError(f"{path}: not valid JSON: {exc}") from exc


def _read_toml(path: Path) -> JSONObject:
    text = _read_text(path, "TOML")
    try:  # Python 3.11+; imported here: on a host the suite arrives as suite.json and TOML is never read
        import tomllib as _toml  # novm (guarded: falls back below)
    except ImportError:  # pragma: no cover - only on Python < 3.11
        raise SuiteError(f"{path}: reading TOML needs Python 3.11+ (tomllib); ship the suite normalised "
                         f"as suite.json (crosshost does this in the bundle)") from None
    try:
        return _toml.loads(text)
    except _toml.TOMLDecodeError as exc:
        raise SuiteError(f"{path}: broken TOML: {exc}") from exc
    except RecursionError:
        raise SuiteError(f"{path}: broken TOML: nested too deeply") from None


def _inside(root: Path, rel: Any, where: str) -> Path:
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or ".." in Path(rel).parts:
        raise SuiteError(f"{where} must be a relative path inside the suite, got {rel!r}")
    return root / rel


def normalise_suite(directory: "str | os.PathLike[str]") -> JSONObject:
    """Read a suite directory (TOML layout) into the normalised, JSON-able dict (validated)."""
    return read_suite(directory).data


def read_suite(directory: "str | os.PathLike[str]") -> Suite:
    """A suite directory (suite.toml, else a shipped suite.json), validated; messages name its files
    as ``directory`` spells them."""
    root = Path(directory)
    if not root.is_dir():
        raise SuiteError(f"{root}: not a suite directory")
    if not (root / "suite.toml").is_file() and (root / "suite.json").is_file():
        shipped = _read_json(root / "suite.json", "normalised suite")
        return suite_from_dict(shipped, root, _json_where(root))
    suite_toml = root / "suite.toml"
    raw = _read_toml(suite_toml)
    unknown = sorted(set(raw) - SUITE_KEYS)
    if unknown:
        raise SuiteError(f"{suite_toml}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(SUITE_KEYS))})")
    contract_path = _inside(root, raw.get("contract", "contract.json"), f"{suite_toml}: contract")
    tools_path = _inside(root, raw.get("tools", "tools.json"), f"{suite_toml}: tools")
    contract = _read_json(contract_path, "the tool-shape contract")
    validate_contract(contract, str(contract_path), SuiteError)
    raw_agent = raw.get("agent")
    tasks: List[JSONValue] = []
    data: JSONObject = {
        "schema": SCHEMA,
        "name": raw.get("name", root.name),
        # A live model is sampled: three attempts per task unless the suite says otherwise.
        "repeat": raw.get("repeat", 3 if isinstance(raw_agent, dict) and raw_agent.get("kind") in MODEL_KINDS
                          else 1),
        "agent": raw.get("agent", {"kind": "scripted"}),
        "budget": raw.get("budget", {}),
        "gate": raw.get("gate", {}),
        "contract": contract,
        "tools": {},
        "tasks": tasks,
    }
    if "description" in raw:
        data["description"] = raw["description"]
    if "network" in raw:  # only when set: the pins of a suite that does not name it stay as they were
        data["network"] = raw["network"]
    tasks_dir = root / "tasks"
    if not tasks_dir.is_dir():
        raise SuiteError(f"{tasks_dir}: missing (a suite needs tasks/<task_id>/)")
    for task_dir in sorted(tasks_dir.iterdir()):
        if not task_dir.is_dir():
            continue
        task_id = task_dir.name
        if not TASK_ID.match(task_id):
            raise SuiteError(f"{task_dir}: task id {task_id!r} must be letters, digits, '-' or '_' "
                             f"(no '/', '.' or '..'), at most 64 characters")
        task_toml = task_dir / "task.toml"
        traw = _read_toml(task_toml)
        unknown = sorted(set(traw) - TASK_KEYS)
        if unknown:
            raise SuiteError(f"{task_toml}: unknown key(s) {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(TASK_KEYS))})")
        task: JSONObject = {
            "id": task_id,
            "prompt": _read_text(task_dir / "prompt.md", "the task's prompt"),
            "script": None,
            "fixtures": traw.get("fixtures", {}),
            "expect_tools": traw.get("expect_tools", []),
            "forbid_tools": traw.get("forbid_tools", []),
            "must_finish": traw.get("must_finish", "stop"),
            "budget": traw.get("budget", {}),
            "agent": traw.get("agent", {}),
        }
        if "description" in traw:
            task["description"] = traw["description"]
        if "tags" in traw:
            task["tags"] = traw["tags"]
        if "expect_findings" in traw:  # only where declared: other suites keep their digest
            task["expect_findings"] = traw["expect_findings"]
        own, base = task["agent"], data["agent"]
        kind = inherit_agent(own if isinstance(own, dict) else {}, base if isinstance(base, dict) else None).get("kind")
        script_path = task_dir / "script.json"
        if kind == "scripted" or script_path.exists():
            task["script"] = _read_json(script_path, "the scripted agent's turns")
        tasks.append(task)
    # tools.json is the shell's allow/deny list: needed when a task can call shell, or when named.
    callers = shell_callers(tasks, contract, data["agent"])
    if tools_path.exists() or "tools" in raw or callers:
        why = f"task {callers[0]!r} can call shell" if callers else "the shell allow/deny list"
        data["tools"] = _read_json(tools_path, why)
    return suite_from_dict(data, root, _toml_where(root))


def shell_callers(tasks: List[JSONValue], contract: Contract, suite_agent: JSONValue) -> List[str]:
    """The ids of the tasks that can call ``shell``: a script that calls it, or an agent that picks
    its own calls (command, openai) under a contract that declares it."""
    declared = any(isinstance(t, dict) and t.get("name") == "shell" for t in contract.get("tools") or [])
    base_kind = suite_agent.get("kind", "scripted") if isinstance(suite_agent, dict) else "scripted"
    found: List[str] = []
    for task in tasks:
        if not isinstance(task, dict):
            continue
        agent = task.get("agent")
        kind = agent.get("kind", base_kind) if isinstance(agent, dict) else base_kind
        script = task.get("script")
        script = script if isinstance(script, list) else []
        calls = {c.get("name") for turn in script if isinstance(turn, dict)
                 for c in _listed(turn.get("tool_calls")) if isinstance(c, dict)}
        if "shell" in calls or (declared and kind in ("command", "openai", "exec")):
            found.append(str(task.get("id")))
    return found


def _listed(value: JSONValue) -> List[JSONValue]:
    return value if isinstance(value, list) else []


def _toml_where(root: Path) -> Where:
    def where(task_id: Optional[str], part: str) -> str:
        if task_id is None:
            if part.startswith("contract"):
                return f"{root / 'contract.json'}: {part}"
            if part.startswith("tools"):
                return f"{root / 'tools.json'}: {part}"
            return f"{root / 'suite.toml'}: {part}"
        base = root / "tasks" / task_id
        if part.startswith("script"):
            return f"{base / 'script.json'}: {part}"
        if part.startswith("prompt"):
            return f"{base / 'prompt.md'}"
        return f"{base / 'task.toml'}: {part}"

    return where


def _json_where(root: Path) -> Where:
    shipped = str(root / "suite.json")  # once: every field of every task is named by it before it is checked

    def where(task_id: Optional[str], part: str) -> str:
        prefix = f"tasks[{task_id}]." if task_id is not None else ""
        return f"{shipped}: {prefix}{part}"

    return where


# --- the one validator -----------------------------------------------------------------------------


def _str_list(value: Any, where: str) -> List[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise SuiteError(f"{where} must be a list of non-empty strings")
    return list(value)


def _expected_findings(value: Any, where: str) -> List[str]:
    specs = _str_list(value, where)
    for spec in specs:
        kind, sep, tool = spec.partition(":")
        if kind not in EXPECTABLE_FINDINGS or not sep or not tool:
            raise SuiteError(f"{where}: {spec!r} must be \"kind:tool\" with kind one of "
                             f"{', '.join(EXPECTABLE_FINDINGS)} (e.g. \"unknown_tool:wipe_disk\")")
    return specs


TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


def _tags(value: Any, where: str) -> List[str]:
    tags = _str_list(value, where)
    for tag in tags:
        if not TAG.match(tag):
            raise SuiteError(f"{where}: tag {tag!r} must be letters, digits, '.', '_' or '-' (no ',' or spaces)")
    return tags


def _budget(raw: JSONValue, base: BudgetJSON, where: str) -> BudgetJSON:
    if not isinstance(raw, dict):
        raise SuiteError(f"{where} must be a table of {', '.join(sorted(BUDGET_KEYS))}")
    unknown = sorted(set(raw) - BUDGET_KEYS)
    if unknown:
        raise SuiteError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(BUDGET_KEYS))})")
    merged = base.copy()
    for key, value in raw.items():
        if key == "timeout_s":  # finite and at most a day: inf or NaN would break every attempt
            if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_TIMEOUT_S:
                merged["timeout_s"] = value
                continue
        elif isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_BUDGET[key]:
            if key == "max_steps":
                merged["max_steps"] = value
            else:
                merged["max_bytes"] = value
            continue
        what = f"number of seconds up to {MAX_TIMEOUT_S}" if key == "timeout_s" else f"integer up to {MAX_BUDGET[key]}"
        raise SuiteError(f"{where}.{key} must be a positive {what}, got {value!r}")
    return merged


def inherit_agent(own: JSONObject, suite: Optional[JSONObject]) -> JSONObject:
    """A task's ``[agent]`` over the suite's: the suite's keys, then the task's; a task that names
    another kind brings all its own options (none of the suite's)."""
    merged = dict(suite or {})
    if "kind" in own and own.get("kind") != merged.get("kind"):
        merged = {}
    merged.update(own)
    return merged


def _agent(raw: JSONValue, base: Optional[JSONObject], where: str) -> AgentSpec:
    if not isinstance(raw, dict):
        raise SuiteError(f"{where} must be a table with 'kind'")
    merged = inherit_agent(raw, base)
    kind = merged.get("kind")
    if not isinstance(kind, str) or kind not in AGENT_KINDS:
        raise SuiteError(f"{where}.kind: unknown agent kind {kind!r} (known: {', '.join(AGENT_KINDS)})")
    raw_command = merged.pop("command", None)
    merged.pop("kind")
    named = merged.get("preset")
    preset = PRESETS.get(named) if kind == "exec" and isinstance(named, str) else None
    if kind == "exec" and "preset" in merged and preset is None:
        raise SuiteError(f"{where}.preset must be one of {', '.join(repr(p) for p in PRESETS)}, "
                         f"got {merged['preset']!r}")
    command: Optional[List[str]] = None
    if preset is not None:  # the CLI's own command and API unless the suite names its own
        command = list(preset.command) if raw_command is None else None
        merged.setdefault("api", preset.api)
    if kind in ("command", "exec") and command is None:
        items = raw_command if isinstance(raw_command, list) else []
        command = [a for a in items if isinstance(a, str) and a]
        if not command or len(command) != len(items):
            raise SuiteError(f"{where}.command must be a non-empty list of strings for kind = \"{kind}\""
                             + (f" (or a preset: {', '.join(PRESETS)})" if kind == "exec" else ""))
    elif kind not in ("command", "exec") and raw_command is not None:
        raise SuiteError(f"{where}.command is only for kind = \"command\" or \"exec\" (kind is {kind!r})")
    if "sampled" in merged and (kind not in ("command", "openai", "exec") or not isinstance(merged["sampled"], bool)):
        raise SuiteError(f"{where}.sampled must be true or false, for kind = \"command\", \"openai\" or \"exec\" "
                         f"(kind is {kind!r}, sampled is {merged['sampled']!r})")
    if kind == "openai":
        _openai_options(merged, where)
    if kind == "exec":
        _openai_options(merged, where, _EXEC_KEYS, kind)
    return AgentSpec(kind=kind, command=command, options=merged)


# [agent] keys of kind = "openai": name -> (required, check, what it must be). The caps are enforced by
# the controller's model proxy; model/temperature/seed/max_tokens are sampling pins (in agent_sha).
_OPENAI_KEYS: Dict[str, OptionRule] = {
    "model": (True, lambda v: isinstance(v, str) and bool(v), "a model name"),
    "base_url": (True, lambda v: isinstance(v, str) and v.startswith(("http://", "https://")),
                 "an http:// or https:// URL"),
    "api_key_env": (True, lambda v: isinstance(v, str) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", v) is not None,
                    "the NAME of an environment variable on the controller (never the key itself)"),
    "temperature": (False, lambda v: _number_in(v, 0, 2), "a number from 0 to 2"),
    "seed": (False, lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "max_tokens": (False, lambda v: _positive_int(v), "a positive integer"),
    "max_requests": (False, lambda v: _positive_int(v), "a positive integer (model requests per run per host)"),
    "max_total_tokens": (False, lambda v: _positive_int(v), "a positive integer (tokens per run per host)"),
    "request_timeout_s": (False, lambda v: _number_in(v, 0, MAX_TIMEOUT_S) and v != 0,
                          f"a positive number of seconds up to {MAX_TIMEOUT_S}"),
    "sampled": (False, lambda v: isinstance(v, bool), "true or false (whether answers are draws)"),
    "hold_model": (False, lambda v: isinstance(v, bool) or v == "strict",
                   'true, false or "strict" (answer other hosts from the reference\'s model record)'),
}


def _number_in(v: JSONValue, low: float, high: float) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and low <= v <= high


def _positive_int(v: JSONValue) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


# kind = "exec": the program picks its own sampling settings; the suite names the wire format, the
# model it may ask for, the proxy's caps and whether the model is held.
_EXEC_KEYS: Dict[str, OptionRule] = {
    "preset": (False, lambda v: v in PRESETS, "one of " + ", ".join(f'"{p}"' for p in PRESETS)),
    "api": (True, lambda v: v in EXEC_APIS,
            '"openai" (chat completions or Responses), "anthropic" (messages) or "gemini" (generateContent)'),
    **{k: v for k, v in _OPENAI_KEYS.items()
       if k in ("model", "base_url", "api_key_env", "max_requests", "max_total_tokens", "request_timeout_s",
                "sampled", "hold_model")},
}


def _openai_options(options: JSONObject, where: str, keys: Optional[Dict[str, OptionRule]] = None,
                    kind: str = "openai") -> None:
    keys = _OPENAI_KEYS if keys is None else keys
    unknown = sorted(set(options) - set(keys))
    if unknown:
        raise SuiteError(f"{where}: unknown key(s) {', '.join(unknown)} for kind = \"{kind}\" "
                         f"(known: {', '.join(sorted(keys))})")
    for key, (required, ok, what) in keys.items():
        if key not in options:
            if required:
                raise SuiteError(f"{where}.{key} is required for kind = \"{kind}\" ({what})")
            continue
        if not ok(options[key]):
            # api_key_env may hold a pasted key by mistake: never echo its value.
            shown = "" if key == "api_key_env" else f", got {options[key]!r}"
            raise SuiteError(f"{where}.{key} must be {what}{shown}")


def _script(raw: Any, where: str) -> List[ScriptTurn]:
    """``raw`` checked as script.json's turns (every key ``ScriptTurn`` names)."""
    if not isinstance(raw, list):
        raise SuiteError(f"{where} must be a JSON list of turns, got a {type(raw).__name__}")
    for index, turn in enumerate(raw):
        at = f"{where}[{index}]"
        if not isinstance(turn, dict):
            raise SuiteError(f"{at} must be an object with 'tool_calls' or 'finish'")
        if "tool_calls" in turn:
            calls = turn["tool_calls"]
            if not isinstance(calls, list) or not calls:
                raise SuiteError(f"{at}.tool_calls must be a non-empty list")
            for n, call in enumerate(calls):
                if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
                    raise SuiteError(f"{at}.tool_calls[{n}] must be an object with a 'name'")
                if not isinstance(call.get("args", {}), dict):
                    raise SuiteError(f"{at}.tool_calls[{n}].args must be an object")
        elif "finish" in turn or "content" in turn:
            if turn.get("finish", "stop") != "stop":
                raise SuiteError(f"{at}.finish must be \"stop\" (the runner sets the other reasons)")
            if not isinstance(turn.get("content", ""), str):
                raise SuiteError(f"{at}.content must be a string")
        else:
            raise SuiteError(f"{at} must have 'tool_calls' or 'content'/'finish'")
    return raw


def parse_tools_policy(raw: Any, where: str, error: Type[InputError] = SuiteError) -> Dict[str, List[List[str]]]:
    """The allow/deny lists as argv prefixes; ``error`` names whose input is wrong (the suite's, or tools.json's)."""
    if not isinstance(raw, dict) or set(raw) - {"allow", "deny"}:
        raise error(f"{where} must be an object with only 'allow' and 'deny' lists")
    policy: Dict[str, List[List[str]]] = {}
    for key in ("allow", "deny"):
        entries = raw.get(key, [])
        if not isinstance(entries, list):
            raise error(f"{where}.{key} must be a list of commands")
        parsed: List[List[str]] = []
        for index, entry in enumerate(entries):
            if isinstance(entry, str):
                try:
                    tokens = shlex.split(entry)
                except ValueError as exc:
                    raise error(f"{where}.{key}[{index}]: {exc}") from exc
            elif isinstance(entry, list) and all(isinstance(t, str) for t in entry):
                tokens = list(entry)
            else:
                tokens = []
            if not tokens:
                raise error(f"{where}.{key}[{index}] must be a command string or a non-empty argv list")
            parsed.append(tokens)
        policy[key] = parsed
    return policy


def suite_from_dict(data: Any, root: Path, where: Optional[Where] = None) -> Suite:
    """Validate a normalised suite dict and build the dataclasses. The only suite validator; ``where``
    names a problem's place (default: ``<root>/suite.json``)."""
    where = where or _json_where(root)
    if not isinstance(data, dict):
        raise SuiteError(where(None, "the suite must be a JSON object"))
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SuiteError(where(None, "name must be a non-empty string"))
    bad = control_char(name)
    if bad:  # a name reaches unit files, crontab lines and terminals: no newline is ever valid in it
        raise SuiteError(where(None, f"name {name!r} holds a control character ({bad}); use a name on one line"))
    repeat = data.get("repeat", 1)
    if not isinstance(repeat, int) or isinstance(repeat, bool) or not 1 <= repeat <= MAX_REPEAT:
        raise SuiteError(where(None, f"repeat must be an integer from 1 to {MAX_REPEAT}, got {repeat!r}"))
    agent_raw = data.get("agent", {"kind": "scripted"})
    suite_agent = _agent(agent_raw, None, where(None, "[agent]"))
    budget = _budget(data.get("budget", {}), DEFAULT_BUDGET, where(None, "[budget]"))
    gate = data.get("gate", {})
    if not isinstance(gate, dict) or set(gate) - GATE_KEYS:
        raise SuiteError(where(None, f"[gate] may only hold {', '.join(sorted(GATE_KEYS))}"))
    rate = gate.get("flip_rate", Gate.flip_rate)
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0 <= rate <= 1:
        raise SuiteError(where(None, f"[gate].flip_rate must be a number from 0 to 1, got {rate!r}"))
    alpha = gate.get("alpha", Gate.alpha)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 < alpha < 1:
        raise SuiteError(where(None, f"[gate].alpha must be a number between 0 and 1 (exclusive), got {alpha!r}"))
    burn = gate.get("burn_invalidates", Gate.burn_invalidates)
    if not isinstance(burn, bool):
        raise SuiteError(where(None, f"[gate].burn_invalidates must be true or false, got {burn!r}"))
    correction = gate.get("correction", Gate.correction)
    if correction not in CORRECTIONS:
        raise SuiteError(where(None, f"[gate].correction must be \"bh\" (false discovery rate) or \"holm\" (family-wise), got {correction!r}"))
    undecided = gate.get("undecided", Gate.undecided)
    if not isinstance(undecided, int) or isinstance(undecided, bool) or undecided < 0:
        raise SuiteError(where(None, f"[gate].undecided must be a whole number of tasks, 0 or more, got {undecided!r}"))
    network = data.get("network", "isolated")
    if network not in NETWORK_MODES:
        raise SuiteError(where(None, f"network must be \"isolated\" or \"open\", got {network!r}"))
    contract = validate_contract(data.get("contract"), where(None, "contract"), SuiteError)
    tools = parse_tools_policy(data.get("tools", {}), where(None, "tools"))
    raw_tasks = data.get("tasks")
    if not isinstance(raw_tasks, list) or not raw_tasks:
        raise SuiteError(where(None, "the suite has no tasks (tasks/<task_id>/ with task.toml and prompt.md)"))
    tasks: List[Task] = []
    seen = set()
    for index, raw in enumerate(raw_tasks):
        if not isinstance(raw, dict):
            raise SuiteError(where(None, f"tasks[{index}] must be an object"))
        task_id = raw.get("id")
        if not isinstance(task_id, str) or not TASK_ID.match(task_id):
            raise SuiteError(where(None, f"tasks[{index}].id {task_id!r} must be letters, digits, '-' or '_' "
                                         f"(no '/', '.' or '..'), at most 64 characters"))
        if task_id in seen:
            raise SuiteError(where(None, f"task id {task_id!r} appears twice"))
        seen.add(task_id)
        prompt = raw.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise SuiteError(where(task_id, "prompt is missing or empty"))
        agent = _agent(raw.get("agent") or {}, suite_agent.to_dict(), where(task_id, "[agent]"))
        task_budget = _budget(raw.get("budget") or {}, budget, where(task_id, "[budget]"))
        script = raw.get("script")
        if agent.kind == "scripted" or script is not None:
            script = _script(script, where(task_id, "script"))
        fixtures = raw.get("fixtures", {})
        if not isinstance(fixtures, dict):
            raise SuiteError(where(task_id, "[fixtures] must be a table of tool name -> observation"))
        for tool, value in fixtures.items():
            if isinstance(value, dict):
                if not all(isinstance(v, str) for v in value.values()):
                    raise SuiteError(where(task_id, f"[fixtures].{tool}: every observation must be a string"))
            elif not isinstance(value, str):
                raise SuiteError(where(task_id, f"[fixtures].{tool} must be a string, or a table of "
                                                f"argument value -> string"))
        must_finish = raw.get("must_finish", "stop")
        if must_finish is not None and must_finish not in FINISH_REASONS:
            raise SuiteError(where(task_id, f"must_finish {must_finish!r} is not one of {', '.join(FINISH_REASONS)}"))
        repo = root / "tasks" / task_id / "repo"
        _check_predicate(repo, where(task_id, "repo"))
        tasks.append(Task(
            id=task_id,
            prompt=prompt,
            agent=agent,
            budget=Budget(**task_budget),
            script=script,
            fixtures=dict(fixtures),
            expect_tools=_str_list(raw.get("expect_tools", []), where(task_id, "expect_tools")),
            forbid_tools=_str_list(raw.get("forbid_tools", []), where(task_id, "forbid_tools")),
            must_finish=must_finish,
            repo_dir=repo if repo.is_dir() else None,
            tags=_tags(raw.get("tags", []), where(task_id, "tags")),
            expect_findings=_expected_findings(raw.get("expect_findings", []), where(task_id, "expect_findings")),
        ))
    normalised = dict(data)
    normalised["tools"] = tools
    return Suite(name=name, root=root, repeat=repeat, agent=suite_agent, budget=Budget(**budget),
                 gate=Gate(flip_rate=rate, alpha=alpha, burn_invalidates=burn, correction=correction, undecided=undecided), contract=contract, tools=tools, tasks=tasks, data=normalised,
                 network=network)


def _check_predicate(repo: Path, where: str) -> None:
    """A task's ``repo/`` and its ``run_tests.sh`` predicate: absent is fine (no predicate), present but
    unusable is an error of the suite, never a task that passes without being checked."""
    if os.path.lexists(repo) and (os.path.islink(repo) or not repo.is_dir()):
        raise SuiteError(f"{where}: {repo} must be a directory (the task's repository), not a file or link")
    predicate = repo / "run_tests.sh"
    if os.path.lexists(predicate) and (os.path.islink(predicate) or not predicate.is_file()):
        raise SuiteError(f"{where}: {predicate} must be a regular file (the task's predicate), not a directory or link")


def load_suite(directory: "str | os.PathLike[str]") -> Suite:
    """A suite from a directory holding suite.toml (TOML layout) or suite.json (normalised)."""
    root = Path(directory).resolve()
    if not root.is_dir():
        raise SuiteError(f"{directory}: not a suite directory (no such directory)")
    if (root / "suite.toml").is_file() or (root / "suite.json").is_file():
        return read_suite(root)
    raise SuiteError(f"{root}: not a suite (neither suite.toml nor suite.json)")
