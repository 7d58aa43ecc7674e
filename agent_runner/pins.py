"""Pins: the digests that say two hosts ran the same thing (prompt, tools, predicate, contract, runner
sources, agent, budget)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .errors import RunnerError
from .records import RUNNER_SOURCE_PIN
from .suite import Suite, Task


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha(obj: Any) -> str:
    data = obj if isinstance(obj, bytes) else canonical(obj)
    return hashlib.sha256(data).hexdigest()


#: caches a tool or an interpreter writes beside the files (a command agent's ``__pycache__`` on the
#: host's bundle cache): never part of a suite, never shipped, never pinned
CACHE_NAMES = frozenset({"__pycache__", ".git", ".DS_Store", ".pytest_cache", ".mypy_cache", ".ruff_cache"})


def is_cache_name(name: str) -> bool:
    return name in CACHE_NAMES or name.endswith(".pyc")


def tree_sha(root: Path) -> str:
    """Digest of a directory: every entry's relative path, kind and content. File modes are left out:
    an archive or umask may change them, and the predicate runs through ``sh`` anyway. Caches are left
    out too: an agent that imports a module writes ``__pycache__`` on its first attempt, and the pin must
    not move between attempt 0 and attempt 1."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not is_cache_name(d))
        kept = [f for f in filenames if not is_cache_name(f)]
        for name in sorted(kept + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                digest.update(f"L {rel} -> {os.readlink(path)}\n".encode())
            else:
                with open(path, "rb") as handle:
                    content = hashlib.sha256(handle.read()).hexdigest()
                digest.update(f"F {rel} {content}\n".encode())
    return digest.hexdigest()


#: where the checked start's sealed copy of the zipapp is (a ``memfd``): never a path on disk
SEALED_PREFIX = "/proc/self/fd/"


def import_root() -> str:
    """The ``sys.path`` entry the runner is imported from: its zipapp (``SEALED_PREFIX`` and a
    descriptor: the checked start's sealed copy of it), its compiled copy, or the directory holding
    ``agent_runner``."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def runner_home() -> str:
    """That place on disk, resolved: where another process imports the runner from, and what the
    runner's own reads are. For the sealed copy, the bundle's ``runner.pyz`` its start left as
    ``sys.argv[0]``."""
    root = import_root()
    return os.path.realpath(sys.argv[0] if root.startswith(SEALED_PREFIX) else root)


def runner_sources() -> List[Tuple[str, bytes]]:
    """The runner's own ``*.py`` files, sorted by name, from the source tree or from the zipapp."""
    package_dir = os.path.dirname(os.path.abspath(__file__))
    if os.path.isdir(package_dir):
        names = sorted(n for n in os.listdir(package_dir) if n.endswith(".py"))
        out = []
        for name in names:
            with open(os.path.join(package_dir, name), "rb") as handle:
                out.append((name, handle.read()))
        return out
    # Inside a zipapp the loader is a zipimporter: it knows the archive and our prefix in it.
    loader = globals().get("__loader__")
    archive = getattr(loader, "archive", None)
    prefix = getattr(loader, "prefix", "agent_runner/")
    if not archive:
        raise RunnerError(f"{package_dir}: cannot locate the runner's own sources")
    import zipfile  # only a runner imported from its zipapp reads it

    with zipfile.ZipFile(archive) as bundle:
        return sorted(
            (n[len(prefix):], bundle.read(n))
            for n in bundle.namelist()
            if n.startswith(prefix) and n.endswith(".py") and "/" not in n[len(prefix):]
        )


_RUNNER_SOURCE_SHA: Optional[str] = None


def runner_source_sha() -> str:
    """sha256 of the runner's ``*.py`` sources: identical in the zipapp, in the source tree and on every
    host (the zipapp's own digest, ``zipapp_sha``, is the bundle's and the manifest's)."""
    global _RUNNER_SOURCE_SHA
    if _RUNNER_SOURCE_SHA is None:
        digest = hashlib.sha256()
        for name, content in runner_sources():
            digest.update(name.encode() + b"\0" + hashlib.sha256(content).digest())
        _RUNNER_SOURCE_SHA = digest.hexdigest()
    return _RUNNER_SOURCE_SHA


def task_pins(suite: Suite, task: Task) -> Dict[str, Any]:
    """The pins of one task, as written in every trace header."""
    agent_files: Optional[str] = None
    if task.agent.kind == "command" and (suite.root / "agent").is_dir():
        agent_files = tree_sha(suite.root / "agent")
    return {
        "prompt_sha": sha(task.prompt.encode("utf-8")),
        "tools_sha": sha({"tools": suite.tools, "fixtures": task.fixtures}),
        "predicate_sha": tree_sha(task.repo_dir) if task.repo_dir is not None else None,
        "contract_sha": sha(suite.contract),
        RUNNER_SOURCE_PIN: runner_source_sha(),
        "agent_sha": sha({"agent": task.agent.to_dict(), "script": task.script, "files": agent_files}),
        "budget": task.budget.to_dict(),
    }


def env_sha(fingerprint: str, pins: Dict[str, Any]) -> str:
    """16 hex; changes when the host's fingerprint or the task's pins change."""
    return sha({"fingerprint": fingerprint, "pins": pins})[:16]
