"""Jump hosts: one connection per bastion, shared by every host behind it in this process.

A host behind ``proxy_jump`` (or ssh_config's ProxyJump) runs its own SSH session inside a
``direct-tcpip`` channel of the bastion's connection, as ``ssh -J`` does: the bastion never holds a
key or an agent, and the target's host key is checked by the controller. Several hops chain: each
bastion is reached through the one before it. At most ``bastion_connections`` connections are being
opened through one bastion at once (``gate``): sshd's default ``MaxStartups`` is 10.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field

import paramiko

from orchestrator.errors import HostUnreachable
from orchestrator.hosts.inventory import HostConfig
from orchestrator.hosts.transport import session

_Key = tuple[tuple[str, int, str], ...]


@dataclass(eq=False)
class Bastion:
    key: _Key
    name: str
    transport: paramiko.Transport
    gate: threading.BoundedSemaphore
    outer: Bastion | None = None
    users: int = 0
    #: direct-tcpip channels opened through it (tests and the bench read this)
    opened: int = field(default=0)

    def open(self, address: str, port: int, owner: str, timeout: float) -> paramiko.Channel:
        """A channel to ``address:port`` as the bastion sees it (its resolver, its network)."""
        try:
            chan = self.transport.open_channel(
                "direct-tcpip", (address, port), ("127.0.0.1", 0), timeout=timeout
            )
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise HostUnreachable(
                owner, f"jump host {self.name} cannot reach {address}:{port}: {type(exc).__name__}: {exc}"
            ) from exc
        self.opened += 1
        return chan


_lock = threading.Lock()
_bastions: dict[_Key, Bastion] = {}
_connecting: dict[_Key, threading.Lock] = {}


def _key(chain: list[HostConfig]) -> _Key:
    return tuple((hop.address or "", hop.port, hop.user or "") for hop in chain)


def acquire(chain: list[HostConfig], owner: str, *, accept_new: bool) -> Bastion:
    """The live connection to ``chain[-1]`` (reached through ``chain[:-1]``), connecting it when no
    host in this process holds one; pair with ``release``."""
    key = _key(chain)
    with _lock:
        connecting = _connecting.setdefault(key, threading.Lock())
    with connecting:  # the first host behind a bastion connects it; the others wait and share it
        with _lock:
            live = _bastions.get(key)
            if live is not None and live.transport.is_active():
                live.users += 1
                return live
        hop = chain[-1]
        assert hop.address is not None
        outer = acquire(chain[:-1], owner, accept_new=accept_new) if len(chain) > 1 else None
        try:
            if outer is None:
                try:
                    sock: socket.socket | paramiko.Channel = socket.create_connection(
                        (hop.address, hop.port), timeout=hop.connect_timeout_s
                    )
                except OSError as exc:
                    raise HostUnreachable(
                        owner, f"connect to jump host {hop.name} ({hop.address}:{hop.port}): {exc}"
                    ) from exc
                transport = session.start_transport(sock, hop, owner, accept_new=accept_new)
            else:
                with outer.gate:
                    sock = outer.open(hop.address, hop.port, owner, hop.connect_timeout_s)
                    transport = session.start_transport(sock, hop, owner, accept_new=accept_new, via=outer.name)
        except BaseException:
            if outer is not None:
                release(outer)
            raise
        bastion = Bastion(key, hop.name, transport, threading.BoundedSemaphore(hop.bastion_connections), outer)
        with _lock:
            bastion.users = 1
            _bastions[key] = bastion
        return bastion


def release(bastion: Bastion) -> None:
    """One host less behind ``bastion``; the last one closes it (and its own outer hops)."""
    with _lock:
        bastion.users -= 1
        if bastion.users > 0:
            return
        if _bastions.get(bastion.key) is bastion:
            del _bastions[bastion.key]
    session.close_transport(bastion.transport)
    if bastion.outer is not None:
        release(bastion.outer)


def live() -> dict[str, Bastion]:
    """The bastions connected right now, by name."""
    with _lock:
        return {b.name: b for b in _bastions.values()}
