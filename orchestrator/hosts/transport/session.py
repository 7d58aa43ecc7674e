"""One SSH session over a socket or a jump host's channel: the handshake, crosshost's known_hosts
check, authentication, and the one mapping of paramiko's and the socket's errors to crosshost's.
Shared by a host's own connection (ssh.py) and a bastion's (jump.py)."""

from __future__ import annotations

import contextlib
import getpass
import os
import socket
from collections.abc import Collection, Sequence
from pathlib import Path

import paramiko

from orchestrator.errors import AuthenticationFailed, HostError, HostUnreachable
from orchestrator.hosts import known_hosts
from orchestrator.hosts.inventory import HostConfig
from orchestrator.hosts.transport import keys

#: seconds between keepalive packets (keeps NAT/firewall state alive on long, quiet runs)
KEEPALIVE_S = 15
#: how often a connection's reading thread wakes while nothing arrives, to look at its own state
#: (closed, keepalive due, handshake overdue). paramiko's own 0.1 s cost the controller about half a
#: millisecond of CPU per host per second of an idle run (128 hosts: 7 % of a core, taken from the
#: threads doing the replay's work); data still wakes it at once, and ``close_transport`` at once too.
IDLE_CHECK_S = 1.0


def start_transport(
    sock: socket.socket | paramiko.Channel,
    cfg: HostConfig,
    owner: str,
    *,
    accept_new: bool,
    via: str | None = None,
) -> paramiko.Transport:
    """SSH over ``sock`` to ``cfg``'s host: handshake, host key checked against crosshost's
    known_hosts, authenticated. Errors name ``owner`` (the inventory host this connection serves)."""
    assert cfg.address is not None
    label = known_hosts.host_label(cfg.address, cfg.port)
    where = f"{label} (via {via})" if via else label
    if owner != cfg.name:
        where = f"jump host {cfg.name} ({where})"
    timeout = cfg.connect_timeout_s
    known = Path(cfg.known_hosts or Path("known_hosts")).resolve()
    transport: paramiko.Transport | None = None
    if isinstance(sock, socket.socket):
        no_delay(sock)
        sock = acking(sock)
    try:
        try:
            transport = paramiko.Transport(sock)
            sock.settimeout(IDLE_CHECK_S)  # after paramiko's own (set by Transport), before its thread starts
            transport.banner_timeout = timeout
            transport.handshake_timeout = timeout
            transport.auth_timeout = timeout
            transport.channel_timeout = timeout
            _prefer_known_key_types(transport, known, label, owner)
            _prefer_aead_ciphers(transport)
            transport.start_client(timeout=timeout)
            key = transport.get_remote_server_key()
            known_hosts.verify(known, owner, label, key.get_name(), key.get_base64(), accept_new=accept_new,
                               shown=where if owner != cfg.name else None)
            _authenticate(transport, cfg, owner, where)
            transport.set_keepalive(KEEPALIVE_S)
        except HostError:
            raise
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise mapped_error(exc, owner, f"connect to {where}") from exc
    except BaseException:
        if transport is not None:
            close_transport(transport)
        raise
    return transport


def close_transport(transport: paramiko.Transport) -> None:
    """Close a connection now: its socket is shut down first, which wakes its reading thread, so the
    connection ends at once rather than when that thread next looks (``IDLE_CHECK_S``)."""
    sock = transport.sock
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    transport.close()


def no_delay(sock: socket.socket) -> None:
    """Send each SSH packet at once: with Nagle's algorithm a small request (a channel open, an exec)
    waits for the ACK of the previous one, which the peer delays by up to 40 ms; every exec of a
    replay paid that, several times per host."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


#: Linux only: acknowledge what was read now, not after the delayed-ACK timer
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


class _AckingSocket(socket.socket):
    """A connection's socket that acknowledges every read at once (``TCP_QUICKACK`` after it).

    sshd sends without TCP_NODELAY until a session starts: its answer to the first channel open
    waits for the ACK of what it sent just before (its host keys, after authentication), and the
    controller's kernel delays that ACK by up to 40 ms while the controller has nothing to send
    (every host's first exec paid it). The kernel turns quick ACKs off again whenever the
    controller answers soon after a read, hence after each read."""

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        if _QUICKACK is not None:
            with contextlib.suppress(OSError):
                self.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        return data


def acking(sock: socket.socket) -> socket.socket:
    """``sock`` as an ``_AckingSocket`` (the same connection; ``sock`` itself is detached from it);
    ``sock`` as it is where the system has no quick ACKs."""
    if _QUICKACK is None or isinstance(sock, _AckingSocket):
        return sock
    timeout = sock.gettimeout()
    out = _AckingSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    out.settimeout(timeout)
    return out


def mapped_error(exc: BaseException, owner: str, what: str) -> HostError:
    """The one mapping of a paramiko/socket error to crosshost's tree (the caller raises it ``from exc``)."""
    if isinstance(exc, paramiko.AuthenticationException):
        return AuthenticationFailed(owner, f"{what}: {_describe(exc)}")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return HostUnreachable(owner, f"{what}: {exc}")
    if isinstance(exc, socket.gaierror):  # the name does not resolve: asking again will not change it
        err = HostUnreachable(owner, f"{what}: the address does not resolve ({exc.strerror or exc})")
        err.transient = False
        return err
    return HostUnreachable(owner, f"{what}: {_describe(exc)}")


def _prefer_known_key_types(transport: paramiko.Transport, known: Path, label: str, owner: str) -> None:
    """Ask for the key type we already hold, so a host with several keys offers that one."""
    held = {k.key_type for k in known_hosts.lookup(known, label, host=owner)}
    opts = transport.get_security_options()
    opts.key_types = _first(opts.key_types, held)


#: the ciphers that carry their own integrity check (AEAD): with one of them paramiko checks each packet in
#: the cipher's C code; with the others it computes an HMAC and compares it byte by byte in Python, which
#: was the controller's largest single cost in a 128-host replay
_AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def _prefer_aead_ciphers(transport: paramiko.Transport) -> None:
    """Offer the AEAD ciphers first (no weaker choice: the others stay, after them, for a server that
    has no GCM)."""
    opts = transport.get_security_options()
    opts.ciphers = _first(opts.ciphers, _AEAD_CIPHERS)


def _first(offered: Sequence[str], preferred: Collection[str]) -> tuple[str, ...]:
    """``offered`` with those in ``preferred`` moved ahead, each part in its order there: nothing is
    added or dropped."""
    return tuple([x for x in offered if x in preferred] + [x for x in offered if x not in preferred])


def _authenticate(transport: paramiko.Transport, cfg: HostConfig, owner: str, where: str) -> None:
    """Offer identity_file's key (unlocked by passphrase_env), then the agent's keys (use_agent)."""
    user = cfg.user or getpass.getuser()
    path = cfg.identity_file
    offers: list[tuple[str, paramiko.PKey]] = []
    if path is not None and path.is_file() and (cfg.passphrase_env is not None or not keys.is_locked(path)):
        offers.append((f"key {path}", keys.load_identity(path, cfg.passphrase_env, where=owner)))
    agent: paramiko.Agent | None = None
    if cfg.use_agent:
        agent = paramiko.Agent()
        held = list(agent.get_keys())
        blob = keys.public_blob(path) if path is not None else None
        if cfg.identities_only and path is not None:
            held = [k for k in held if k.asbytes() == blob]
        held.sort(key=lambda k: k.asbytes() != blob)  # the identity file's own key first
        offers += [(f"agent key {k.fingerprint}", k) for k in held]
    refused: list[str] = []
    try:
        for what, key in offers:
            try:
                transport.auth_publickey(user, key)
            except paramiko.BadAuthenticationType as exc:
                raise AuthenticationFailed(owner, f"{user}@{where} accepts no public key: {exc}") from exc
            except paramiko.AuthenticationException:
                refused.append(what)
                continue
            if transport.is_authenticated():
                return
            refused.append(what)
    finally:
        if agent is not None:
            agent.close()
    if offers:
        raise AuthenticationFailed(owner, f"{user}@{where} refused {', '.join(refused)}")
    sock = os.environ.get("SSH_AUTH_SOCK", "")
    only = f" matching {path}.pub (identities_only)" if cfg.identities_only and path is not None else ""
    add = f"`ssh-add {path}`" if path is not None else "ssh-add a key"
    raise AuthenticationFailed(
        owner, f"{user}@{where}: the ssh-agent at {sock} offers no key{only}; {add} or set passphrase_env"
    )


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
