"""The one transport abstraction (as pyinfra's connectors): four operations, one file per backend.

A non-zero exit is data in ``ExecResult``; only transport failures raise (``HostError`` subclasses).
What a backend must do is checked by ``orchestrator/hosts/transport/conformance.py`` (``self_check``),
which the tests run against every backend: LocalHost, a real SshHost, and FakeHost (its file part).

Optional capabilities are declared here with a refusal default; a backend that has one overrides it.
Today there is one: reaching the controller's loopback from the host (the model proxy listens there),
either directly (``reaches_controller_loopback``) or through a reverse port forward (``forward_remote``).
"""

from __future__ import annotations

import abc
import contextlib
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import NotRequired

from typing_extensions import TypedDict

from orchestrator.errors import HostError, TransferError


# typing_extensions' TypedDict: the manifest's pydantic models hold these (pydantic needs it before 3.12)
class ContainerFacts(TypedDict, total=False):
    """What a container transport says of its host (``docker inspect``/``version``/``info``); the
    manifest keeps it beside the host's fingerprint (docs/run-directory.md). A key Docker did not
    answer is absent."""

    transport: str
    container: str
    started: bool  # crosshost started the container for the run (an ``image`` host)
    image: str | None
    image_id: str | None
    runtime: str | None
    network: str | None
    privileged: bool | None
    repo_digests: list[str] | None  # what `docker image inspect` says (null for none)
    server_version: str | None
    server_os: str
    kernel: str | None
    storage_driver: str
    cgroup_driver: str
    cgroup_version: str


class ConnectRetry(TypedDict):
    """One retried connect (transient errors only), as the manifest lists it: a hidden retry is a
    hidden measurement."""

    host: str
    at: NotRequired[str]  # ISO-8601 UTC; a manifest written before it was kept has none
    attempt: int
    error: str
    wait_s: float

#: one read of a capped copy
COPY_CHUNK = 1 << 16


@dataclass(frozen=True)
class ExecResult:
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float = 0.0
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class Host(abc.ABC):
    """A machine crosshost can run commands on and move files to and from."""

    #: the inventory name; every error and record carries it
    name: str
    #: "local", "ssh", "docker", "command" or "fake"
    kind: str
    #: a process on the host reaches the controller's 127.0.0.1 as it is (the host is the controller)
    reaches_controller_loopback: bool = False

    @abc.abstractmethod
    def exec(self, argv: list[str], timeout: float) -> ExecResult:
        """Run ``argv`` (no shell on our side) and return its exit code and output.

        ``timeout`` is enforced on the host itself (``timeout -s KILL``) so nothing outlives it;
        a command killed by it returns ``timed_out=True``.
        """

    @abc.abstractmethod
    def put(self, local: Path, remote: str) -> None:
        """Copy one local file to the absolute path ``remote`` (parent must exist)."""

    @abc.abstractmethod
    def get(
        self, remote: str, local: Path, *, max_bytes: int | None = None, cancel: threading.Event | None = None
    ) -> None:
        """Copy the remote file ``remote`` to ``local``.

        Only a regular file is copied (a link, a device, a fifo is a ``TransferError``); past
        ``max_bytes`` the copy stops and is a ``TransferError``, whatever the host said of its size;
        ``cancel`` set stops it within one chunk (``Interrupted``). A failed copy leaves no local file.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection; idempotent."""

    # Liveness: a backend that can tell a silent host from a slow one says so ---------------------

    def ping(self) -> None:
        """Ask the host for a reply now (``silent_s`` then tells whether it came); a no-op by default."""
        return None

    def silent_s(self) -> float:
        """How long a reply the host owes has been outstanding; 0.0 when it owes none (or cannot tell)."""
        return 0.0

    def abandon(self) -> None:
        """Give up on the host at once (Ctrl-C, a silent host): every call waiting on it ends."""
        self.close()

    def facts(self) -> ContainerFacts:
        """What the transport knows of the host that its runner cannot see (a container's image id and
        digests, the daemon's runtime): recorded beside the fingerprint. Nothing by default."""
        return ContainerFacts()

    # Optional capabilities: refused unless a backend has them ------------------------------------

    def forward_remote(self, local_port: int) -> int:
        """Listen on the host's 127.0.0.1 (a port the host picks) and carry each connection to the
        controller's 127.0.0.1:``local_port``; return the host's port. Refused by default."""
        raise HostError(
            self.name,
            f"the {self.kind} transport cannot forward a port from the host to the controller "
            f"(needed for 127.0.0.1:{local_port}, e.g. the model proxy); use an ssh host",
        )

    def cancel_forward(self, port: int) -> None:
        """Stop forwarding the host's ``port`` (from ``forward_remote``); idempotent. A backend that
        cannot forward has nothing to stop."""
        return None

    def __enter__(self) -> Host:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def refuse_irregular(host: str, remote: str, mode: int | None) -> None:
    """A file a host hands over must be a regular file (not a link to /dev/zero or to a large file)."""
    if mode is None or not stat.S_ISREG(mode):
        kind = "a symbolic link" if mode is not None and stat.S_ISLNK(mode) else "not a regular file"
        raise TransferError(host, f"{remote} is {kind}; not transferred")


def copy_capped(
    host: str,
    remote: str,
    read: Callable[[int], bytes],
    local: Path,
    *,
    max_bytes: int | None,
    cancel: threading.Event | None,
) -> int:
    """Copy what ``read`` yields into ``local`` until EOF, counting: one byte past ``max_bytes`` or
    ``cancel`` set ends it, the partial file removed. The bytes copied."""
    from orchestrator.hosts.fanout import Interrupted

    copied = 0
    try:
        with open(local, "wb") as out:
            while True:
                if cancel is not None and cancel.is_set():
                    raise Interrupted(f"{host}: copying {remote} interrupted")
                chunk = read(COPY_CHUNK)
                if not chunk:
                    return copied
                copied += len(chunk)
                if max_bytes is not None and copied > max_bytes:
                    raise TransferError(
                        host,
                        f"{remote} is larger than the {max_bytes} bytes allowed; the transfer was stopped "
                        f"at {copied} bytes and nothing of it kept",
                    )
                out.write(chunk)
    except BaseException:
        with contextlib.suppress(OSError):
            local.unlink()
        raise
