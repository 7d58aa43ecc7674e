"""The runner's fingerprint of a host, taken one way for ``crosshost hosts`` and ``crosshost replay``.

The digest must describe the host, not the run: the runner is started exactly as a replay's runner
is, in ``<workspace_root>/runs/<run_id>-<name>/work`` (where a replay's attempts work), through
``env -i`` with the inventory's allowlist and its pinned values (``remote.clean_env_command``); the
working directory itself is not digested. Two probes of a host, and a probe and a replay, then print
the same 16 hex (for a suite whose tools.json allows commands, pass it: their versions are part of
the digest).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable
from typing import Any

from agent_runner.jsonfile import loads as json_loads
from agent_runner.records import Fingerprint
from agent_runner.redact import redact_text
from orchestrator.errors import RunnerCrashed
from orchestrator.hosts import remote
from orchestrator.hosts.transport.base import Host

#: the runner is killed after this long (the fingerprint runs each allowed command's --version)
FINGERPRINT_KILL_AFTER_S = 60


def run_workspace(workspace_root: str, run_id: str, name: str) -> str:
    """``<workspace_root>/runs/<run_id>-<name>``: one run's (or probe's) directory on a host, for the
    inventory entry ``name``: two names for one machine never share one."""
    return posixpath.join(workspace_root, "runs", f"{run_id}-{name}")


def work_dir(workspace: str) -> str:
    """Where a run's attempt workspaces go, and the directory the fingerprint describes."""
    return posixpath.join(workspace, "work")


def fingerprint_script(
    cfg: Any,
    runner: str,
    workspace: str,
    *,
    tools: str | None = None,
    suite: str | None = None,
    argv: Callable[[list[str]], list[str]] | None = None,
) -> str:
    """``runner.pyz fingerprint`` as shell text, started as a replay's runner is: in ``workspace``'s
    ``work`` directory (made, 711, when a run's exec left it to a runner that did not get so far), through ``env -i`` with the allowlist and the pinned values
    (from the workspace's pins file, ``Workspace.put_pins``), under ``timeout -s KILL``. The commands
    whose versions it records are those a tools.json (``tools``) or the suite (``suite``, a directory
    on the host) allows. ``argv``: the runner's command line for these arguments (default
    ``remote.runner_argv`` of ``runner``; a replay's checks its bundle first)."""
    args = ["fingerprint"]
    if tools:
        args += ["--tools", tools]
    if suite:
        args += ["--suite", suite]
    if not cfg.attempts_in_memory:  # described as the run's attempts get it (agent_runner/attempt_memory.py)
        args.append("--attempts-on-disk")
    command = argv(args) if argv is not None else remote.runner_argv(cfg.python, runner, args)
    cmd = remote.clean_env_command(
        cfg.env_allowlist, command, pinned=list(cfg.env), pins_file=remote.pins_path(workspace)
    )
    work = remote.q(work_dir(workspace))
    return (
        f"{{ test -d {work} || mkdir -m 711 {work}; }} && cd {work} "
        f"&& exec timeout -s KILL {FINGERPRINT_KILL_AFTER_S} {cmd}"
    )


def take_fingerprint(
    host: Host, cfg: Any, runner: str, workspace: str, *, tools: str | None = None
) -> Fingerprint:
    """Run ``runner.pyz fingerprint`` on ``host`` in ``workspace``'s ``work`` directory (which must
    exist, with the pins file when ``cfg`` pins values).

    ``cfg`` is the host's inventory entry (python, env_allowlist, env, name); ``tools`` a tools.json
    path on the host. A failure is RunnerCrashed naming the host.
    """
    script = fingerprint_script(cfg, runner, workspace, tools=tools)
    res = host.exec(["sh", "-c", script], FINGERPRINT_KILL_AFTER_S + 30)
    if not res.ok:
        raise RunnerCrashed(
            cfg.name, f"fingerprint failed (exit {res.exit_code}): {tail(res.stderr or res.stdout)}"
        )
    try:
        fp = json_loads(res.stdout)
    except json.JSONDecodeError as exc:
        raise RunnerCrashed(cfg.name, f"fingerprint printed no JSON: {tail(res.stdout)}") from exc
    if not isinstance(fp, dict):
        raise RunnerCrashed(cfg.name, "fingerprint printed JSON that is not an object")
    return Fingerprint.from_json(fp)


def tail(text: str, n: int = 300) -> str:
    """The last ``n`` characters of a host's output, on one line, secrets redacted: it reaches the
    manifest and the terminal. Redacted before cutting, so a cut never leaves half a token visible."""
    text = " ".join(redact_text(text).split())
    return text if len(text) <= n else "…" + text[-n:]
