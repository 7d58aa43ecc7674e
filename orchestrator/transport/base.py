"""The one transport abstraction (as pyinfra's connectors): four operations, one file per backend.

A non-zero exit is data in ``ExecResult``; only transport failures raise (``HostError`` subclasses).
The same conformance suite (tests/orchestrator/test_transport_conformance.py) runs against every
backend: LocalHost, a real SshHost, and FakeHost.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType


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
    #: "local", "ssh" or "fake"
    kind: str

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
    def get(self, remote: str, local: Path) -> None:
        """Copy the remote file ``remote`` to ``local``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection; idempotent."""

    def __enter__(self) -> Host:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
