"""The contract checker: tool shapes against ``contract.json`` and the host-leak invariants.

``check_turns`` is the one implementation; the runner scores each attempt with it and the controller
imports it. Leak invariants are checked against every fingerprint given (hostname, home, cwd), so a
trace replayed on box-b that still carries the reference host's hostname is caught too.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Set, TextIO, Tuple, Type

from .errors import ContractError, InputError
from .jsonfile import read_json
from .trace import read_trace

INVARIANTS = ("no_absolute_local_paths", "no_home_directory_strings", "no_hostname_in_tool_args")
SHAPE_KINDS = ("unknown_tool", "missing_args", "forbidden_args")
LEAK_KINDS = ("absolute_local_path", "home_directory", "hostname")
_INVARIANT_KIND = {
    "no_absolute_local_paths": "absolute_local_path",
    "no_home_directory_strings": "home_directory",
    "no_hostname_in_tool_args": "hostname",
}

# An absolute path under a root that only exists on a machine (POSIX), or a drive path (Windows).
# The look-behind keeps URL paths ("https://h/home/x") and relative paths ("a/tmp/b") out. /etc, /usr,
# /proc and /dev are the system's: the same path on every host tells nothing about this one.
_ABSOLUTE_LOCAL = re.compile(
    r"(?<![\w.~/:\-])/(?:Users|home|root|tmp|var|private|opt|mnt|srv|Volumes|run|media|"
    r"workspace|workspaces|data|nix|snap)(?=/|$|[\s\"'`,;)\]}])[^\s\"'`,;)\]}]*"
    r"|(?<![A-Za-z0-9])[A-Za-z]:\\[^\s\"'`,;]*"
    r"|(?<![A-Za-z0-9])[A-Za-z]:/(?!/)[^\s\"'`,;]*"
)
_HOME_STRING = re.compile(
    r"(?<![\w.~/\-])~(?:[A-Za-z_][\w\-]*)?(?=/|\\|$|\s)"
    r"|\$HOME\b|\$\{HOME\}|%USERPROFILE%|%HOMEPATH%"
    r"|(?<![\w.~/:\-])/(?:Users|home)/[^/\s\"'`]+"
    r"|(?<![A-Za-z0-9])[A-Za-z]:\\Users\\[^\\\s\"'`]+"
)


@dataclass
class Finding:
    kind: str
    message: str
    step: Optional[int] = None
    tool: Optional[str] = None

    @property
    def is_leak(self) -> bool:
        return self.kind in LEAK_KINDS

    def line(self) -> str:
        where = f"step {self.step}" if self.step is not None else "trace"
        tool = f" {self.tool}" if self.tool else ""
        return f"{where}{tool}: {self.kind}: {self.message}"

    def to_dict(self) -> Dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "step": self.step, "tool": self.tool}


def _string_list(value: Any, where: str, error: Type[InputError]) -> List[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise error(f"{where} must be a list of strings")
    return list(value)


def validate_contract(contract: Any, source: str, error: Type[InputError] = ContractError) -> Dict[str, Any]:
    """Check a parsed contract; ``source`` names the file in every message, ``error`` is raised (a
    contract embedded in a suite is the suite's error)."""
    if not isinstance(contract, dict):
        raise error(f"{source}: the contract must be a JSON object with 'tools'")
    tools = contract.get("tools")
    if not isinstance(tools, list):
        raise error(f"{source}: 'tools' must be a list of tool objects")
    seen: Set[str] = set()
    for index, tool in enumerate(tools):
        where = f"{source}: tools[{index}]"
        if not isinstance(tool, dict):
            raise error(f"{where} must be an object with a 'name'")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise error(f"{where} has no 'name'")
        if name in seen:
            raise error(f"{where}: tool {name!r} is listed twice")
        seen.add(name)
        for key in ("required_args", "forbidden_args", "result_shape"):
            if key in tool:
                _string_list(tool[key], f"{where} ({name}).{key}", error)
        if "parameters" in tool and not isinstance(tool["parameters"], dict):
            raise error(f"{where} ({name}).parameters must be a JSON schema object")
    invariants = _string_list(contract.get("invariants", []), f"{source}: 'invariants'", error)
    for invariant in invariants:
        if invariant not in INVARIANTS:
            raise error(f"{source}: unknown invariant {invariant!r} (known: {', '.join(INVARIANTS)})")
    allowed = _string_list(contract.get("allowed_paths", []), f"{source}: 'allowed_paths'", error)
    for prefix in allowed:
        if not prefix.startswith("/") or prefix.rstrip("/") == "":
            raise error(f"{source}: 'allowed_paths' entry {prefix!r} must be an absolute path prefix below /")
    return contract


def load_contract(path: "str | os.PathLike[str]") -> Dict[str, Any]:
    """Read and validate ``contract.json``; ContractError names the file and what is wrong."""
    name = os.fspath(path)
    return validate_contract(read_json(name, "contract", ContractError), name)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _path_re(path: str) -> "re.Pattern[str]":
    """``path`` as a whole path (``/root`` in ``/root/x``, not in ``/rootfs``)."""
    return re.compile(r"(?<![\w.\-])" + re.escape(path.rstrip("/")) + r"(?![\w.\-])")


def _word_re(word: str) -> "re.Pattern[str]":
    """``word`` between any two non-alphanumeric characters: ``box-a`` in ``record-for-box-a`` and
    ``box_a.log``, not in ``box-ab``."""
    return re.compile(r"(?<![A-Za-z0-9])" + re.escape(word) + r"(?![A-Za-z0-9])", re.IGNORECASE)


def _host_facts(fingerprints: Sequence[Dict[str, Any]]) -> Tuple[List[str], List[str], List[str]]:
    hostnames: List[str] = []
    homes: List[str] = []
    cwds: List[str] = []
    for fingerprint in fingerprints:
        hostname = fingerprint.get("hostname")
        if isinstance(hostname, str) and hostname and hostname.lower() != "localhost":
            for name in (hostname, hostname.split(".")[0]):
                if len(name) >= 2 and name not in hostnames:
                    hostnames.append(name)
        home = fingerprint.get("home")
        if isinstance(home, str) and len(home.rstrip("/")) > 1 and home not in homes:
            homes.append(home)
        cwd = fingerprint.get("cwd")
        if isinstance(cwd, str) and len(cwd.rstrip("/")) > 1 and cwd not in cwds:
            cwds.append(cwd)
    return hostnames, homes, cwds


LeakMatch = Tuple[str, str, str]  # (kind, matched value, message)
_MEMO_LIMIT = 4096  # argument strings (and turn shapes) remembered at once; the memo is cleared when full


class TurnChecker:
    """``check_turns`` prepared once for a contract and a set of fingerprints.

    Everything that does not depend on the turn is done here once: the contract's tool table, the
    invariants, every host's facts and their compiled patterns. The leak scan of an argument string
    is memoised (a long trace repeats the same argument strings over and over), and so is the whole
    verdict on a turn whose arguments are flat strings (``turn_findings``). The answers are the ones
    ``check_turns`` always gave; only repeated work is skipped.
    """

    def __init__(self, contract: Dict[str, Any], fingerprints: Sequence[Dict[str, Any]]) -> None:
        self.contract_id = contract.get("contract_id", "?")
        self.tools = {t["name"]: t for t in contract.get("tools", []) if isinstance(t, dict) and "name" in t}
        self.invariants = set(contract.get("invariants", []))
        hostnames, homes, cwds = _host_facts(fingerprints)
        check_paths = "no_absolute_local_paths" in self.invariants
        check_homes = "no_home_directory_strings" in self.invariants
        check_hosts = "no_hostname_in_tool_args" in self.invariants
        # (needle for the substring fast path, whole-path pattern, original) per host path
        self._cwds = [(c.rstrip("/"), _path_re(c), c) for c in cwds] if check_paths else []
        self._homes = [(h.rstrip("/"), _path_re(h), h) for h in homes] if check_homes else []
        self._hostnames = [(h.lower(), _word_re(h), h) for h in hostnames] if check_hosts else []
        self._check_paths, self._check_homes = check_paths, check_homes
        # paths the contract says are the same on every host (a shared mount, a tool's install dir)
        self._allowed = tuple(p.rstrip("/") for p in contract.get("allowed_paths", []) if isinstance(p, str))
        self._leak_memo: Dict[str, Tuple[LeakMatch, ...]] = {}
        self._turn_memo: Dict[Any, Tuple[Tuple[str, str], ...]] = {}

    def leaks(self, text: str) -> Tuple[LeakMatch, ...]:
        """Every leak in one argument string, in the order of the invariants."""
        found = self._leak_memo.get(text)
        if found is None:
            found = tuple(self._scan(text))
            if len(self._leak_memo) >= _MEMO_LIMIT:
                self._leak_memo.clear()
            self._leak_memo[text] = found
        return found

    def _scan(self, text: str) -> Iterator[LeakMatch]:
        if self._check_paths:
            for needle, pattern, cwd in self._cwds:
                if needle in text and pattern.search(text):
                    yield "absolute_local_path", cwd, f"a host's working directory {cwd!r} in an argument"
            for match in _ABSOLUTE_LOCAL.finditer(text):
                path = match.group(0)
                if any(path == p or path.startswith(p + "/") for p in self._allowed):
                    continue
                yield "absolute_local_path", path, f"absolute local path {path!r}"
        if self._check_homes:
            for needle, pattern, home in self._homes:
                if needle in text and pattern.search(text):
                    yield "home_directory", home, f"a host's home directory {home!r} in an argument"
            for match in _HOME_STRING.finditer(text):
                yield "home_directory", match.group(0), f"home directory string {match.group(0)!r}"
        if self._hostnames:
            lowered = text.lower()  # once per string, not once per host
            for needle, pattern, hostname in self._hostnames:
                if needle in lowered and pattern.search(text):
                    yield "hostname", hostname.lower(), f"hostname {hostname!r} in an argument"

    def turn_findings(self, name: str, args: Dict[str, Any]) -> Tuple[Tuple[str, str], ...]:
        """(kind, message) of every finding in one turn, without its step; see ``check``."""
        try:
            key: Any = (name, tuple(args.items()))
            found = self._turn_memo.get(key)
        except TypeError:  # a list or object among the values: not hashable, not memoised
            key, found = None, None
        if found is None:
            found = self._turn_findings(name, args)
            # Only flat string (or null) arguments are remembered: 1 == 1.0 == True as dict keys, and
            # although the checker ignores non-string values, a memo that conflates them is a trap.
            if key is not None and all(type(v) is str or v is None for v in args.values()):
                if len(self._turn_memo) >= _MEMO_LIMIT:
                    self._turn_memo.clear()
                self._turn_memo[key] = found
        return found

    def _turn_findings(self, name: str, args: Dict[str, Any]) -> Tuple[Tuple[str, str], ...]:
        found: List[Tuple[str, str]] = []
        spec = self.tools.get(name)
        if spec is None:
            found.append(("unknown_tool", f"{name!r} is not in contract {self.contract_id}"))
        else:
            for arg in spec.get("required_args", []):
                if arg not in args:
                    found.append(("missing_args", f"required argument {arg!r} is missing"))
            for arg in spec.get("forbidden_args", []):
                if arg in args:
                    found.append(("forbidden_args", f"forbidden argument {arg!r} is present"))
        seen: Set[Tuple[str, str]] = set()
        for text in _strings(args):
            for kind, what, message in self.leaks(text):
                if (kind, what) not in seen:
                    seen.add((kind, what))
                    found.append((kind, message))
        return tuple(found)

    def check(self, turns: Iterable[Dict[str, Any]]) -> List[Finding]:
        findings: List[Finding] = []
        for turn in turns:
            step = turn.get("step")
            name = str(turn.get("tool"))
            raw_args = turn.get("args")
            args: Dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
            for kind, message in self.turn_findings(name, args):
                findings.append(Finding(kind, message, step, name))
        return findings


def check_turns(contract: Dict[str, Any], turns: Iterable[Dict[str, Any]],
                fingerprints: Sequence[Dict[str, Any]]) -> List[Finding]:
    """Every contract violation and host leak in ``turns`` (dicts with "step", "tool", "args")."""
    return TurnChecker(contract, fingerprints).check(turns)


def load_fingerprints(path: "str | os.PathLike[str]") -> List[Dict[str, Any]]:
    """A fingerprint JSON object, or a list of them (e.g. one per host of a run)."""
    name = os.fspath(path)
    data = read_json(name, "fingerprint")
    items = data if isinstance(data, list) else [data]
    if not items or not all(isinstance(item, dict) for item in items):
        raise InputError(f"{name}: a fingerprint must be a JSON object (or a list of them)")
    return items


def check_files(contract_path: str, trace_path: str, fingerprint_path: str, out: TextIO) -> int:
    """The ``check`` command: PASS or FAIL and one reason a line; 0 pass, 1 fail (2 is raised)."""
    contract = load_contract(contract_path)
    fingerprints = load_fingerprints(fingerprint_path)
    trace = read_trace(trace_path)
    findings = check_turns(contract, trace.turns, fingerprints)
    reasons = [f.line() for f in findings] + [f"trace: {p}" for p in trace.problems]
    out.write(("FAIL" if reasons else "PASS") + "\n")
    for reason in reasons:
        out.write(reason + "\n")
    return 1 if reasons else 0
