"""SshHost: one paramiko Transport per host for exec, SFTP and reverse port forwarding.

crosshost's SSH rules, each learned from a fabric/paramiko bug report:

- host keys only from the tool-owned known_hosts (orchestrator.known_hosts); unknown -> refused
  unless ``accept_new``; changed -> refused always; ``~/.ssh`` is never read or written;
- no agent, no default keys, no agent forwarding: the inventory's identity_file or nothing;
- every remote command runs under ``timeout -s KILL N`` so nothing outlives its budget, and the
  controller gives up on the channel a little after N: a vanished host cannot hang us;
- connect/banner/auth/channel timeouts and a keepalive;
- foreign errors are mapped once, in ``_mapped``: socket/timeout/EOF -> HostUnreachable (transient),
  AuthenticationException -> AuthenticationFailed, SFTP file errors -> TransferError.
"""

from __future__ import annotations

import contextlib
import getpass
import select
import shlex
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko

from orchestrator import known_hosts
from orchestrator.errors import AuthenticationFailed, HostError, HostUnreachable, TransferError
from orchestrator.inventory import HostConfig
from orchestrator.transport.base import ExecResult, Host

#: seconds between keepalive packets (keeps NAT/firewall state alive on long, quiet runs)
KEEPALIVE_S = 15
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
        self._lock = threading.Lock()
        self._connect()

    # -- connection ------------------------------------------------------------------------
    def _load_key(self) -> paramiko.PKey:
        path = self.cfg.identity_file
        if path is None:
            raise AuthenticationFailed(self.name, "no identity_file in the inventory")
        try:
            return paramiko.PKey.from_path(str(path))
        except (OSError, paramiko.SSHException, ValueError) as exc:
            # not transient: a retry cannot fix an unreadable or passphrase-protected key
            raise AuthenticationFailed(self.name, f"cannot load identity_file {path}: {exc}") from exc

    def _connect(self) -> None:
        pkey = self._load_key()
        transport: paramiko.Transport | None = None
        try:
            with self._mapped("connect to"):
                sock = socket.create_connection((self.address, self.port), timeout=self.timeout_s)
                transport = paramiko.Transport(sock)
                transport.banner_timeout = self.timeout_s
                transport.handshake_timeout = self.timeout_s
                transport.auth_timeout = self.timeout_s
                transport.channel_timeout = self.timeout_s
                self._prefer_known_key_types(transport)
                transport.start_client(timeout=self.timeout_s)
                key = transport.get_remote_server_key()
                known_hosts.verify(
                    self.known_hosts_path,
                    self.name,
                    self.label,
                    key.get_name(),
                    key.get_base64(),
                    accept_new=self.accept_new,
                )
                self.server_key_fingerprint = key.fingerprint
                transport.auth_publickey(self.user, pkey)
                if not transport.is_authenticated():
                    raise AuthenticationFailed(self.name, f"{self.user}@{self.label}: not authenticated")
                transport.set_keepalive(KEEPALIVE_S)
        except BaseException:
            if transport is not None:
                transport.close()
            raise
        self._transport = transport

    def _prefer_known_key_types(self, transport: paramiko.Transport) -> None:
        """Ask for the key type we already hold, so a host with several keys offers that one."""
        known = {k.key_type for k in known_hosts.lookup(self.known_hosts_path, self.label, host=self.name)}
        opts = transport.get_security_options()
        types = list(opts.key_types)
        first = [t for t in types if t in known]
        if first:
            opts.key_types = tuple(first + [t for t in types if t not in known])

    def _live(self) -> paramiko.Transport:
        t = self._transport
        if t is None or not t.is_active():
            raise HostUnreachable(self.name, f"connection to {self.label} is closed")
        return t

    def is_connected(self) -> bool:
        return self._transport is not None and self._transport.is_active()

    @contextlib.contextmanager
    def _mapped(self, what: str, *, transfer: bool = False) -> Iterator[None]:
        """The one place foreign errors become crosshost errors (``raise … from exc``)."""
        try:
            yield
        except HostError:
            raise
        except paramiko.AuthenticationException as exc:
            raise AuthenticationFailed(
                self.name,
                f"{self.user}@{self.label} refused key {self.cfg.identity_file}: {exc}",
            ) from exc
        except paramiko.ssh_exception.NoValidConnectionsError as exc:
            raise HostUnreachable(self.name, f"{what} {self.label}: {exc}") from exc
        except (OSError, paramiko.SFTPError) as exc:
            # A file error over a live connection is the file's fault, not the host's.
            if transfer and self.is_connected() and (
                isinstance(exc, paramiko.SFTPError) or getattr(exc, "errno", None) is not None
            ):
                raise TransferError(self.name, f"{what}: {exc}") from exc
            raise HostUnreachable(self.name, f"{what} {self.label}: {_describe(exc)}") from exc
        except (EOFError, paramiko.SSHException) as exc:
            raise HostUnreachable(self.name, f"{what} {self.label}: {_describe(exc)}") from exc

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

    def get(self, remote: str, local: Path) -> None:
        # Open the remote file first: a missing file must not leave an empty local one behind.
        with self._mapped(f"get {remote} -> {local}", transfer=True):
            sftp = self._sftp_client()
            with sftp.open(remote, "rb") as rf:
                rf.prefetch(rf.stat().st_size)
                with open(local, "wb") as lf:
                    shutil.copyfileobj(rf, lf, _BUF)

    # -- reverse port forwarding -----------------------------------------------------------
    def forward_remote(self, local_port: int) -> int:
        """Listen on the host's 127.0.0.1:<port chosen by sshd>, pipe each connection to the
        controller's 127.0.0.1:``local_port`` over this same transport; return the host's port."""
        with self._mapped("port forward on"):
            t = self._live()
            port = t.request_port_forward("127.0.0.1", 0, handler=self._on_forwarded)
        self._forwards[port] = local_port
        return port

    def cancel_forward(self, port: int) -> None:
        """Stop forwarding the host's ``port``; idempotent, a no-op on a closed connection."""
        if self._forwards.pop(port, None) is None or not self.is_connected():
            return
        # global_request, not Transport.cancel_port_forward: that one drops the handler of every
        # other forward of this transport too.
        with contextlib.suppress(Exception), self._mapped("cancel forward on"):
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
        self._forwards.clear()
        sftp, self._sftp = self._sftp, None
        transport, self._transport = self._transport, None
        if sftp is not None:
            with contextlib.suppress(Exception):
                sftp.close()
        if transport is not None:
            transport.close()


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


def _seconds(timeout: float) -> str:
    """`timeout` accepts a decimal duration; keep it short and never zero (0 disables it)."""
    return f"{max(timeout, 0.01):.3f}".rstrip("0").rstrip(".")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
