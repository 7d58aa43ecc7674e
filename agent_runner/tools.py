"""The tools an agent may call: fixture tools, and the built-ins confined to the attempt's workspace.

Every call is checked against the contract first. A tool outside the contract, a forbidden argument,
a missing required argument, a shell command outside tools.json, or a path out of the workspace gets
an error observation and starts no process.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .capped import Captured, capture
from .errors import ContractError
from .jsonfile import JSONObject, JSONValue, read_json
from .recordclass import dataclass
from .sandbox import NONE, Sandbox
from .suite import parse_tools_policy

BUILTIN_TOOLS = ("shell", "read_file", "write_file", "list_dir")
MAX_OUTPUT_BYTES = 64 * 1024  # per tool call; the budget's max_bytes caps the total


@dataclass
class ToolResult:
    """What a tool call returned to the agent (its error, if it failed)."""

    observation: str
    error: Optional[str] = None


def _error(message: str) -> ToolResult:
    return ToolResult(observation=f"error: {message}", error=message)


def load_policy(path: "str | os.PathLike[str]") -> Dict[str, List[List[str]]]:
    """Read tools.json ({"allow": [...], "deny": [...]}); ContractError names the file."""
    name = os.fspath(path)
    return parse_tools_policy(read_json(name, "tools.json", ContractError), name, ContractError)


def _prefix(argv: Sequence[str], entry: Sequence[str], by_basename: bool) -> bool:
    if len(argv) < len(entry):
        return False
    head = os.path.basename(argv[0]) if by_basename else argv[0]
    want = os.path.basename(entry[0]) if by_basename else entry[0]
    return head == want and list(argv[1:len(entry)]) == list(entry[1:])


def shell_verdict(argv: Sequence[str], policy: Mapping[str, Sequence[Sequence[str]]]) -> Optional[str]:
    """None when tools.json lets ``argv`` run, else why not. Deny wins and matches by program basename,
    so "/bin/rm" is as denied as "rm"; allow matches the program exactly as written."""
    for entry in policy.get("deny", []):
        if _prefix(argv, entry, by_basename=True):
            return f"denied by tools.json deny entry {' '.join(entry)!r}"
    for entry in policy.get("allow", []):
        if _prefix(argv, entry, by_basename=False):
            return None
    return f"{' '.join(argv)!r} is not allowed by tools.json"


def _shown(got: Captured) -> str:
    """The kept head of a command's output, and how much more it printed."""
    text = got.kept.decode("utf-8", "replace")
    if got.dropped:
        text += f"\n[truncated {got.dropped} bytes]"
    return text


def _is_dir_at(fd: int, name: str) -> bool:
    """``name`` in the directory ``fd`` is a directory or a link to one (a name gone meanwhile: not one)."""
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=fd).st_mode)
    except OSError:
        return False


def _cap(data: bytes, limit: int = MAX_OUTPUT_BYTES) -> str:
    text = data[:limit].decode("utf-8", "replace")
    if len(data) > limit:
        text += f"\n[truncated {len(data) - limit} bytes]"
    return text


class ToolBox:
    def __init__(self, contract: Mapping[str, Any], policy: Mapping[str, Sequence[Sequence[str]]],
                 fixtures: Mapping[str, Any], workspace: Path, env: Mapping[str, str],
                 sandbox: Optional[Sandbox] = None) -> None:
        self.tools = {t["name"]: t for t in contract.get("tools", [])}
        self.contract_id = contract.get("contract_id", "?")
        self.policy = policy
        self.fixtures = fixtures
        self.workspace = Path(os.path.realpath(workspace))
        self.env = dict(env)
        self.processes_started = 0
        self.sandbox = sandbox or Sandbox(NONE)

    def call(self, name: str, args: JSONValue, timeout_s: float) -> ToolResult:
        spec = self.tools.get(name)
        if spec is None:
            return _error(f"unknown tool {name!r}: it is not in contract {self.contract_id}")
        if not isinstance(args, dict):
            return _error(f"{name}: arguments must be a JSON object")
        forbidden = [a for a in spec.get("forbidden_args", []) if a in args]
        if forbidden:
            return _error(f"{name}: forbidden argument(s) {', '.join(forbidden)}")
        missing = [a for a in spec.get("required_args", []) if a not in args]
        if missing:
            return _error(f"{name}: missing required argument(s) {', '.join(missing)}")
        if name in self.fixtures:
            return self._fixture(name, args)
        if name == "shell":
            return self._shell(args, timeout_s)
        if name == "read_file":
            return self._read_file(args)
        if name == "write_file":
            return self._write_file(args)
        if name == "list_dir":
            return self._list_dir(args)
        return _error(f"{name}: this task has no fixture for it")

    # --- fixtures ---

    def _fixture(self, name: str, args: JSONObject) -> ToolResult:
        value = self.fixtures[name]
        if isinstance(value, dict):  # keyed by an argument value, "*" = any other
            for arg in args.values():
                if isinstance(arg, (str, int, float)) and not isinstance(arg, bool) and str(arg) in value:
                    value = value[str(arg)]
                    break
            else:
                if "*" not in value:
                    shown = json.dumps(args, sort_keys=True)
                    return _error(f"{name}: no such target {shown}")
                value = value["*"]
        text = str(value)
        if text.startswith("error:"):
            return ToolResult(observation=text, error=text[len("error:"):].strip() or "error")
        return ToolResult(observation=text)

    # --- built-ins ---

    def _path(self, raw: JSONValue) -> Path:
        """A path inside the workspace, or ValueError saying why not."""
        if not isinstance(raw, str) or not raw:
            raise ValueError("'path' must be a non-empty string")
        if ".." in Path(raw).parts:
            raise ValueError(f"path {raw!r} may not contain '..'")
        candidate = Path(raw) if os.path.isabs(raw) else self.workspace / raw
        resolved = Path(os.path.realpath(candidate))
        if resolved != self.workspace and self.workspace not in resolved.parents:
            raise ValueError(f"path {raw!r} is outside the workspace")
        return resolved

    def _open_beneath(self, path: Path, flags: int, *, make_parents: bool = False, regular: bool = False) -> int:
        """A descriptor of ``path`` (``_path``'s: inside the workspace, no link in it), opened from the
        workspace one name at a time and never through a link. The runner may be root and the
        attempt's processes run meanwhile: a name they turn into a link after ``_path`` looked is
        refused here (ELOOP, ENOTDIR), not followed out of the workspace. ``regular``: anything but a
        regular file is refused (opened with ``O_NONBLOCK``: a FIFO is never waited on)."""
        names = path.relative_to(self.workspace).parts
        fd = os.open(self.workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for i, name in enumerate(names):
                last = i == len(names) - 1
                if make_parents and not last:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, 0o777, dir_fd=fd)
                how = (flags | (os.O_NONBLOCK if regular else 0)) if last else os.O_RDONLY | os.O_DIRECTORY
                nfd = os.open(name, how | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=fd)
                os.close(fd)
                fd = nfd
            if regular and not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{str(path.relative_to(self.workspace))!r} is not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _read_file(self, args: JSONObject) -> ToolResult:
        try:
            path = self._path(args.get("path"))
            with os.fdopen(self._open_beneath(path, os.O_RDONLY, regular=True), "rb") as handle:
                data = handle.read(MAX_OUTPUT_BYTES + 1)
        except ValueError as exc:
            return _error(f"read_file: {exc}")
        except OSError as exc:
            return _error(f"read_file: {exc.strerror or exc}")
        return ToolResult(observation=_cap(data))

    def _write_file(self, args: JSONObject) -> ToolResult:
        content = args.get("content")
        if not isinstance(content, str):
            return _error("write_file: 'content' must be a string")
        try:
            path = self._path(args.get("path"))
            fd = self._open_beneath(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, make_parents=True, regular=True)
            with os.fdopen(fd, "wb") as handle:
                handle.write(content.encode("utf-8"))
        except ValueError as exc:
            return _error(f"write_file: {exc}")
        except OSError as exc:
            return _error(f"write_file: {exc.strerror or exc}")
        return ToolResult(observation=f"wrote {len(content.encode('utf-8'))} bytes")

    def _list_dir(self, args: JSONObject) -> ToolResult:
        try:
            path = self._path(args.get("path", "."))
            fd = self._open_beneath(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                names = sorted(n + ("/" if _is_dir_at(fd, n) else "") for n in os.listdir(fd))
            finally:
                os.close(fd)
        except ValueError as exc:
            return _error(f"list_dir: {exc}")
        except OSError as exc:
            return _error(f"list_dir: {exc.strerror or exc}")
        return ToolResult(observation="\n".join(names))

    def _shell(self, args: JSONObject, timeout_s: float) -> ToolResult:
        raw = args.get("argv")
        items = raw if isinstance(raw, list) else []
        argv = [a for a in items if isinstance(a, str) and a]
        if not argv or len(argv) != len(items):
            return _error("shell: 'argv' must be a non-empty list of strings")
        refused = shell_verdict(argv, self.policy)
        if refused:
            return _error(f"shell: {refused}")
        missing = self.sandbox.cannot_start(argv[0], str(self.workspace), self.env)
        if missing:
            return _error(f"shell: cannot start {argv[0]!r}: {missing}")
        try:
            proc = self.sandbox.popen(argv, cwd=str(self.workspace), env=self.env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as exc:
            return _error(f"shell: cannot start {argv[0]!r}: {exc.strerror or exc}")
        self.processes_started += 1
        try:
            got = capture(proc, timeout_s, MAX_OUTPUT_BYTES, keep="head", on_timeout=proc.kill_group)
        finally:
            proc.kill_group()  # not ended (an error): it and what it started die; ended: its wait killed them
        if got.timed_out:
            return ToolResult(observation=f"error: timed out\n{_shown(got)}", error="timed out")
        if got.signal_name is not None:
            return ToolResult(observation=f"{got.death}\n{_shown(got)}")
        oom = f"{got.death}\n" if got.death else ""
        return ToolResult(observation=f"exit {got.returncode}\n{oom}{_shown(got)}")
