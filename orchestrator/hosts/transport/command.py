"""CommandHost: any environment an exec-style command reaches (``docker exec -i box``, ``kubectl exec -i
pod --``, ``nsenter -t PID -a``): the inventory's ``argv`` prefix, then ``sh -c <script>``.

Everything goes through one exec of the prefix each: a command (under ``timeout -s KILL`` on the host,
as on an SSH host, so nothing outlives it), a file pushed through the exec's stdin, a file pulled as
the exec's stdout (refused unless a regular file, counted and cut at the cap on this side), and the
controller's loopback reached through a relay (``RELAY_PY``) that listens on the host's 127.0.0.1
and carries each connection over the relay exec's stdin and stdout: no network between the two.

Every script first prints ``EXEC_MARK`` on stderr: an exec whose stderr does not start with it never
reached the host's shell (the prefix's tool failed: no such container, pod or process), which is
the host's failure (``HostUnreachable``), never a command's exit code.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import shlex
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

from orchestrator.errors import HostUnreachable, TransferError
from orchestrator.hosts.remote import HELPER_FLAGS
from orchestrator.hosts.transport.base import ExecResult, Host, copy_capped
from orchestrator.hosts.transport.local import HOST_ENV_KEYS

#: what the exec tool gets of the controller's environment: a login's keys, the PATH the tool is found
#: on (the controller's own: the tool is the controller's) and those the usual tools read to find their
#: daemon or cluster. Nothing else: ``nsenter`` hands its environment to what it
#: runs inside the target, where an API key of the controller's must never be.
TOOL_ENV_KEYS = (
    *HOST_ENV_KEYS, "PATH", "DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY",
    "CONTAINER_HOST", "CONTAINER_CONNECTION", "XDG_RUNTIME_DIR", "KUBECONFIG", "SSH_AUTH_SOCK",
)  # fmt: skip

#: the first line every script prints on stderr (removed from what the caller sees)
EXEC_MARK = "crosshost-exec-reached"
#: how long past a command's own timeout the controller waits for the exec before giving up on it
EXEC_GRACE_S = 5.0
#: exit code of a command killed by `timeout -s KILL` (128 + SIGKILL)
KILLED = 137
_FRAME = struct.Struct(">cII")  # kind, connection id, payload length

#: run by the host's Python: streams the regular file argv[1] to stdout; a link, a device or a fifo
#: is refused before a byte is read (O_NOFOLLOW, then the open handle's own stat)
GET_PY = r"""
import os, stat, sys
try:
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
except OSError as e:
    sys.stderr.write("crosshost-get: %s: %s\n" % ("a symbolic link" if e.errno == 40 else "cannot open", e.strerror))
    sys.exit(3)
if not stat.S_ISREG(os.fstat(fd).st_mode):
    sys.stderr.write("crosshost-get: not a regular file\n")
    sys.exit(3)
out = sys.stdout.buffer
while True:
    chunk = os.read(fd, 65536)
    if not chunk:
        break
    out.write(chunk)
out.flush()
"""

def deliver(kind: bytes, sock: socket.socket, data: bytes) -> bool:
    """Apply a frame from the other end to its connection: D (bytes) is sent on, E (that side sent
    EOF) shuts the writing side; False for any other kind (C: closed there). Both ends of the relay
    run this one function: its source is part of ``RELAY_PY``, for the host's Python of any 3.x."""
    if kind == b"D":
        sock.sendall(data)
    elif kind == b"E":
        sock.shutdown(socket.SHUT_WR)
    else:
        return False
    return True


#: run by the host's Python: listens on 127.0.0.1 (a port the kernel picks, printed first), and
#: carries each connection to it as frames (kind, id, length, bytes) on stdout; frames for it come on
#: stdin. O: a new connection; D: bytes; E: that side sent EOF; C: closed. Ends when stdin ends.
RELAY_PY = "import os, select, socket, struct, sys\n" + inspect.getsource(deliver) + r"""
F = struct.Struct(">cII")
ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
ls.bind(("127.0.0.1", 0))
ls.listen(64)
out = sys.stdout.buffer
out.write(("crosshost-relay %d\n" % ls.getsockname()[1]).encode())
out.flush()
conns, reading, buf, nxt = {}, {}, b"", 1
def send(kind, cid, data=b""):
    out.write(F.pack(kind, cid, len(data)) + data)
    out.flush()
def drop(cid):
    s = conns.pop(cid, None)
    reading.pop(cid, None)
    if s is not None:
        s.close()
while True:
    watch = [ls, 0] + list(reading.values())
    ready = select.select(watch, [], [])[0]
    if ls in ready:
        c = ls.accept()[0]
        conns[nxt] = reading[nxt] = c
        send(b"O", nxt)
        nxt += 1
    if 0 in ready:
        chunk = os.read(0, 65536)
        if not chunk:
            break
        buf += chunk
        while len(buf) >= F.size:
            kind, cid, n = F.unpack(buf[:F.size])
            if len(buf) < F.size + n:
                break
            data, buf = buf[F.size:F.size + n], buf[F.size + n:]
            s = conns.get(cid)
            if s is None:
                continue
            try:
                if not deliver(kind, s, data):
                    drop(cid)
            except OSError:
                drop(cid)
                send(b"C", cid)
    for cid, s in list(reading.items()):
        if s in ready:
            try:
                data = s.recv(65536)
            except OSError:
                data = None
            if data:
                send(b"D", cid, data)
            elif data is None:
                drop(cid)
                send(b"C", cid)
            else:
                reading.pop(cid, None)
                send(b"E", cid)
"""


def _seconds(timeout: float) -> str:
    """`timeout` accepts a decimal duration; keep it short and never zero (0 disables it)."""
    return f"{max(timeout, 0.01):.3f}".rstrip("0").rstrip(".")


def _marked(stderr: str) -> tuple[bool, str]:
    """(the script reached the host's shell, stderr without the mark)."""
    head, sep, rest = stderr.partition("\n")
    if sep and head == EXEC_MARK:
        return True, rest
    return False, stderr


class CommandHost(Host):
    kind = "command"

    def __init__(self, name: str, prefix: list[str], *, python: str = "python3", connect_timeout_s: float = 10.0) -> None:
        if not prefix:
            raise ValueError(f"{name}: an empty argv prefix")
        self.name = name
        self.prefix = list(prefix)
        self.python = python
        self.timeout_s = connect_timeout_s
        self._procs: set[subprocess.Popen[bytes]] = set()
        self._relays: dict[int, _Relay] = {}
        self._lock = threading.Lock()
        self._closed = False

    @property
    def label(self) -> str:
        return shlex.join(self.prefix)

    # -- the one exec everything goes through ----------------------------------------------------
    def _spawn(self, script: str, *, stdin: int | IO[bytes] = subprocess.DEVNULL, extra: list[str] | None = None) -> subprocess.Popen[bytes]:
        if self._closed:
            raise HostUnreachable(self.name, f"{self.label}: the host is closed")
        argv = [*self.prefix, "sh", "-c", f"echo {EXEC_MARK} >&2; {script}", *(extra or [])]
        try:
            proc = subprocess.Popen(
                argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                env=tool_env(),
            )
        except OSError as exc:
            raise HostUnreachable(self.name, f"cannot run {self.prefix[0]}: {exc.strerror or exc}") from exc
        with self._lock:
            self._procs.add(proc)
        return proc

    def _done(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.discard(proc)

    def _unreached(self, what: str, code: int, stderr: str) -> HostUnreachable:
        said = " ".join(stderr.split())[-300:] or f"exit {code}"
        return HostUnreachable(self.name, f"{what}: {self.label} did not reach the host: {said}")

    def exec(self, argv: list[str], timeout: float) -> ExecResult:
        if not argv:
            raise ValueError("exec: empty argv")
        # `; exit $?` keeps the shell from exec'ing `timeout`: when timeout's KILL takes the process
        # group, the shell survives to report 137
        script = f"timeout -s KILL {_seconds(timeout)} {shlex.join(argv)}; exit $?"
        started = time.monotonic()
        proc = self._spawn(script)
        try:
            try:
                out, err = proc.communicate(timeout=timeout + max(EXEC_GRACE_S, self.timeout_s))
            except subprocess.TimeoutExpired:
                _kill(proc)
                proc.communicate()
                raise HostUnreachable(
                    self.name, f"{argv[0]}: no answer through {self.label} {time.monotonic() - started:.0f}s after start "
                    f"(the command's own timeout is {timeout:g}s)",
                ) from None
        finally:
            self._done(proc)
        duration = time.monotonic() - started
        reached, stderr = _marked(err.decode("utf-8", "replace"))
        if not reached:
            # a backend that can tell why (a container that stopped under the run) says so first
            self.check_exec(proc.returncode, duration, timeout)
            raise self._unreached(argv[0], proc.returncode, stderr)
        self.check_exec(proc.returncode, duration, timeout)
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        return ExecResult(
            tuple(argv), code, out.decode("utf-8", "replace"), stderr, duration,
            timed_out=code == KILLED and duration >= timeout,
        )  # fmt: skip

    def check_exec(self, code: int, duration: float, timeout: float) -> None:
        """After an exec that reached the host: a backend that can tell the host died under it (a
        container killed) raises ``HostUnreachable`` here. Nothing to tell by default."""
        return None

    # -- files -----------------------------------------------------------------------------------
    def put(self, local: Path, remote: str) -> None:
        try:
            src = open(local, "rb")  # noqa: SIM115 - handed to the exec as its stdin
        except OSError as exc:
            raise TransferError(self.name, f"put {local}: {exc.strerror or exc}") from exc
        with src:
            proc = self._spawn('cat > "$1"', stdin=src, extra=["crosshost-put", remote])
            try:
                _, err = proc.communicate()
            finally:
                self._done(proc)
        reached, stderr = _marked(err.decode("utf-8", "replace"))
        if not reached:
            raise self._unreached(f"put {remote}", proc.returncode, stderr)
        if proc.returncode != 0:
            self.check_exec(proc.returncode, 0.0, float("inf"))
            raise TransferError(self.name, f"put {local} -> {remote}: {' '.join(stderr.split())[-300:] or f'exit {proc.returncode}'}")

    def get(self, remote: str, local: Path, *, max_bytes: int | None = None, cancel: threading.Event | None = None) -> None:
        proc = self._spawn(f'exec "$1" {HELPER_FLAGS} -c "$2" "$3"', extra=["crosshost-get", self.python, GET_PY, remote])
        assert proc.stdout is not None and proc.stderr is not None
        errs: list[bytes] = []
        reader = threading.Thread(target=lambda: errs.append(proc.stderr.read() if proc.stderr else b""), daemon=True)
        reader.start()
        local = Path(local)
        try:
            copy_capped(self.name, remote, proc.stdout.read, local, max_bytes=max_bytes, cancel=cancel)
        except BaseException:
            _kill(proc)
            raise
        finally:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            _kill(proc)
            reader.join(timeout=5)
            self._done(proc)
        reached, stderr = _marked(b"".join(errs).decode("utf-8", "replace"))
        if proc.returncode == 0 and reached:
            return
        with contextlib.suppress(OSError):
            local.unlink()
        if not reached:
            raise self._unreached(f"get {remote}", proc.returncode, stderr)
        self.check_exec(proc.returncode, 0.0, float("inf"))
        said = " ".join(stderr.split()).removeprefix("crosshost-get: ")[-300:] or f"exit {proc.returncode}"
        raise TransferError(self.name, f"{remote}: {said}; not transferred")

    # -- the controller's loopback, through a relay exec -------------------------------------------
    def forward_remote(self, local_port: int) -> int:
        proc = self._spawn(f'exec "$1" {HELPER_FLAGS} -u -c "$2"', stdin=subprocess.PIPE, extra=["crosshost-relay", self.python, RELAY_PY])
        relay = _Relay(self, proc, local_port)
        port = relay.start(self.timeout_s)
        self._relays[port] = relay
        return port

    def cancel_forward(self, port: int) -> None:
        relay = self._relays.pop(port, None)
        if relay is not None:
            relay.stop()

    # -- lifecycle -------------------------------------------------------------------------------
    def abandon(self) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        for port in list(self._relays):
            self.cancel_forward(port)
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            _kill(proc)


def tool_env() -> dict[str, str]:
    return {k: os.environ[k] for k in TOOL_ENV_KEYS if k in os.environ}


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


class _Relay:
    """The controller's side of ``RELAY_PY``: each connection it announces is a connection to
    127.0.0.1:``local_port`` here, bytes carried both ways, half-closes passed on."""

    def __init__(self, host: CommandHost, proc: subprocess.Popen[bytes], local_port: int) -> None:
        self.host = host
        self.proc = proc
        self.local_port = local_port
        self.socks: dict[int, socket.socket] = {}
        self.write_lock = threading.Lock()
        #: connections whose two directions have ended: (from the host, to the host)
        self.ended: dict[int, set[str]] = {}

    def start(self, timeout_s: float) -> int:
        assert self.proc.stdout is not None
        got: list[bytes] = []
        t = threading.Thread(target=lambda: got.append(self.proc.stdout.readline() if self.proc.stdout else b""), daemon=True)
        t.start()
        t.join(timeout_s)
        line = got[0].decode("ascii", "replace").split() if got else []
        if len(line) != 2 or line[0] != "crosshost-relay" or not line[1].isdigit():
            self.stop()
            err = self.proc.stderr.read().decode("utf-8", "replace") if self.proc.stderr and self.proc.poll() is not None else ""
            reached, said = _marked(err)
            if not reached and self.proc.poll() is not None:
                raise self.host._unreached("forward", self.proc.returncode, said)
            raise HostUnreachable(
                self.host.name, f"the relay to the controller's 127.0.0.1:{self.local_port} did not start "
                f"({' '.join(said.split())[-200:] or 'no answer'}; the host needs {self.host.python})",
            )  # fmt: skip
        threading.Thread(target=self._from_host, daemon=True, name=f"relay-{self.host.name}").start()
        return int(line[1])

    def _send(self, kind: bytes, cid: int, data: bytes = b"") -> None:
        assert self.proc.stdin is not None
        with self.write_lock, contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write(_FRAME.pack(kind, cid, len(data)) + data)
            self.proc.stdin.flush()

    def _from_host(self) -> None:
        stream = self.proc.stdout
        assert stream is not None
        try:
            while True:
                head = stream.read(_FRAME.size)
                if len(head) < _FRAME.size:
                    return
                kind, cid, n = _FRAME.unpack(head)
                data = stream.read(n) if n else b""
                if kind == b"O":
                    self._open(cid)
                    continue
                sock = self.socks.get(cid)
                if sock is None:
                    continue
                try:
                    if not deliver(kind, sock, data):
                        self._drop(cid)
                    elif kind == b"E":
                        self._ended(cid, "in")
                except OSError:
                    self._drop(cid)
                    self._send(b"C", cid)
        finally:
            for cid in list(self.socks):
                self._drop(cid)

    def _open(self, cid: int) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.local_port), timeout=self.host.timeout_s)
        except OSError:
            self._send(b"C", cid)
            return
        sock.settimeout(None)
        self.socks[cid] = sock
        threading.Thread(target=self._to_host, args=(cid, sock), daemon=True).start()

    def _to_host(self, cid: int, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(1 << 16)
            except OSError:
                self._send(b"C", cid)
                return
            if not data:
                self._send(b"E", cid)
                self._ended(cid, "out")
                return
            self._send(b"D", cid, data)

    def _ended(self, cid: int, direction: str) -> None:
        """Both directions over: the connection is closed on both sides."""
        with self.write_lock:
            done = self.ended.setdefault(cid, set())
            done.add(direction)
            both = len(done) == 2
        if both:
            self._drop(cid)
            self._send(b"C", cid)

    def _drop(self, cid: int) -> None:
        self.ended.pop(cid, None)
        sock = self.socks.pop(cid, None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def stop(self) -> None:
        # EOF on its stdin ends the relay on the host (killing a `docker exec` client would not)
        with self.write_lock, contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        _kill(self.proc)
        self.host._done(self.proc)
        for cid in list(self.socks):
            self._drop(cid)
