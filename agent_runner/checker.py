"""The contract checker: tool shapes against ``contract.json`` and the host-leak invariants.

``check_turns`` is the one implementation; the runner scores each attempt with it and the controller
imports it. Leak invariants are checked against every fingerprint given (hostname, home, cwd), so a
trace replayed on box-b that still carries the reference host's hostname is caught too. Each leak
says which rule fired and on what. A match of a generic host name (``vm``, ``api``) is only a
``weak`` candidate here: whether it is a leak takes the other hosts' arguments, which only the
controller sees (orchestrator/analysis/leaks.py).
"""

from __future__ import annotations

import os
import re
from typing import (
    Any,
    Dict,
    Iterable,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Set,
    TextIO,
    Tuple,
    Type,
    TypedDict,
    cast,
)

from .errors import ContractError, InputError
from .jsonfile import JSONObject, JSONValue, read_json
from .recordclass import dataclass
from .records import FindingJSON, TurnCall
from .trace import read_trace
from .words import is_generic_name

INVARIANTS = ("no_absolute_local_paths", "no_home_directory_strings", "no_hostname_in_tool_args")
LEAK_KINDS = ("absolute_local_path", "home_directory", "hostname")
#: the leak kind each invariant turns on (the controller's cross-host rule reads it too)
INVARIANT_KIND = {
    "no_absolute_local_paths": "absolute_local_path",
    "no_home_directory_strings": "home_directory",
    "no_hostname_in_tool_args": "hostname",
}

# Every absolute path in an argument: POSIX (the look-arounds keep URL paths such as
# "https://h/home/x" and relative paths such as "a/tmp/b" out; "box-b:/root/x" is a path) or a Windows
# drive path. Whether it is a leak is decided by where it points (``TurnChecker._path_rule``).
_ABSOLUTE_PATH = re.compile(
    r"(?<![\w.~/\-])/(?!/)[^\s\"'`,;)\]}]+"
    r"|(?<![\w.\-])[A-Za-z]:\\[^\s\"'`,;]*"
    r"|(?<![\w.\-])[A-Za-z]:/(?!/)[^\s\"'`,;]*"
)
# A home directory of some user (whoever's it is, it exists on one machine only).
_USER_HOME = re.compile(r"/(?:home|Users)/[^/]+|/root(?=/|$)|[A-Za-z]:[\\/]Users[\\/][^\\/]+", re.IGNORECASE)
# The user's and the system's temp directories: what is in them was made on this machine, by this run.
TEMP_ROOTS = ("/tmp", "/var/tmp", "/private/tmp", "/private/var/folders", "/var/folders", "/dev/shm", "/run/user")
_WINDOWS_TEMP = re.compile(r"[A-Za-z]:[\\/](?:Windows[\\/])?Te?mp(?=[\\/]|$)", re.IGNORECASE)
_HOME_STRING = re.compile(
    r"(?<![\w.~/\-])~(?:[A-Za-z_][\w\-]*)?(?=/|\\|$|\s)"
    r"|\$HOME\b|\$\{HOME\}|%USERPROFILE%|%HOMEPATH%"
    r"|(?<![\w.~/:\-])/(?:Users|home)/[^/\s\"'`]+"
    r"|(?<![A-Za-z0-9])[A-Za-z]:\\Users\\[^\\\s\"'`]+"
)
_EVIDENCE_CHARS = 120  # of an argument string quoted as a finding's evidence


class Hit(NamedTuple):
    """One finding of one turn, without its step: what ``TurnChecker.turn_findings`` returns."""

    kind: str
    message: str
    rule: str = ""  # which rule fired (docs/verdicts.md); empty for contract findings
    evidence: str = ""  # what it fired on: the argument and why it counts
    weak: bool = False  # a leak candidate that needs cross-host evidence: reported, not a leak


@dataclass
class Finding:
    """One broken rule of the contract, found in a trace."""

    kind: str
    message: str
    step: Optional[int] = None
    tool: Optional[str] = None
    rule: str = ""
    evidence: str = ""
    weak: bool = False

    @property
    def is_leak(self) -> bool:
        return self.kind in LEAK_KINDS and not self.weak

    def line(self) -> str:
        where = f"step {self.step}" if self.step is not None else "trace"
        tool = f" {self.tool}" if self.tool else ""
        said = f"{where}{tool}: {self.kind}: {self.message}"
        if self.rule:
            said += f" [{'weak, ' if self.weak else ''}{self.rule}: {self.evidence}]"
        return said

    def to_dict(self) -> FindingJSON:
        record: FindingJSON = {"kind": self.kind, "message": self.message, "step": self.step, "tool": self.tool}
        if self.rule:
            record["rule"], record["evidence"], record["weak"] = self.rule, self.evidence, self.weak
        return record


class _ContractToolName(TypedDict):
    name: str


class ContractTool(_ContractToolName, total=False):
    """One entry of the contract's ``tools`` (``validate_contract`` checked the keys named here; a
    contract may hold others, passed on unread)."""

    description: JSONValue  # shown to the model when it is a string
    parameters: JSONObject  # the tool's JSON schema
    required_args: List[str]
    forbidden_args: List[str]
    result_shape: List[str]


class _ContractTools(TypedDict):
    tools: List[ContractTool]


class Contract(_ContractTools, total=False):
    """``contract.json``, the tool-shape contract, as ``validate_contract`` passed it."""

    contract_id: JSONValue  # named in messages
    invariants: List[str]
    allowed_paths: List[str]
    host_paths: List[str]


def _string_list(value: Any, where: str, error: Type[InputError]) -> List[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise error(f"{where} must be a list of strings")
    return list(value)


def validate_contract(contract: Any, source: str, error: Type[InputError] = ContractError) -> Contract:
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
    for key in ("allowed_paths", "host_paths"):
        for prefix in _string_list(contract.get(key, []), f"{source}: {key!r}", error):
            if not prefix.startswith("/") or prefix.rstrip("/") == "":
                raise error(f"{source}: {key!r} entry {prefix!r} must be an absolute path prefix below /")
    return cast(Contract, contract)  # every key Contract names was checked above


def load_contract(path: "str | os.PathLike[str]") -> Contract:
    """Read and validate ``contract.json``; ContractError names the file and what is wrong."""
    name = os.fspath(path)
    return validate_contract(read_json(name, "contract", ContractError), name)


def arg_strings(value: Any, key: str = "", sort_keys: bool = False) -> Iterator[Tuple[str, str]]:
    """(where, text) of every string in an argument value: ``title``, ``note.deep[0]``; with
    ``sort_keys`` an object's keys in sorted order (two equal objects may hold them in another)."""
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for name, item in sorted(value.items()) if sort_keys else value.items():
            yield from arg_strings(item, f"{key}.{name}" if key else str(name), sort_keys)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from arg_strings(item, f"{key}[{index}]", sort_keys)


def _path_re(path: str) -> "re.Pattern[str]":
    """``path`` as a whole path (``/root`` in ``/root/x``, not in ``/rootfs``)."""
    return re.compile(r"(?<![\w.\-])" + re.escape(path.rstrip("/")) + r"(?![\w.\-])")


def _word_re(word: str) -> "re.Pattern[str]":
    """``word`` between any two non-alphanumeric characters: ``box-a`` in ``record-for-box-a`` and
    ``box_a.log``, not in ``box-ab``."""
    return re.compile(r"(?<![A-Za-z0-9])" + re.escape(word) + r"(?![A-Za-z0-9])", re.IGNORECASE)


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def generic_reason(name: str) -> Optional[str]:
    """Why a host name is too generic for its match alone to be a leak, or None when it is not."""
    if len(name) <= 3:
        return "3 characters or fewer"
    if is_generic_name(name):
        return "a dictionary word"
    return None


def host_names(hostname: Any) -> List[str]:
    """The names a host's hostname is matched by: itself and its first label; ``localhost`` and
    one-letter names are never matched (every sentence has an "a")."""
    names: List[str] = []
    if isinstance(hostname, str) and hostname and hostname.lower() != "localhost":
        for name in (hostname, hostname.split(".")[0]):
            if len(name) >= 2 and name not in names:
                names.append(name)
    return names


def host_dir(value: Any) -> Optional[str]:
    """A home or working directory worth matching (not ``/`` and not empty), without its trailing /."""
    if isinstance(value, str) and len(value.rstrip("/")) > 1:
        return value.rstrip("/")
    return None


def _host_facts(fingerprints: Sequence[JSONObject]) -> Tuple[List[str], List[str], List[str]]:
    hostnames: List[str] = []
    homes: List[str] = []
    cwds: List[str] = []
    for fingerprint in fingerprints:
        hostnames += [n for n in host_names(fingerprint.get("hostname")) if n not in hostnames]
        for value, into in ((fingerprint.get("home"), homes), (fingerprint.get("cwd"), cwds)):
            path = host_dir(value)
            if path is not None and path not in into:
                into.append(path)
    return hostnames, homes, cwds


def quote_evidence(where: str, text: str, start: int = 0, end: int = 0) -> str:
    """``where='text'``, cut to a window around [start, end) when the string is long."""
    if len(text) > _EVIDENCE_CHARS:
        lo = max(0, min(start - _EVIDENCE_CHARS // 3, len(text) - _EVIDENCE_CHARS))
        text = ("…" if lo else "") + text[lo:lo + _EVIDENCE_CHARS] + ("…" if lo + _EVIDENCE_CHARS < len(text) else "")
    return f"{where}={text!r}" if where else repr(text)


class LeakMatch(NamedTuple):
    """One leak (or weak candidate) in one argument string."""

    kind: str
    what: str  # the matched value: the same one twice in a turn is one finding
    message: str
    rule: str
    why: str  # the evidence after the argument's quote
    start: int
    weak: bool = False


_MEMO_LIMIT = 4096  # argument strings (and turn shapes) remembered at once; the memo is cleared when full


class TurnChecker:
    """``check_turns`` prepared once for a contract and a set of fingerprints.

    Everything that does not depend on the turn is done here once: the contract's tool table, the
    invariants, every host's facts and their compiled patterns. The leak scan of an argument string
    is memoised (a long trace repeats the same argument strings over and over), and so is the whole
    verdict on a turn whose arguments are flat strings (``turn_findings``). The answers are the ones
    ``check_turns`` always gave; only repeated work is skipped.
    """

    def __init__(self, contract: Contract, fingerprints: Sequence[JSONObject]) -> None:
        """``fingerprints``: each host's fingerprint as JSON (``fingerprint.json``, or another tool's):
        its ``hostname``, ``home`` and ``cwd`` are read, each when it is a string."""
        self.contract_id = contract.get("contract_id", "?")
        self.tools = {t["name"]: t for t in contract.get("tools", []) if isinstance(t, dict) and "name" in t}
        self.invariants = set(contract.get("invariants", []))
        hostnames, homes, cwds = _host_facts(fingerprints)
        check_paths = "no_absolute_local_paths" in self.invariants
        check_homes = "no_home_directory_strings" in self.invariants
        check_hosts = "no_hostname_in_tool_args" in self.invariants
        # (needle for the substring fast path, original) per host path; its whole-path pattern is
        # compiled the first time its needle is found (``_path``): an attempt's own directories are
        # new paths each time, and most of its turns never name them
        self._cwds = [(c, c) for c in cwds] if check_paths else []
        self._homes = [(h, h) for h in homes] if check_homes else []
        self._paths: Dict[str, "re.Pattern[str]"] = {}
        self._home_dirs = homes  # where an absolute path points into a home, whichever invariant is on
        # (needle, name, why it is generic or None); a name's pattern is compiled the first time its
        # needle is found (``_word``): a fleet's hundreds of names mostly never are
        self._hostnames = [(h.lower(), h, generic_reason(h)) for h in hostnames] if check_hosts else []
        self._words: Dict[str, "re.Pattern[str]"] = {}
        self._check_paths, self._check_homes = check_paths, check_homes

        def prefixes(paths: List[str]) -> Tuple[str, ...]:
            return tuple(p.rstrip("/") for p in paths if isinstance(p, str) and p.rstrip("/"))

        # paths the contract says are the same on every host (a shared mount, a tool's install dir),
        # and paths it says are this host's own (they are leaks like a home directory)
        self._allowed = prefixes(contract.get("allowed_paths", []))
        self._host_paths = prefixes(contract.get("host_paths", []))
        self._leak_memo: Dict[str, Tuple[LeakMatch, ...]] = {}
        self._turn_memo: Dict[Any, Tuple[Hit, ...]] = {}

    def leaks(self, text: str) -> Tuple[LeakMatch, ...]:
        """Every leak (and weak candidate) in one argument string, in the order of the invariants."""
        found = self._leak_memo.get(text)
        if found is None:
            found = tuple(self._scan(text))
            if len(self._leak_memo) >= _MEMO_LIMIT:
                self._leak_memo.clear()
            self._leak_memo[text] = found
        return found

    def _path(self, path: str) -> "re.Pattern[str]":
        pattern = self._paths.get(path)
        if pattern is None:
            pattern = self._paths[path] = _path_re(path)
        return pattern

    def _word(self, name: str) -> "re.Pattern[str]":
        pattern = self._words.get(name)
        if pattern is None:
            pattern = self._words[name] = _word_re(name)
        return pattern

    def _allowed_path(self, path: str) -> bool:
        return any(_under(path, p) for p in self._allowed)

    def _path_rule(self, path: str) -> Optional[Tuple[str, str]]:
        """(rule, why) when ``path`` is host-specific; None for a path that is the same on every host."""
        for home in self._home_dirs:
            if _under(path, home):
                return "user_home", f"under {home}, a host's home directory"
        someone = _USER_HOME.match(path)
        if someone is not None:
            return "user_home", f"under {someone.group(0)}, a home directory"
        for root in TEMP_ROOTS:
            if _under(path, root):
                return "temp_dir", f"under {root}, a temp directory"
        temp = _WINDOWS_TEMP.match(path)
        if temp is not None:
            return "temp_dir", f"under {temp.group(0)}, a temp directory"
        for prefix in self._host_paths:
            if _under(path, prefix):
                return "contract_host_path", f"under {prefix}, one of the contract's host_paths"
        return None

    def _scan(self, text: str) -> Iterator[LeakMatch]:
        # where a host's own directory was found: a hostname inside it (crosshost names workspaces after
        # the inventory name) is that directory's leak, not one of its own
        spans: List[Tuple[int, int]] = []
        if self._check_paths:
            workspaces: List[str] = []
            for needle, cwd in self._cwds:
                if needle in text and not self._allowed_path(cwd):
                    pattern = self._path(cwd)
                    match = pattern.search(text)
                    if match is not None:
                        workspaces.append(cwd)
                        spans += [m.span() for m in pattern.finditer(text)]
                        yield LeakMatch("absolute_local_path", cwd, f"a host's working directory {cwd!r} in an argument",
                                        "workspace", f"holds {cwd}, a host's working directory", match.start())
            for match in _ABSOLUTE_PATH.finditer(text):
                path = match.group(0).rstrip(".")
                if self._allowed_path(path) or any(_under(path, w) for w in workspaces):
                    continue
                specific = self._path_rule(path)
                if specific is not None:
                    yield LeakMatch("absolute_local_path", path, f"absolute local path {path!r}", specific[0],
                                    specific[1], match.start())
        if self._check_homes:
            for needle, home in self._homes:
                if needle in text:
                    pattern = self._path(home)
                    match = pattern.search(text)
                    if match is not None:
                        spans += [m.span() for m in pattern.finditer(text)]
                        yield LeakMatch("home_directory", home, f"a host's home directory {home!r} in an argument",
                                        "host_home", f"holds {home}, a host's home directory", match.start())
            for match in _HOME_STRING.finditer(text):
                said = match.group(0)
                shorthand = said[:1] in "~$%"
                why = "stands for the home directory" if shorthand else "is a home directory"
                yield LeakMatch("home_directory", said, f"home directory string {said!r}",
                                "home_shorthand" if shorthand else "user_home", f"{said} {why}", match.start())
        if self._hostnames:
            lowered = text.lower()  # once per string, not once per host
            for needle, hostname, generic in self._hostnames:
                if needle in lowered:
                    match = next((m for m in self._word(hostname).finditer(text)
                                  if not any(a <= m.start() and m.end() <= b for a, b in spans)), None)
                    if match is None:
                        continue
                    if generic is None:
                        yield LeakMatch("hostname", hostname.lower(), f"hostname {hostname!r} in an argument",
                                        "distinct_hostname", f"holds {hostname!r}, a host's hostname", match.start())
                    else:
                        yield LeakMatch("hostname", hostname.lower(), f"hostname {hostname!r} in an argument",
                                        "generic_hostname",
                                        f"holds {hostname!r}, a host's hostname, but a generic one ({generic}): a leak only "
                                        "where another host's arguments differ by their own hostname", match.start(),
                                        True)

    def turn_findings(self, name: str, args: JSONObject) -> Tuple[Hit, ...]:
        """Every finding of one turn, without its step; see ``check``."""
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

    def _turn_findings(self, name: str, args: JSONObject) -> Tuple[Hit, ...]:
        found: List[Hit] = []
        spec = self.tools.get(name)
        if spec is None:
            found.append(Hit("unknown_tool", f"{name!r} is not in contract {self.contract_id}"))
        else:
            for arg in spec.get("required_args", []):
                if arg not in args:
                    found.append(Hit("missing_args", f"required argument {arg!r} is missing"))
            for arg in spec.get("forbidden_args", []):
                if arg in args:
                    found.append(Hit("forbidden_args", f"forbidden argument {arg!r} is present"))
        seen: Set[Tuple[str, str]] = set()
        for where, text in arg_strings(args):
            for leak in self.leaks(text):
                if (leak.kind, leak.what) not in seen:
                    seen.add((leak.kind, leak.what))
                    evidence = f"{quote_evidence(where, text, leak.start)}: {leak.why}"
                    found.append(Hit(leak.kind, leak.message, leak.rule, evidence, leak.weak))
        return tuple(found)

    def check(self, turns: Iterable[TurnCall]) -> List[Finding]:
        findings: List[Finding] = []
        for turn in turns:
            step = turn.get("step")
            name = str(turn.get("tool"))
            raw_args = turn.get("args")
            args: JSONObject = raw_args if isinstance(raw_args, dict) else {}
            for hit in self.turn_findings(name, args):
                findings.append(Finding(hit.kind, hit.message, step, name, hit.rule, hit.evidence, hit.weak))
        return findings


def check_turns(contract: Contract, turns: Iterable[TurnCall],
                fingerprints: Sequence[JSONObject]) -> List[Finding]:
    """Every contract violation, host leak and weak leak candidate in ``turns`` (dicts with "step",
    "tool", "args"). Only ``is_leak`` findings and contract findings fail an attempt; a weak one is
    reported and left to the controller, which alone sees the other hosts' arguments."""
    return TurnChecker(contract, fingerprints).check(turns)


def load_fingerprints(path: "str | os.PathLike[str]") -> List[JSONObject]:
    """A fingerprint JSON object, or a list of them (e.g. one per host of a run)."""
    name = os.fspath(path)
    data = read_json(name, "fingerprint")
    items = data if isinstance(data, list) else [data]
    if not items or not all(isinstance(item, dict) for item in items):
        raise InputError(f"{name}: a fingerprint must be a JSON object (or a list of them)")
    return items


def check_files(contract_path: str, trace_path: str, fingerprint_path: str, out: TextIO) -> int:
    """The ``check`` command: PASS or FAIL and one reason a line, then one ``weak:`` line per weak
    finding (they do not fail it); 0 pass, 1 fail (2 is raised)."""
    contract = load_contract(contract_path)
    fingerprints = load_fingerprints(fingerprint_path)
    trace = read_trace(trace_path)
    findings = check_turns(contract, [t.call() for t in trace.turns], fingerprints)
    reasons = [f.line() for f in findings if not f.weak] + [f"trace: {p}" for p in trace.problems]
    out.write(("FAIL" if reasons else "PASS") + "\n")
    for reason in reasons + [f"weak: {f.line()}" for f in findings if f.weak]:
        out.write(reason + "\n")
    return 1 if reasons else 0
