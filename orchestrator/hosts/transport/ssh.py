"""SshHost: one paramiko Transport per host for exec, SFTP and reverse port forwarding.

crosshost's SSH rules, each learned from a fabric/paramiko bug report:

- host keys only from the tool-owned known_hosts (orchestrator.hosts.known_hosts); unknown -> refused
  unless ``accept_new``; changed -> refused always; ``~/.ssh/known_hosts`` is never read or written;
- no default keys and never agent forwarding: the inventory's identity_file (plain, or unlocked by
  passphrase_env), and the running ssh-agent's keys only with use_agent = true;
- behind jump hosts (``cfg.jump``), the connection runs in a direct-tcpip channel of one shared
  bastion connection (orchestrator.hosts.transport.jump); host keys of every hop are checked the same way;
- every remote command runs under ``timeout -s KILL N`` so nothing outlives its budget, and the
  controller gives up on the channel a little after N: a vanished host cannot hang us;
- connect/banner/auth/channel timeouts and a keepalive;
- foreign errors are mapped once, in ``_mapped``: socket/timeout/EOF -> HostUnreachable (transient),
  AuthenticationException -> AuthenticationFailed, SFTP file errors -> TransferError.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko

from orchestrator.errors import AuthenticationFailed, HostError, HostUnreachable, TransferError
from orchestrator.hosts import known_hosts
from orchestrator.hosts.inventory import HostConfig
from orchestrator.hosts.transport import jump, keys
from orchestrator.hosts.transport.base import ExecResult, Host, copy_capped, refuse_irregular

#: seconds between keepalive packets (keeps NAT/firewall state alive on long, quiet runs)
KEEPALIVE_S = 15
#: how often the controller asks a host for a reply it must give (an OpenSSH keepalive request)
LIVENESS_INTERVAL_S = 5.0
#: how long past connect_timeout_s an unanswered request may stay unanswered before the host is
#: declared unreachable: a stopped sshd keeps its TCP connection open and answers nothing
REPLY_GRACE_S = 15.0
#: how long past a command's own timeout the controller waits for the channel before giving up
CHANNEL_GRACE_S = 5.0
_BUF = 1 << 16
#: exit code of a command killed by `timeout -s KILL` (128 + SIGKILL)
KILLED = 137


class SshHost(Host):
    kind = "ssh"

    def __init__(self, cfg: HostConfig, *, accept_new: bool = False) -> None:
        if cfg.transport != "ssh" or not cfg.address:
            raise ValueError(f"{cfg.name}: not an ssh host")
        self.name = cfg.name
        self.cfg = cfg
        self.accept_new = accept_new
        self.address: str = cfg.address
        self.port = cfg.port
        self.user = cfg.user or getpass.getuser()
        self.label = known_hosts.host_label(self.address, self.port)
        self.known_hosts_path = Path(cfg.known_hosts or Path("known_hosts")).resolve()
        self.timeout_s = cfg.connect_timeout_s
        self.server_key_fingerprint: str | None = None
        self._transport: paramiko.Transport | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._forwards: dict[int, int] = {}  # remote port -> controller port
        self._bastion: jump.Bastion | None = None
        self._lock = threading.Lock()
        # one global request at a time: paramiko keeps a single completion event for them
        self._global_lock = threading.Lock()
        self._asked_at: float | None = None  # an unanswered liveness request, since when
        self._closing = threading.Event()
        self._wake = threading.Event()
        self._connect()
        threading.Thread(target=self._ask_for_replies, daemon=True, name=f"alive-{self.name}").start()

    # -- connection ------------------------------------------------------------------------
    def _connect(self) -> None:
        if not self.cfg.jump:
            with self._mapped("connect to"):
                sock = socket.create_connection((self.address, self.port), timeout=self.timeout_s)
            self._transport = start_transport(sock, self.cfg, self.name, accept_new=self.accept_new)
            return
        bastion = jump.acquire(self.cfg.jump, self.name, accept_new=self.accept_new)
        try:
            # The gate bounds connections being opened through the bastion (its targets' MaxStartups).
            with bastion.gate:
                chan = bastion.open(self.address, self.port, self.name, self.timeout_s)
                self._transport = start_transport(
                    chan, self.cfg, self.name, accept_new=self.accept_new, via=bastion.name
                )
        except BaseException:
            jump.release(bastion)
            raise
        self._bastion = bastion

    def _live(self) -> paramiko.Transport:
        t = self._transport
        if t is None or not t.is_active():
            raise HostUnreachable(self.name, f"connection to {self.label} is closed")
        return t

    def _ask_for_replies(self) -> None:
        """Every LIVENESS_INTERVAL_S, a request the host must answer; ``check_alive`` reads the wait."""
        while not self._closing.is_set():
            self._wake.wait(LIVENESS_INTERVAL_S)
            self._wake.clear()
            if self._closing.is_set():
                return
            t = self._transport
            if t is None or not t.is_active():
                return
            with self._global_lock:
                self._asked_at = time.monotonic()
                with contextlib.suppress(Exception):
                    t.global_request("keepalive@openssh.com", wait=True)  # a failure reply is a reply
                self._asked_at = None

    @contextlib.contextmanager
    def _global_request(self) -> Iterator[None]:
        """Our turn for a global request; a host that leaves the liveness request unanswered past
        its deadline is unreachable, not waited for."""
        if not self._global_lock.acquire(timeout=self.timeout_s + REPLY_GRACE_S):
            self.check_alive()
            raise HostUnreachable(self.name, f"{self.label} does not answer")
        try:
            yield
        finally:
            self._global_lock.release()

    def ping(self) -> None:
        self._wake.set()

    def silent_s(self) -> float:
        asked = self._asked_at
        return 0.0 if asked is None else time.monotonic() - asked

    def check_alive(self) -> None:
        """HostUnreachable when the host has left a request unanswered past its deadline."""
        asked = self._asked_at
        deadline = self.timeout_s + REPLY_GRACE_S
        if asked is not None and time.monotonic() - asked > deadline:
            raise HostUnreachable(
                self.name,
                f"{self.label} has answered nothing for {time.monotonic() - asked:.0f}s "
                f"(connect_timeout_s {self.timeout_s:g} + {REPLY_GRACE_S:g}s); declared unreachable",
            )

    def is_connected(self) -> bool:
        return self._transport is not None and self._transport.is_active()

    @contextlib.contextmanager
    def _mapped(self, what: str, *, transfer: bool = False) -> Iterator[None]:
        """The one place foreign errors become crosshost errors (``raise … from exc``)."""
        try:
            yield
        except HostError:
            raise
        except (OSError, paramiko.SFTPError) as exc:
            # A file error over a live connection is the file's fault, not the host's.
            if transfer and self.is_connected() and (
                isinstance(exc, paramiko.SFTPError) or getattr(exc, "errno", None) is not None
            ):
                raise TransferError(self.name, f"{what}: {exc}") from exc
            raise mapped_error(exc, self.name, f"{what} {self.label}") from exc
        except (EOFError, paramiko.SSHException) as exc:
            raise mapped_error(exc, self.name, f"{what} {self.label}") from exc

    # -- exec ------------------------------------------------------------------------------
    def exec(self, argv: list[str], timeout: float) -> ExecResult:
        if not argv:
            raise ValueError("exec: empty argv")
        # `; exit $?` keeps the login shell from exec'ing `timeout`: when timeout's KILL takes the
        # process group, the shell survives to report 137 instead of an unparsed exit-signal.
        command = f"timeout -s KILL {_seconds(timeout)} {shlex.join(argv)}; exit $?"
        started = time.monotonic()
        deadline = started + timeout + max(CHANNEL_GRACE_S, self.timeout_s)
        out = bytearray()
        err = bytearray()
        with self._mapped("exec on"):
            chan = self._live().open_session(timeout=self.timeout_s)
            try:
                chan.exec_command(command)
                chan.shutdown_write()  # stdin is /dev/null, as for LocalHost
                while True:
                    select.select([chan], [], [], 0.5)
                    while chan.recv_ready():
                        out += chan.recv(_BUF)
                    while chan.recv_stderr_ready():
                        err += chan.recv_stderr(_BUF)
                    done = chan.closed or (chan.exit_status_ready() and chan.eof_received)
                    if done and not chan.recv_ready() and not chan.recv_stderr_ready():
                        break
                    if not self.is_connected():
                        raise HostUnreachable(self.name, f"connection to {self.label} lost during {argv[0]}")
                    self.check_alive()
                    if time.monotonic() > deadline:
                        raise HostUnreachable(
                            self.name,
                            f"{argv[0]}: no answer from {self.label} {deadline - started:.0f}s after start "
                            f"(the command's own timeout is {timeout:g}s)",
                        )
                code = chan.exit_status
            finally:
                chan.close()
        duration = time.monotonic() - started
        if code == -1:
            # No exit status: the session died. If the connection died with it, the host is gone.
            for _ in range(20):
                if not self.is_connected():
                    raise HostUnreachable(self.name, f"connection to {self.label} lost during {argv[0]}")
                time.sleep(0.05)
            code = 255
        return ExecResult(
            tuple(argv),
            code,
            out.decode("utf-8", "replace"),
            err.decode("utf-8", "replace"),
            duration,
            timed_out=code == KILLED and duration >= timeout,
        )

    # -- files -----------------------------------------------------------------------------
    def _sftp_client(self) -> paramiko.SFTPClient:
        with self._lock:
            if self._sftp is None or self._sftp.get_channel() is None or self._sftp.get_channel().closed:
                client = paramiko.SFTPClient.from_transport(self._live(), window_size=None)
                if client is None:
                    raise HostUnreachable(self.name, f"sftp on {self.label}: no channel")
                client.get_channel().settimeout(self.timeout_s * 3)
                self._sftp = client
            return self._sftp

    def put(self, local: Path, remote: str) -> None:
        with self._mapped(f"put {local} -> {remote}", transfer=True):
            self._sftp_client().put(str(local), remote, confirm=True)

    def get(
        self, remote: str, local: Path, *, max_bytes: int | None = None, cancel: threading.Event | None = None
    ) -> None:
        # Open the remote file first: a missing file must not leave an empty local one behind. The
        # host's word on its size is not trusted: lstat refuses a link, the handle's own stat a file
        # swapped since, and the copy counts what arrives and stops at the cap.
        with self._mapped(f"get {remote} -> {local}", transfer=True):
            sftp = self._sftp_client()
            refuse_irregular(self.name, remote, sftp.lstat(remote).st_mode)
            with sftp.open(remote, "rb") as rf:
                attrs = rf.stat()
                refuse_irregular(self.name, remote, attrs.st_mode)
                copy_capped(self.name, remote, _windows(rf), Path(local), max_bytes=max_bytes, cancel=cancel)

    # -- reverse port forwarding -----------------------------------------------------------
    def forward_remote(self, local_port: int) -> int:
        """Listen on the host's 127.0.0.1:<port chosen by sshd>, pipe each connection to the
        controller's 127.0.0.1:``local_port`` over this same transport; return the host's port."""
        with self._mapped("port forward on"):
            t = self._live()
            with self._global_request():
                port = t.request_port_forward("127.0.0.1", 0, handler=self._on_forwarded)
        self._forwards[port] = local_port
        return port

    def cancel_forward(self, port: int) -> None:
        """Stop forwarding the host's ``port``; idempotent, a no-op on a closed connection."""
        if self._forwards.pop(port, None) is None or not self.is_connected():
            return
        # global_request, not Transport.cancel_port_forward: that one drops the handler of every
        # other forward of this transport too.
        with contextlib.suppress(Exception), self._mapped("cancel forward on"), self._global_request():
            self._live().global_request("cancel-tcpip-forward", ("127.0.0.1", port), wait=True)

    def _on_forwarded(
        self, chan: paramiko.Channel, origin: tuple[str, int], server: tuple[str, int]
    ) -> None:
        # Called on paramiko's transport thread: hand off at once.
        local_port = self._forwards.get(server[1])
        if local_port is None:
            chan.close()
            return
        threading.Thread(
            target=_pipe, args=(chan, local_port, self.timeout_s), daemon=True, name=f"fwd-{self.name}"
        ).start()

    # -- close -----------------------------------------------------------------------------
    def close(self) -> None:
        self._closing.set()
        self._wake.set()
        self._forwards.clear()
        sftp, self._sftp = self._sftp, None
        transport, self._transport = self._transport, None
        if sftp is not None:
            with contextlib.suppress(Exception):
                sftp.close()
        if transport is not None:
            transport.close()
        bastion, self._bastion = self._bastion, None
        if bastion is not None:
            jump.release(bastion)


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
    try:
        try:
            transport = paramiko.Transport(sock)
            transport.banner_timeout = timeout
            transport.handshake_timeout = timeout
            transport.auth_timeout = timeout
            transport.channel_timeout = timeout
            _prefer_known_key_types(transport, known, label, owner)
            transport.start_client(timeout=timeout)
            key = transport.get_remote_server_key()
            known_hosts.verify(known, owner, label, key.get_name(), key.get_base64(), accept_new=accept_new)
            _authenticate(transport, cfg, owner, where)
            transport.set_keepalive(KEEPALIVE_S)
        except HostError:
            raise
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise mapped_error(exc, owner, f"connect to {where}") from exc
    except BaseException:
        if transport is not None:
            transport.close()
        raise
    return transport


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
    types = list(opts.key_types)
    first = [t for t in types if t in held]
    if first:
        opts.key_types = tuple(first + [t for t in types if t not in held])


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


def _pipe(chan: paramiko.Channel, local_port: int, connect_timeout: float) -> None:
    """Copy bytes both ways between a forwarded channel and 127.0.0.1:local_port until one side ends."""
    try:
        sock = socket.create_connection(("127.0.0.1", local_port), timeout=connect_timeout)
    except OSError:
        chan.close()
        return
    try:
        sock.settimeout(None)
        # Half-close aware: an EOF on one side is passed on as a shutdown of the other side's write
        # direction, and the answer still flows back (a client that sends, then shuts down, then reads).
        from_sock = from_chan = True
        while from_sock or from_chan:
            watch = [s for s, open_ in ((sock, from_sock), (chan, from_chan)) if open_]
            readable, _, _ = select.select(watch, [], [], 1.0)
            if sock in readable:
                data = sock.recv(_BUF)
                if data:
                    chan.sendall(data)
                else:
                    from_sock = False
                    chan.shutdown_write()
            if chan in readable:
                data = chan.recv(_BUF)
                if data:
                    sock.sendall(data)
                else:
                    from_chan = False
                    sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        chan.close()
        sock.close()


#: bytes asked for at once by a get (SFTP read requests in flight: WINDOW / 32 KiB)
GET_WINDOW = 1 << 20


def _windows(rf: paramiko.SFTPFile) -> Callable[[int], bytes]:
    """A ``read`` for ``copy_capped`` that keeps one window of reads in flight, however long the
    file is: whole-file prefetch queues a request for every chunk up front and keeps asking after
    the copy stopped. The size the host gave is not used; a short window is the end."""
    offset = 0
    done = False

    def read(_: int) -> bytes:
        nonlocal offset, done
        if done:
            return b""
        data = b"".join(rf.readv([(offset, GET_WINDOW)]))
        offset += len(data)
        done = len(data) < GET_WINDOW
        return data

    return read


def _seconds(timeout: float) -> str:
    """`timeout` accepts a decimal duration; keep it short and never zero (0 disables it)."""
    return f"{max(timeout, 0.01):.3f}".rstrip("0").rstrip(".")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
