"""hosts.toml: the inventory of hosts a suite is replayed on (format in docs/inventory.md).

``load_inventory(path)`` merges ``[defaults]`` into every host, resolves relative paths against the
file's directory, and validates everything with pydantic. Every error is one ``InventoryError``
line naming the file, the host and the key: ``hosts.toml: host 'box-b': unknown key 'adress'``.
The first host is the reference.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agent_runner.redact import is_secret_env_key
from orchestrator.errors import InventoryError

DEFAULT_ENV_ALLOWLIST = ["PATH", "LANG", "LC_ALL", "TZ"]
MAX_TIMEOUT_S = 86_400.0
MAX_CONNECT_TIMEOUT_S = 600.0
#: a host's name becomes a directory (runs/<id>/hosts/<name>/): keep it a plain file name
_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class HostConfig(BaseModel):
    """One host of the inventory, with ``[defaults]`` merged in and paths made absolute."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    transport: Literal["local", "ssh"] = "ssh"
    address: str | None = None
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = None
    identity_file: Path | None = None
    known_hosts: Path | None = None
    env_allowlist: list[str] = Field(default_factory=lambda: list(DEFAULT_ENV_ALLOWLIST))
    env: dict[str, str] = Field(default_factory=dict)
    workspace_root: str = "/tmp/crosshost"
    # finite and bounded: they become `timeout -s KILL N` and socket timeouts (inf would crash the run)
    timeout_s: float = Field(default=120, gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)
    python: str = "python3"
    connect_timeout_s: float = Field(default=10, gt=0, le=MAX_CONNECT_TIMEOUT_S, allow_inf_nan=False)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not _HOST_NAME.match(v):
            raise ValueError("must be letters, digits, '.', '_' or '-' (it names a directory)")
        return v

    @field_validator("env_allowlist")
    @classmethod
    def _env_keys(cls, v: list[str]) -> list[str]:
        for key in v:
            if not _ENV_KEY.match(key):
                raise ValueError(f"{key!r} is not an environment variable name")
            if is_secret_env_key(key):
                # the runner would refuse to start on every host; say so here, before any host is touched
                raise ValueError(f"{key!r} is secret-shaped; a secret must never reach a host's runner")
        return v

    @field_validator("env")
    @classmethod
    def _env_values(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if "\x00" in value:
                raise ValueError(f"{key!r}: a NUL byte cannot be passed in an environment value")
        return v

    @field_validator("workspace_root")
    @classmethod
    def _absolute_root(cls, v: str) -> str:
        if not v.startswith("/") or v.rstrip("/") == "":
            raise ValueError("must be an absolute path below / (workspaces are removed under it)")
        if any(part in (".", "..") for part in v.split("/")) or "\x00" in v:
            raise ValueError("must be a plain absolute path, without '.' or '..' (workspaces are removed under it)")
        return v.rstrip("/")

    def public_dict(self) -> dict[str, Any]:
        """What the manifest records: no key or known_hosts paths (they are the controller's)."""
        data = self.model_dump(mode="json", exclude={"identity_file", "known_hosts"})
        return data


class Inventory(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: Path
    hosts: list[HostConfig]

    @property
    def reference(self) -> HostConfig:
        return self.hosts[0]

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def get(self, name: str) -> HostConfig:
        for host in self.hosts:
            if host.name == name:
                return host
        raise InventoryError(f"{self.path}: no host {name!r} (hosts: {', '.join(self.names)})")

    def select(self, names: list[str]) -> list[HostConfig]:
        """The named hosts, in inventory order; an unknown name is an error."""
        wanted = set(names)
        for name in names:
            self.get(name)
        return [h for h in self.hosts if h.name in wanted]


_TOP_KEYS = {"defaults", "hosts"}
_NOT_A_DEFAULT = {"name"}
_PATH_KEYS = ("identity_file", "known_hosts")


def load_inventory(path: Path) -> Inventory:
    """Read and validate ``path``; raise ``InventoryError`` naming file, host and key."""
    path = Path(path)
    label = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InventoryError(f"{label}: cannot read inventory: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InventoryError(f"{label}: not UTF-8 text: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InventoryError(f"{label}:{_toml_line(exc)} TOML syntax error: {exc}") from exc

    for key in data:
        if key not in _TOP_KEYS:
            raise InventoryError(f"{label}: unknown key {key!r} (expected [defaults] and [[hosts]])")
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise InventoryError(f"{label}: 'defaults' must be a table ([defaults])")
    for key in defaults:
        if key in _NOT_A_DEFAULT or key not in HostConfig.model_fields:
            raise InventoryError(f"{label}: [defaults]: unknown key {key!r}")
    entries = data.get("hosts")
    if not isinstance(entries, list) or not entries:
        raise InventoryError(f"{label}: no hosts: add at least one [[hosts]] table")

    base = path.resolve().parent
    hosts: list[HostConfig] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries, start=1):
        where = f"{label}: host #{index}"
        if not isinstance(entry, dict):
            raise InventoryError(f"{where}: must be a table ([[hosts]])")
        if isinstance(entry.get("name"), str):
            where = f"{label}: host {entry['name']!r}"
        for key in entry:
            if key not in HostConfig.model_fields:
                raise InventoryError(f"{where}: unknown key {key!r}")
        # default: a tool-owned known_hosts next to the inventory
        merged = {"known_hosts": "known_hosts", **defaults, **entry}
        for key in _PATH_KEYS:
            if isinstance(merged.get(key), str):
                merged[key] = (base / Path(merged[key]).expanduser()).resolve()
        try:
            host = HostConfig.model_validate(merged)
        except ValidationError as exc:
            raise InventoryError(f"{where}: {_first_error(exc)}") from exc
        _check_host(where, host)
        if host.name in seen:
            raise InventoryError(f"{where}: key 'name': duplicate host name (also host #{seen[host.name]})")
        seen[host.name] = index
        hosts.append(host)
    return Inventory(path=path, hosts=hosts)


def _check_host(where: str, host: HostConfig) -> None:
    for key in host.env:
        if key not in host.env_allowlist:
            raise InventoryError(f"{where}: key 'env': {key!r} is not in env_allowlist; add it there or drop it")
    if host.transport != "ssh":
        return
    if not host.address:
        raise InventoryError(f"{where}: key 'address': missing (an ssh host needs an address)")
    if host.identity_file is None:
        raise InventoryError(
            f"{where}: key 'identity_file': missing (crosshost uses no agent and no default keys)"
        )
    if not host.identity_file.is_file():
        raise InventoryError(f"{where}: key 'identity_file': {host.identity_file} does not exist")


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"]) or "?"
    if err["type"] == "missing":
        return f"key {key!r}: missing"
    if err["type"] == "extra_forbidden":
        return f"unknown key {key!r}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"key {key!r}: {msg} (got {err.get('input')!r})"


def _toml_line(exc: tomllib.TOMLDecodeError) -> str:
    # tomllib says "... (at line 7, column 3)"; lift the line into the file:line prefix
    m = re.search(r"at line (\d+)", str(exc))
    return f"{m.group(1)}:" if m else ""
