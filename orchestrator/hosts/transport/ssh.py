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
- AES-GCM offered first (``session._prefer_aead_ciphers``): with the others paramiko checks each
  packet's MAC in Python, the controller's largest cost at 128 hosts;
- foreign errors are mapped once, in ``session.mapped_error``: socket/timeout/EOF -> HostUnreachable (transient),
  AuthenticationException -> AuthenticationFailed, SFTP file errors -> TransferError.
"""

from __future__ import annotations

import contextlib
import getpass
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko

from orchestrator.errors import HostError, HostUnreachable, TransferError
from orchestrator.hosts import known_hosts
from orchestrator.hosts.inventory import HostConfig
from orchestrator.hosts.transport import jump, session
from orchestrator.hosts.transport.base import ExecResult, Host, copy_capped, refuse_irregular

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
        self.timeout_s = cfg.connect_timeout_s
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
            self._transport = session.start_transport(sock, self.cfg, self.name, accept_new=self.accept_new)
            return
        bastion = jump.acquire(self.cfg.jump, self.name, accept_new=self.accept_new)
        try:
            # The gate bounds connections being opened through the bastion (its targets' MaxStartups).
            with bastion.gate:
                chan = bastion.open(self.address, self.port, self.name, self.timeout_s)
                self._transport = session.start_transport(
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
            raise session.mapped_error(exc, self.name, f"{what} {self.label}") from exc
        except (EOFError, paramiko.SSHException) as exc:
            raise session.mapped_error(exc, self.name, f"{what} {self.label}") from exc

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
                    if chan.eof_received:  # its pipe is readable for good now: wait for the exit status instead
                        chan.status_event.wait(0.5)
                    else:
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
                copy_capped(self.name, remote, _windows(rf, attrs.st_size or 0), Path(local), max_bytes=max_bytes, cancel=cancel)

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
            session.close_transport(transport)
        bastion, self._bastion = self._bastion, None
        if bastion is not None:
            jump.release(bastion)


def _pipe(chan: paramiko.Channel, local_port: int, connect_timeout: float) -> None:
    """Copy bytes both ways between a forwarded channel and 127.0.0.1:local_port until one side ends."""
    try:
        sock = socket.create_connection(("127.0.0.1", local_port), timeout=connect_timeout)
    except OSError:
        chan.close()
        return
    try:
        sock.settimeout(None)
        session.no_delay(sock)  # a request's last bytes go now, not after the proxy's delayed ACK
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
#: how long a get waits for paramiko's read-ahead to have sent its last request
_READ_AHEAD_WAIT_S = 2.0


def _windows(rf: paramiko.SFTPFile, stated: int) -> Callable[[int], bytes]:
    """A ``read`` for ``copy_capped`` that keeps one window of reads in flight, however long the
    file is: whole-file prefetch queues a request for every chunk up front and keeps asking after
    the copy stopped. A short window is the end; the host's word on the size only shapes the windows.

    paramiko's read-ahead thread sends a window's requests while their answers come: an answer that
    ends the file early would end the read while that thread still sends, onto a connection the
    caller may close the moment the get returns (the thread then dies of "Socket is closed"). So a
    window asks for no more than the ``stated`` size and one byte (only its last request can meet
    the end), past that size one request at a time, and a window that ended early anyway (the file
    shrank, or the host lied) waits for the read-ahead to have sent its last request."""
    offset = 0
    done = False
    one = paramiko.SFTPFile.MAX_REQUEST_SIZE

    def read(_: int) -> bytes:
        nonlocal offset, done
        if done:
            return b""
        ask = min(GET_WINDOW, stated - offset + 1) if stated > offset else one
        data = b"".join(rf.readv([(offset, ask)]))
        offset += len(data)
        done = len(data) < ask
        if done and len(data) < (ask - 1) // one * one:  # ended before the window's last request
            _wait_for_read_ahead()
        return data

    return read


def _wait_for_read_ahead() -> None:
    """Wait (a short while at most) for paramiko's read-ahead threads: they have no handle, only
    the name Python gives a thread after its target."""
    deadline = time.monotonic() + _READ_AHEAD_WAIT_S
    for thread in threading.enumerate():
        if thread.name.endswith("(_prefetch_thread)"):
            thread.join(max(0.0, deadline - time.monotonic()))


def _seconds(timeout: float) -> str:
    """`timeout` accepts a decimal duration; keep it short and never zero (0 disables it)."""
    return f"{max(timeout, 0.01):.3f}".rstrip("0").rstrip(".")
