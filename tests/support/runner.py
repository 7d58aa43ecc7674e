"""Build small suites on disk and run the runner as a user would (a subprocess, its real CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TRIAGE = REPO / "examples" / "suites" / "triage"

CONTRACT: dict[str, Any] = {
    "contract_id": "test.v1",
    "tools": [
        {"name": "flaky", "required_args": []},
        {"name": "lookup", "required_args": ["q"], "forbidden_args": ["secret_path"]},
        {"name": "shell", "required_args": ["argv"]},
        {"name": "read_file", "required_args": ["path"]},
        {"name": "write_file", "required_args": ["path", "content"]},
        {"name": "list_dir"},
    ],
    "invariants": ["no_absolute_local_paths", "no_home_directory_strings", "no_hostname_in_tool_args"],
}


def clean_env(**extra: str) -> dict[str, str]:
    """The environment a controller gives the runner: an allowlist, nothing secret-shaped."""
    env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TZ") if k in os.environ}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def write_suite(root: Path, tasks: dict[str, dict[str, Any]], *, suite_toml: str | None = None,
                contract: dict[str, Any] | None = None, tools: dict[str, Any] | None = None,
                agent_files: dict[str, str] | None = None) -> Path:
    """tasks: id -> {"toml": str, "prompt": str|None, "script": list|str|None, "repo": {path: text}}."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "suite.toml").write_text(suite_toml if suite_toml is not None else (
        'name = "t"\nrepeat = 1\n[agent]\nkind = "scripted"\n[budget]\nmax_steps = 8\ntimeout_s = 10\n'))
    (root / "contract.json").write_text(json.dumps(contract or CONTRACT))
    (root / "tools.json").write_text(json.dumps(tools or {"allow": ["sh run_tests.sh", "touch"], "deny": ["rm"]}))
    for name, text in (agent_files or {}).items():
        (root / "agent").mkdir(exist_ok=True)
        (root / "agent" / name).write_text(text)
    for task_id, spec in tasks.items():
        task_dir = root / "tasks" / task_id
        task_dir.mkdir(parents=True)
        (task_dir / "task.toml").write_text(spec.get("toml", ""))
        if spec.get("prompt", "do it") is not None:
            (task_dir / "prompt.md").write_text(spec.get("prompt", "do it"))
        script = spec.get("script")
        if script is not None:
            (task_dir / "script.json").write_text(script if isinstance(script, str) else json.dumps(script))
        for rel, text in spec.get("repo", {}).items():
            path = task_dir / "repo" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return root


def passable_to_attempts(path: Path) -> None:
    """Let every uid pass through ``path`` and the directories above it (o+x, never listing): a root
    runner's attempts run as uids of their own (``pidns+uid``) and must reach their workspace under it."""
    for d in (path, *path.parents):
        if d != Path("/"):
            d.chmod(d.stat().st_mode | 0o001)


#: shell text: the type of the mount over the attempts' root (``<root>/<task>.<attempt>.xxx/work`` is the
#: current directory), as the attempt's own mount namespace sees it, in ``$fs`` ("" when there is none)
ATTEMPTS_ROOT_MOUNT_SH = (
    'root=$(dirname "$(dirname "$PWD")")\n'
    'fs=$(awk -v r="$root" \'$5 == r { for (i = 6; i <= NF; i++) if ($i == "-") print $(i + 1) }\' '
    "/proc/self/mountinfo)\n"
)


def predicate_suite(root: Path, predicate: str, *, tasks: int, prefix: str = "t", name: str = "slow",
                    timeout_s: int = 30) -> Path:
    """``root/<name>``: a suite of predicate-only tasks (no agent), ``<prefix>-0`` ... each running the
    shell text ``predicate`` as its ``run_tests.sh`` (the triage suite's contract and tools)."""
    import shutil

    suite = root / name
    suite.mkdir()
    shutil.copy(TRIAGE / "contract.json", suite / "contract.json")
    shutil.copy(TRIAGE / "tools.json", suite / "tools.json")
    (suite / "suite.toml").write_text(
        f'name = "{name}"\nrepeat = 1\ncontract = "contract.json"\ntools = "tools.json"\n'
        f'[agent]\nkind = "none"\n[budget]\nmax_steps = 2\nmax_bytes = 4096\ntimeout_s = {timeout_s}\n'
    )
    for i in range(tasks):
        task = suite / "tasks" / f"{prefix}-{i}"
        (task / "repo").mkdir(parents=True)
        (task / "task.toml").write_text('description = "runs its predicate"\n[agent]\nkind = "none"\n')
        (task / "prompt.md").write_text("nothing to do\n")
        script = task / "repo" / "run_tests.sh"
        script.write_text(f"#!/bin/sh\n{predicate}\n")
        script.chmod(0o755)
    return suite


def own_machine_python(where: Path, name: str) -> Path:
    """A ``python`` for a ``local`` inventory entry that makes it a machine of its own: the runner runs
    in a private mount namespace whose /etc/machine-id is ``name``'s, so two local entries are two
    machines to crosshost's machine identity (two local entries are otherwise one machine:
    ``same_host``). On a machine without /etc/machine-id it is the interpreter as it is."""
    import hashlib

    machine_id = where / f"machine-id-{name}"
    machine_id.parent.mkdir(parents=True, exist_ok=True)
    machine_id.write_text(hashlib.sha256(name.encode()).hexdigest()[:32] + "\n")
    wrapper = where / f"python-{name}"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'test -e /etc/machine-id || exec "{sys.executable}" "$@"\n'
        "exec unshare --mount --propagation private sh -c "
        f"'mount --bind \"$0\" /etc/machine-id && exec \"$@\"' \"{machine_id}\" \"{sys.executable}\" \"$@\"\n"
    )
    wrapper.chmod(0o755)
    return wrapper


def run_runner(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent_runner", *args], capture_output=True, text=True,
                          env=env if env is not None else clean_env(), cwd=cwd or REPO, timeout=timeout)


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
