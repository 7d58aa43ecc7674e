"""hosts.toml: the inventory of hosts a suite is replayed on (format in docs/inventory.md).

``load_inventory(path)`` merges ``[defaults]`` into every host, resolves relative paths against the
file's directory, and validates everything with pydantic. Every error is one ``InventoryError``
line naming the file, the host and the key: ``hosts.toml: host 'box-b': unknown key 'adress'``.
The first host is the reference.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent_runner.envkeys import ATTEMPT_ENV_KEYS, is_dangerous_env_key
from agent_runner.jsonfile import decode_text, read_regular
from agent_runner.redact import is_secret_env_key, looks_like_credential
from agent_runner.textguard import control_char
from orchestrator.errors import InventoryError

if TYPE_CHECKING:  # at run time the transport package imports this module
    from orchestrator.hosts.transport.sshconfig import SshKey, SshSettings

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
    transport: Literal["local", "ssh", "docker", "command"] = "ssh"
    # strict: `port = true` is not port 1, `port = "2601"` not a number; names are never empty
    address: str | None = Field(default=None, min_length=1, strict=True)
    port: int = Field(default=22, ge=1, le=65535, strict=True)
    user: str | None = Field(default=None, min_length=1, strict=True)
    identity_file: Path | None = None
    known_hosts: Path | None = None
    env_allowlist: list[str] = Field(default_factory=lambda: list(DEFAULT_ENV_ALLOWLIST))
    env: dict[str, str] = Field(default_factory=dict)
    #: let env_allowlist/env name a loader-hijacking variable (LD_PRELOAD, PYTHONPATH, BASH_ENV, IFS, ...)
    allow_dangerous_env: bool = Field(default=False, strict=True)
    workspace_root: str = "/tmp/crosshost"
    # finite and bounded: they become `timeout -s KILL N` and socket timeouts (inf would crash the run)
    timeout_s: float = Field(default=120, gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False, strict=True)
    python: str = Field(default="python3", min_length=1, strict=True)
    connect_timeout_s: float = Field(default=10, gt=0, le=MAX_CONNECT_TIMEOUT_S, allow_inf_nan=False, strict=True)
    #: an ssh_config Host alias: address, port, user, keys and jump hosts come from ssh_config
    ssh: str | None = None
    #: authenticate with the keys of the running ssh-agent ($SSH_AUTH_SOCK); never forwarded
    use_agent: bool = Field(default=False, strict=True)
    #: a controller variable holding identity_file's passphrase (read at connect, never recorded)
    passphrase_env: str | None = None
    #: with use_agent: only the agent key matching identity_file (as OpenSSH's IdentitiesOnly)
    identities_only: bool = Field(default=False, strict=True)
    #: jump host(s), comma-separated: inventory host names or [user@]host[:port]
    proxy_jump: str | None = None
    #: at most this many connections being opened through one jump host at once (sshd MaxStartups: 10)
    bastion_connections: int = Field(default=8, ge=1, le=64, strict=True)
    #: attempts at once on this host, each in its own workspace, HOME, TMPDIR and budget
    slots: int = Field(default=1, ge=1, le=64, strict=True)
    #: a root runner's attempts' directories in a tmpfs of the run's own (agent_runner/attempt_memory.py);
    #: false: on workspace_root's file system (a task whose files would not fit in memory)
    attempts_in_memory: bool = Field(default=True, strict=True)
    #: docker: a container started from this image for the run, removed after it
    image: str | None = Field(default=None, min_length=1, strict=True)
    #: docker: an existing, running container (left running)
    container: str | None = Field(default=None, min_length=1, strict=True)
    #: docker: the daemon (docker -H): unix://..., tcp://..., ssh://user@host
    docker_host: str | None = Field(default=None, min_length=1, strict=True)
    #: docker, image hosts: the container's network (the model proxy needs none: it comes through docker exec)
    network: str = Field(default="none", min_length=1, strict=True)
    #: docker, image hosts: how long pulling a missing image may take
    pull_timeout_s: float = Field(default=300, gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False, strict=True)
    #: command: the exec-style prefix a command is appended to (["docker", "exec", "-i", "box"], ...)
    argv: list[str] | None = None
    # Filled by load_inventory, never read from the file:
    #: the resolved jump hosts, outermost first
    jump: list[HostConfig] = Field(default_factory=list)
    #: ssh_config directives that were not followed, one line each
    notes: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not _HOST_NAME.match(v):
            raise ValueError("must be letters, digits, '.', '_' or '-' (it names a directory)")
        return v

    @field_validator("passphrase_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_KEY.match(v):
            raise ValueError(f"{v!r} is not an environment variable name")
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
            # a pinned value reaches every attempt's environment, where the agent under test reads it
            # (it is in neither `ps` nor manifest.json): a secret never leaves the controller
            if is_secret_env_key(key):
                raise ValueError(f"{key!r} is secret-shaped; a pinned value reaches the agent under test, a secret never leaves the controller")
            if looks_like_credential(value):
                raise ValueError(f"{key!r}: the value holds a credential (a password in a URL, a key, a token); "
                                 "a pinned value reaches the agent under test, a secret never leaves the controller")
        return v

    @model_validator(mode="after")
    def _no_loader_hijack(self) -> HostConfig:
        if not self.allow_dangerous_env:
            for field_name, keys in (("env_allowlist", list(self.env_allowlist)), ("env", list(self.env))):
                bad = [k for k in keys if is_dangerous_env_key(k)]
                if bad:
                    raise ValueError(
                        f"{field_name}: {', '.join(bad)} can make the host run other code before the runner; "
                        "set allow_dangerous_env = true to pass it anyway"
                    )
        return self

    @field_validator("address", "user", "workspace_root", "python", "ssh", "identity_file", "known_hosts")
    @classmethod
    def _one_line(cls, v: Any) -> Any:
        # these reach shell text, ssh and the terminal: a newline would be a second command or line
        bad = control_char(str(v)) if v is not None else None
        if bad:
            raise ValueError(f"holds a control character ({bad}); give it on one line")
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
        """What the manifest records: no key or known_hosts paths (they are the controller's), and of
        the pinned values their keys only (``env``: a sorted list)."""
        data = self.model_dump(
            mode="json", exclude={"identity_file", "known_hosts", "passphrase_env", "jump", "notes"}
        )
        data["env"] = sorted(self.env)
        if self.jump:
            data["via"] = [hop.name for hop in self.jump]
        return data


def replaced_env(host: HostConfig) -> list[str]:
    """The env keys ``host``'s inventory entry allowlists or pins that every attempt gets fresh
    anyway (``ATTEMPT_ENV_KEYS``): what it says there is replaced, never passed on."""
    return [k for k in ATTEMPT_ENV_KEYS if k in host.env_allowlist or k in host.env]


#: keys only a docker host uses, and only a command host
_DOCKER_ONLY = ("image", "container", "docker_host", "network", "pull_timeout_s")
_COMMAND_ONLY = ("argv",)
#: keys only an ssh host uses (another host's own table naming one is said to be ignored)
_SSH_ONLY = (
    "address", "port", "user", "identity_file", "ssh", "use_agent", "passphrase_env", "identities_only",
    "proxy_jump", "bastion_connections",
)  # fmt: skip


def override_notes(hosts: list[HostConfig]) -> list[str]:
    """What a run says once about its inventory: values crosshost replaces (HOME, TMPDIR, PWD), one
    line for every host; values it ignores (ssh_config directives it does not follow, ssh keys of a
    local host), one line each."""
    ignored = [f"{h.name}: {note}" for h in hosts for note in h.notes]
    named = [
        f"{h.name} ({', '.join(keys)})" for h in hosts if (keys := replaced_env(h))
    ]
    if not named:
        return ignored
    return [
        f"inventory values replaced: {'; '.join(named)}: every attempt gets a fresh, empty HOME and "
        "TMPDIR of its own and its workspace as PWD, whatever the inventory allowlists or pins",
        *ignored,
    ]


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
_NOT_A_DEFAULT = {"name", "ssh"}
#: HostConfig fields load_inventory fills; the file cannot set them
_INTERNAL = {"jump", "notes"}
#: ssh_config may give these; a key written in the inventory wins
_FROM_SSH_CONFIG: tuple[SshKey, ...] = (
    "address", "port", "user", "identity_file", "identities_only", "proxy_jump", "connect_timeout_s",
)
_PATH_KEYS = ("identity_file", "known_hosts")
#: what a ``[user@]host[:port]`` jump host takes from ssh_config (its keys are the target's)
_HOP_FROM_SSH_CONFIG: tuple[SshKey, ...] = ("address", "port", "user", "identity_file")


def load_inventory(path: Path) -> Inventory:
    """Read and validate ``path``; raise ``InventoryError`` naming file, host and key."""
    path = Path(path)
    label = str(path)
    try:
        raw = read_regular(path)  # a FIFO or /dev/zero is refused before a byte is read
    except OSError as exc:
        raise InventoryError(f"{label}: cannot read inventory: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(decode_text(raw))
    except UnicodeDecodeError as exc:
        raise InventoryError(f"{label}: not UTF-8 text: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InventoryError(f"{label}:{_toml_line(exc)} TOML syntax error: {exc}") from exc
    except RecursionError:
        raise InventoryError(f"{label}: TOML nested too deeply") from None

    for key in data:
        if key not in _TOP_KEYS:
            raise InventoryError(f"{label}: unknown key {key!r} (expected [defaults] and [[hosts]])")
    defaults = dict(data.get("defaults", {})) if isinstance(data.get("defaults", {}), dict) else None
    if defaults is None:
        raise InventoryError(f"{label}: 'defaults' must be a table ([defaults])")
    ssh_config_setting = defaults.pop("ssh_config", True)
    for key in defaults:
        if key in _NOT_A_DEFAULT or key in _INTERNAL or key not in HostConfig.model_fields:
            raise InventoryError(f"{label}: [defaults]: unknown key {key!r}")
    entries = data.get("hosts")
    if not isinstance(entries, list) or not entries:
        raise InventoryError(f"{label}: no hosts: add at least one [[hosts]] table")

    base = path.resolve().parent
    ssh_config = _SshConfigSource(label, base, ssh_config_setting)
    hosts: list[HostConfig] = []
    seen: dict[str, int] = {}
    wheres: dict[str, str] = {}
    for index, entry in enumerate(entries, start=1):
        where = f"{label}: host #{index}"
        if not isinstance(entry, dict):
            raise InventoryError(f"{where}: must be a table ([[hosts]])")
        if isinstance(entry.get("name"), str):
            where = f"{label}: host {entry['name']!r}"
        for key in entry:
            if key in _INTERNAL or key not in HostConfig.model_fields:
                raise InventoryError(f"{where}: unknown key {key!r}")
        # default: a tool-owned known_hosts next to the inventory
        merged = {"known_hosts": "known_hosts", **defaults, **entry}
        for key in _PATH_KEYS:
            if isinstance(merged.get(key), str):
                merged[key] = (base / Path(merged[key]).expanduser()).resolve()
        if merged.get("transport", "ssh") == "ssh":
            merged = ssh_config.apply(where, merged, explicit=set(defaults) | set(entry))
        else:  # what the host's own table says that only an ssh host uses: ignored, and said so
            ignored = [k for k in entry if k in _SSH_ONLY]
            if ignored:
                keys = ", ".join(repr(k) for k in ignored)
                merged["notes"] = [
                    f"{label}: key(s) {keys} ignored: a {merged.get('transport')} host is reached without SSH"
                ]
        try:
            host = HostConfig.model_validate(merged)
        except ValidationError as exc:
            raise InventoryError(f"{where}: {_first_error(exc)}") from exc
        if host.name in seen:
            raise InventoryError(f"{where}: key 'name': duplicate host name (also host #{seen[host.name]})")
        seen[host.name] = index
        wheres[host.name] = where
        hosts.append(host)
    by_name = {h.name: h for h in hosts}
    hosts = [_with_jumps(wheres[h.name], h, by_name, ssh_config) for h in hosts]
    for index, host in enumerate(hosts):
        _check_host(wheres[host.name], host, entries[index])
        for hop in host.jump:
            if hop.name not in by_name:  # an inventory host is checked as itself
                _check_host(f"{wheres[host.name]} (jump host {hop.name})", hop)
    return Inventory(path=path, hosts=hosts)


class _SshConfigSource:
    """``[defaults] ssh_config``: ``~/.ssh/config`` unless a path or ``false``; read once, when needed."""

    def __init__(self, label: str, base: Path, setting: object) -> None:
        self.label = label
        self.setting = setting
        if setting is True:
            self.path: Path | None = Path("~/.ssh/config")
        elif setting is False:
            self.path = None
        elif isinstance(setting, str) and setting:
            self.path = (base / Path(setting).expanduser()).resolve()
        else:
            raise InventoryError(f"{label}: [defaults]: key 'ssh_config': a path or false (got {setting!r})")
        self._file: Any = None
        self._read = False

    def file(self) -> Any:
        if not self._read and self.path is not None:
            from orchestrator.hosts.transport import sshconfig

            self._file = sshconfig.read(self.path, explicit=self.setting is not True)
            self._read = True
        return self._file

    def apply(self, where: str, merged: dict[str, Any], *, explicit: set[str]) -> dict[str, Any]:
        """``merged`` with what ssh_config says about its alias (or address) where the inventory is silent."""
        alias = merged.get("ssh")
        lookup = alias or merged.get("address")
        if not isinstance(lookup, str) or not lookup:
            return merged
        cfg = self.file() if self.path is not None else None
        if cfg is None:
            if alias is not None:
                why = "ssh_config = false in [defaults]" if self.path is None else f"{self.path} does not exist"
                raise InventoryError(f"{where}: key 'ssh': alias {alias!r} needs an ssh_config ({why})")
            return merged
        if alias is not None and not cfg.knows(alias):
            raise InventoryError(f"{where}: key 'ssh': no Host {alias!r} in {cfg.path}")
        found, notes = cfg.settings(lookup)
        if alias is None:
            explicit = explicit - {"address"}  # the address is the alias: its HostName replaces it, as in ssh
        out = dict(merged)
        for key in _FROM_SSH_CONFIG:
            if key in found and key not in explicit:
                out[key] = found[key]
        out["notes"] = notes
        return out


def _with_jumps(where: str, host: HostConfig, by_name: dict[str, HostConfig], ssh_config: _SshConfigSource) -> HostConfig:
    """``host`` with ``jump`` resolved: each hop an inventory host (with its own jumps) or ``[user@]host[:port]``."""
    if host.transport != "ssh" or not host.proxy_jump:
        return host
    chain: list[HostConfig] = []
    for spec in [s.strip() for s in host.proxy_jump.split(",") if s.strip()]:
        chain += _hop_chain(where, host, spec, by_name, ssh_config, [host.name])
    return host.model_copy(update={"jump": chain})


def _hop_chain(
    where: str,
    target: HostConfig,
    spec: str,
    by_name: dict[str, HostConfig],
    ssh_config: _SshConfigSource,
    path: list[str],
) -> list[HostConfig]:
    if spec in by_name:
        hop = by_name[spec]
        if hop.transport != "ssh":
            raise InventoryError(f"{where}: key 'proxy_jump': {spec!r} is not an ssh host")
        if spec in path:
            raise InventoryError(f"{where}: key 'proxy_jump': a loop ({' -> '.join([*path, spec])})")
        before: list[HostConfig] = []
        for inner in [s.strip() for s in (hop.proxy_jump or "").split(",") if s.strip()]:
            before += _hop_chain(where, target, inner, by_name, ssh_config, [*path, spec])
        return [*before, hop.model_copy(update={"jump": []})]
    m = _HOP.match(spec)
    if m is None:
        raise InventoryError(
            f"{where}: key 'proxy_jump': {spec!r} is neither an inventory host nor [user@]host[:port]"
        )
    user, address, port = m.group("user"), m.group("host"), m.group("port")
    hop_fields: SshSettings = {"address": address, "port": 22}
    cfg = ssh_config.file() if ssh_config.path is not None else None
    if cfg is not None:
        found, _notes = cfg.settings(address)
        for key in _HOP_FROM_SSH_CONFIG:
            if key in found:
                hop_fields[key] = found[key]
        if found.get("proxy_jump") and len(path) < 8:
            before = []
            for inner in [s.strip() for s in found["proxy_jump"].split(",") if s.strip()]:
                before += _hop_chain(where, target, inner, by_name, ssh_config, [*path, spec])
            return [*before, _hop(target, spec, hop_fields, user, port)]
    return [_hop(target, spec, hop_fields, user, port)]


def _hop(target: HostConfig, spec: str, fields: SshSettings, user: str | None, port: str | None) -> HostConfig:
    """A jump host given as ``[user@]host[:port]``: the target's keys and known_hosts, its own address."""
    update = {**fields, "name": spec, "jump": [], "notes": [], "proxy_jump": None}
    if user:
        update["user"] = user
    if port:
        update["port"] = int(port)
    if "user" not in update:
        update["user"] = target.user
    return target.model_copy(update=update)


_HOP = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[^\]]+\]|[^:@\s]+)(?::(?P<port>\d{1,5}))?$")


def _check_host(where: str, host: HostConfig, entry: dict[str, Any] | None = None) -> None:
    for key in host.env:
        if key not in host.env_allowlist:
            raise InventoryError(f"{where}: key 'env': {key!r} is not in env_allowlist; add it there or drop it")
    _check_container_keys(where, host, entry or {})
    if host.transport != "ssh":
        return
    if not host.address:
        raise InventoryError(f"{where}: key 'address': missing (an ssh host needs an address or an ssh alias)")
    if host.use_agent and not os.environ.get("SSH_AUTH_SOCK"):
        raise InventoryError(
            f"{where}: key 'use_agent': SSH_AUTH_SOCK is not set on the controller "
            "(start ssh-agent and ssh-add the key, or use identity_file)"
        )
    if host.identity_file is None:
        if host.use_agent:
            return
        raise InventoryError(
            f"{where}: key 'identity_file': missing (give identity_file, or use_agent = true; "
            "crosshost uses no default keys)"
        )
    if not host.identity_file.is_file():
        if host.use_agent and host.identities_only is False:
            return  # the agent's keys are enough; OpenSSH too skips a missing IdentityFile
        raise InventoryError(f"{where}: key 'identity_file': {host.identity_file} does not exist")
    from orchestrator.hosts.transport import keys

    if host.passphrase_env is not None:
        keys.load_identity(host.identity_file, host.passphrase_env, where=where)  # a wrong passphrase: here
    elif not host.use_agent and keys.is_locked(host.identity_file):
        raise InventoryError(
            f"{where}: key file {host.identity_file} is passphrase-protected: {keys.unlock_hint(host.identity_file)}"
        )


def _check_container_keys(where: str, host: HostConfig, entry: dict[str, Any]) -> None:
    """A docker host names an image or a container (one of them); a command host an argv prefix; a
    key of one of them in another host's own table is a mistake, said here."""
    own = {"docker": _DOCKER_ONLY, "command": _COMMAND_ONLY}.get(host.transport, ())
    for key in (*_DOCKER_ONLY, *_COMMAND_ONLY):
        if key in entry and key not in own:
            kind = "docker" if key in _DOCKER_ONLY else "command"
            raise InventoryError(f"{where}: key {key!r}: only a transport = \"{kind}\" host has it (this one is {host.transport})")
    if host.transport == "docker":
        if (host.image is None) == (host.container is None):
            raise InventoryError(
                f"{where}: key 'image': a docker host names exactly one of image = \"...\" (a container started "
                "for the run) or container = \"...\" (an existing one)"
            )
        if host.container is not None and ("network" in entry or "pull_timeout_s" in entry):
            raise InventoryError(f"{where}: keys 'network' and 'pull_timeout_s' are for image hosts; container {host.container!r} exists already")
        for key, value in (("image", host.image), ("container", host.container), ("docker_host", host.docker_host), ("network", host.network)):
            if value is not None and (value.startswith("-") or any(c.isspace() or c == "\x00" for c in value)):
                raise InventoryError(f"{where}: key {key!r}: {value!r} is not valid (no leading '-', no spaces): it becomes a docker argument")
    if host.transport == "command":
        if not host.argv:
            raise InventoryError(
                f"{where}: key 'argv': missing (a command host needs the exec prefix a command is appended to, "
                'e.g. argv = ["docker", "exec", "-i", "box"])'
            )
        if any(not a or "\x00" in a for a in host.argv):
            raise InventoryError(f"{where}: key 'argv': an empty word or a NUL byte in {host.argv!r}")


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"]) or "?"
    if err["type"] == "missing":
        return f"key {key!r}: missing"
    if err["type"] == "extra_forbidden":
        return f"unknown key {key!r}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    if not err["loc"] or err["loc"][0] == "env":  # the whole table, or pinned values: never echoed
        return f"key {key!r}: {msg}" if err["loc"] else msg
    return f"key {key!r}: {msg} (got {err.get('input')!r})"


def _toml_line(exc: tomllib.TOMLDecodeError) -> str:
    # tomllib says "... (at line 7, column 3)"; lift the line into the file:line prefix
    m = re.search(r"at line (\d+)", str(exc))
    return f"{m.group(1)}:" if m else ""
