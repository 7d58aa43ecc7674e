"""``crosshost hosts``: can each host be used, and what is it? One row per host.

Per host (in the same bounded pool as a replay): connect (``--accept-new`` records an unknown key in
the tool-owned known_hosts; a changed key is refused even then), push the runner zipapp into a
throw-away run directory ``<workspace_root>/runs/probe-<hex>-<name>``, take its fingerprint exactly
as a replay does (``host_fingerprint.take_fingerprint``: same directory layout, clean environment and
pinned values, so the digest is the one a replay records), then remove the directory and verify it
is gone. ``--suite`` adds the versions of the commands its tools.json allows, as a replay
of that suite records them.
"""

from __future__ import annotations

import json
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import (
    AuthenticationFailed,
    HostError,
    HostKeyRejected,
    HostUnreachable,
    TransferError,
    WorkspaceLeft,
)
from orchestrator.hosts.fanout import default_jobs, fan_out
from orchestrator.hosts.fingerprint import take_fingerprint
from orchestrator.hosts.transport import Opener, default_opener
from orchestrator.hosts.transport.base import ConnectRetry, Host
from orchestrator.hosts.workspace import Workspace

#: failures that mean the host was never connected
_UNREACHABLE = (HostUnreachable, HostKeyRejected, AuthenticationFailed)


@dataclass
class ProbeResult:
    name: str
    transport: str
    reachable: bool = False
    python: str | None = None
    fingerprint: str | None = None
    hostname: str | None = None
    findings: list[dict[str, str]] = field(default_factory=list)  # the fingerprint's (Fingerprint.findings)
    retries: int = 0
    cleaned: bool | None = None
    error: str | None = None
    #: ssh_config directives not followed for this host (said once, under the table)
    notes: list[str] = field(default_factory=list)


def probe_host(
    cfg: Any, runner: Path, *, opener: Opener, accept_new: bool, tools: Path | None = None
) -> ProbeResult:
    result = ProbeResult(cfg.name, cfg.transport)

    def on_retry(_info: ConnectRetry) -> None:
        result.retries += 1

    host: Host = opener(cfg, accept_new=accept_new, on_retry=on_retry)
    result.reachable = True
    probe_id = f"probe-{secrets.token_hex(6)}"
    ws = Workspace(host, cfg.name, cfg.workspace_root, probe_id, cfg.python)
    try:
        ws.create(failure=TransferError)
        remote_runner = ws.put(runner, "runner.pyz")
        remote_tools = ws.put(tools, "tools.json") if tools is not None else None
        ws.put_pins(cfg.env)
        fp = take_fingerprint(host, cfg, remote_runner, ws.path, tools=remote_tools)
        result.fingerprint = fp.fingerprint
        result.python = fp.python
        result.hostname = fp.hostname
        result.findings = [f for f in fp.findings if isinstance(f, dict)] if isinstance(fp.findings, list) else []
    finally:
        try:
            result.cleaned = ws.remove()
        except HostError:
            result.cleaned = False
        host.close()
    if not result.cleaned:
        raise WorkspaceLeft(cfg.name, f"{ws.path} could not be removed")
    return result


def probe(
    inventory_path: Path, *, accept_new: bool = False, opener: Opener | None = None, suite: Path | None = None
) -> list[ProbeResult]:
    from orchestrator.hints import host_error_line, inventory_words
    from orchestrator.hosts.bundle import read_suite
    from orchestrator.hosts.inventory import load_inventory
    from orchestrator.hosts.runner_zipapp import build_runner_zipapp

    inventory = load_inventory(inventory_path)
    configs = {h.name: h for h in inventory.hosts}
    # The suite's shell policy as its runner reads it (validated, normalised): a replay records the
    # versions of the commands it allows, so the probe does too.
    policy = read_suite(suite.resolve()).tools if suite is not None else None
    with tempfile.TemporaryDirectory(prefix="crosshost-probe-") as tmp:
        runner = build_runner_zipapp(Path(tmp))
        tools = None
        if policy is not None:
            tools = Path(tmp) / "tools.json"
            tools.write_text(json.dumps(policy))
        fan = fan_out(
            list(configs),
            lambda n: probe_host(
                configs[n], runner, opener=opener or default_opener, accept_new=accept_new, tools=tools
            ),
            jobs=default_jobs(len(configs)),
        )
    results: list[ProbeResult] = []
    for name, outcome in fan.outcomes.items():
        if outcome.value is not None:
            results.append(outcome.value)
            continue
        exc = outcome.error
        assert exc is not None  # an outcome holds a value or an error
        rerun = ["hosts", *inventory_words(inventory_path), *(["--suite", str(suite)] if suite is not None else [])]
        res = ProbeResult(name, configs[name].transport, error=host_error_line(exc, rerun))
        # Reachable only when the failure came after the connection: an error of any other kind
        # (say, a key that could not be used) must not read as "reachable" when a replay cannot connect.
        res.reachable = isinstance(exc, HostError) and not isinstance(exc, _UNREACHABLE)
        results.append(res)
    for res in results:
        res.notes = list(configs[res.name].notes)
    return results
