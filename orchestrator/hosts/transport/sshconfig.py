"""The user's OpenSSH client configuration (``~/.ssh/config``), read with ``paramiko.SSHConfig``.

Followed: Host aliases and patterns, HostName, User, Port, IdentityFile, IdentitiesOnly, ProxyJump,
ConnectTimeout. Not followed, and said once per host by ``crosshost hosts``: what would weaken the
security model (ForwardAgent yes, StrictHostKeyChecking no, UserKnownHostsFile: host keys are
always checked against crosshost's own known_hosts) and what crosshost cannot do (ProxyCommand,
Include). ``Match`` blocks are followed as paramiko evaluates them (``host``, ``originalhost``,
``user``, ``localuser``, ``canonical``, ``final``, ``all``); ``Match exec`` in any spelling (``Match
exec``, ``match=exec``, ``Match host x !exec ...``) is refused with its file and line: crosshost never
runs a command from ssh_config.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict

import paramiko

from orchestrator.errors import InventoryError

#: a ``Match`` line (``Match x``, ``Match=x``, any case), its criteria after it
_MATCH = re.compile(r"^\s*match(?:\s*=\s*|\s+)(.*)$", re.IGNORECASE)


def _runs_a_command(criteria: str) -> bool:
    """Whether a ``Match`` line's criteria hold ``exec`` (negated, quoted or ``exec=...`` too)."""
    return any(word.strip("\"'").lstrip("!").lower() == "exec" for word in re.split(r"[\s=]+", criteria))


#: the inventory keys ssh_config can give a host
SshKey = Literal["address", "port", "user", "identity_file", "identities_only", "proxy_jump", "connect_timeout_s"]


class SshSettings(TypedDict, total=False):
    """What ssh_config says of one alias, as inventory keys (``HostName`` is the address, always there)."""

    address: str
    port: int
    connect_timeout_s: float
    user: str
    identity_file: Path
    identities_only: bool
    proxy_jump: str


@dataclass(frozen=True)
class SshConfigFile:
    path: Path
    config: paramiko.SSHConfig

    def knows(self, alias: str) -> bool:
        """Whether a ``Host`` line other than ``*`` names ``alias`` (a typo'd alias is an error)."""
        # a Match block has no Host patterns (paramiko's get_hostnames assumes every block has some)
        names = {p for entry in self.config._config for p in entry.get("host", [])}
        patterns = [p for p in names if p != "*" and not p.startswith("!")]
        return any(fnmatch.fnmatch(alias, p) for p in patterns)

    def settings(self, alias: str) -> tuple[SshSettings, list[str]]:
        """The inventory keys ssh_config gives ``alias``, and what it says that is not followed."""
        opts = self.config.lookup(alias)
        where = f"{self.path} (Host {alias})"
        out = SshSettings(address=opts["hostname"])
        try:
            if "port" in opts:
                out["port"] = int(opts["port"])
            if "connecttimeout" in opts:
                out["connect_timeout_s"] = float(opts["connecttimeout"])
        except ValueError as exc:
            raise InventoryError(f"{where}: {exc}") from exc
        if "user" in opts:
            out["user"] = opts["user"]
        files = [Path(f).expanduser() for f in opts.get("identityfile", [])]
        if files:
            # OpenSSH tries each in turn; crosshost uses one: the first that exists
            out["identity_file"] = next((f for f in files if f.is_file()), files[0])
        if opts.get("identitiesonly", "no").lower() == "yes":
            out["identities_only"] = True
        jump = opts.get("proxyjump")
        if jump and jump.lower() != "none":
            out["proxy_jump"] = jump
        return out, self._notes(opts)

    def _notes(self, opts: Any) -> list[str]:
        notes = []
        if opts.get("forwardagent", "no").lower() not in ("no", ""):
            notes.append(f"ForwardAgent {opts['forwardagent']} (crosshost never forwards an agent)")
        if opts.get("stricthostkeychecking", "").lower() in ("no", "off", "accept-new"):
            notes.append(
                f"StrictHostKeyChecking {opts['stricthostkeychecking']} "
                "(host keys are always checked against crosshost's known_hosts)"
            )
        if "userknownhostsfile" in opts:
            notes.append(f"UserKnownHostsFile {opts['userknownhostsfile']} (crosshost uses its own known_hosts)")
        if opts.get("proxycommand"):
            notes.append("ProxyCommand (crosshost runs no command from ssh_config; use ProxyJump)")
        if "include" in opts:
            notes.append(f"Include {opts['include']} (not read)")
        return [f"{self.path}: not followed: {n}" for n in notes]


def read(path: Path, *, explicit: bool) -> SshConfigFile | None:
    """Parse ``path``; ``None`` when the default file does not exist. Errors name the file."""
    path = path.expanduser()
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        if not explicit:
            return None
        raise InventoryError(f"ssh_config {path}: no such file (set ssh_config = false to read none)") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(f"ssh_config {path}: cannot read it: {exc}") from exc
    for number, line in enumerate(text.splitlines(), start=1):
        match = _MATCH.match(line)
        if match and _runs_a_command(match.group(1)):
            raise InventoryError(
                f"ssh_config {path}:{number}: 'Match exec' runs a command, which crosshost never does; "
                "remove it, or set ssh_config = PATH (a file without it) or false in [defaults]"
            )
    try:
        config = paramiko.SSHConfig.from_text(text)
    except (paramiko.ssh_exception.ConfigParseError, ValueError) as exc:
        raise InventoryError(f"ssh_config {path}: {exc}") from exc
    if any(str(m.get("type", "")).lower() == "exec" for entry in config._config for m in entry.get("matches", [])):
        raise InventoryError(f"ssh_config {path}: a 'Match exec' block runs a command, which crosshost never does; "
                             "remove it, or set ssh_config = PATH (a file without it) or false in [defaults]")
    return SshConfigFile(path, config)
