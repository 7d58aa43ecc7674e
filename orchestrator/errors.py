"""The controller's errors, under the one root of ``agent_runner.errors`` (its docstring draws the tree).

The root and the input errors the runner shares are re-exported here, so the controller imports every
error from this module. The controller adds:

    InputError
    ├── InventoryError       hosts.toml
    └── ApiKeyMissing        [agent] api_key_env names a variable unset on the controller
    HostError                exit 3: infrastructure; carries the host's name
    ├── HostUnreachable      connect refused / timed out (transient: retried) / DNS (not retried)
    ├── HostKeyRejected      changed host key (never retried)
    │   └── HostKeyUnknown   a key not yet trusted; the command's hint adds --accept-new to it
    ├── AuthenticationFailed the key was refused (never retried)
    ├── TransferError        SFTP put/get failed
    ├── ArchiveRejected      a pulled archive held an unsafe member
    ├── RunnerCrashed        the runner exited in a way that is not a verdict
    ├── WorkspaceLeft        the remote workspace could not be removed or verified gone
    └── ExportFailed         an export's receiver (an OTLP endpoint) unreachable or refusing

A CLI error is one line: ``box-b: HostKeyRejected: ...`` (host prefix only for HostError).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agent_runner.errors import (
    ContractError,
    CrosshostError,
    InputError,
    RunnerError,
    SecretVisible,
    SuiteError,
    TraceError,
)

__all__ = [
    "ApiKeyMissing",
    "ArchiveRejected",
    "AuthenticationFailed",
    "ContractError",
    "CrosshostError",
    "ExportFailed",
    "HostError",
    "HostKeyRejected",
    "HostKeyUnknown",
    "HostUnreachable",
    "InputError",
    "InventoryError",
    "RunnerCrashed",
    "RunnerError",
    "SecretVisible",
    "SuiteError",
    "TraceError",
    "TransferError",
    "WorkspaceLeft",
    "not_the_record",
    "one_line",
]


class InventoryError(InputError):
    """hosts.toml cannot be read, is not TOML, or names a key, host or file that is wrong."""


class ApiKeyMissing(InputError):
    """An openai suite's [agent] api_key_env is empty or names a variable unset on the controller."""


class HostError(CrosshostError):
    """A host (not the user's input) failed. ``host`` names the inventory entry."""

    exit_code = 3
    transient = False

    def __init__(self, host: str, message: str) -> None:
        super().__init__(message)
        self.host = host

    def one_line(self) -> str:
        return f"{self.host}: {type(self).__name__}: {self}"


class HostUnreachable(HostError):
    """Connecting to the host was refused, timed out or failed to resolve, or the connection broke."""

    transient = True


class HostKeyRejected(HostError):
    """The host's key is unknown (and --accept-new was not given) or differs from the pinned one."""


class HostKeyUnknown(HostKeyRejected):
    """An unknown host key without --accept-new; the command adds how to trust it (hints.py)."""


class AuthenticationFailed(HostError):
    """The host refused the inventory's identity_file, or that key cannot be loaded."""


class TransferError(HostError):
    """Copying a file to or from the host failed (SFTP, or a local copy for a local host)."""


class ArchiveRejected(HostError):
    """An archive pulled from the host held an unsafe member or could not be read; nothing was written."""


class RunnerCrashed(HostError):
    """The runner on the host exited or answered in a way that is not a verdict (no JSON, a crash)."""


class OutputTampered(HostError):
    """A file the host sent differs from what its runner announced over the channel, or a row's verdict from its trace."""


class WorkspaceLeft(HostError):
    """The remote workspace could not be removed, or is still there after removal."""


class ExportFailed(HostError):
    """The receiver of an export (an OTLP endpoint) could not be reached or refused what was sent."""


def one_line(exc: BaseException) -> str:
    """How any error is told in one line: ours as ``one_line()`` says, a foreign one by its type."""
    if isinstance(exc, CrosshostError):
        return exc.one_line()
    return f"{type(exc).__name__}: {exc}"


if TYPE_CHECKING:
    from pydantic import ValidationError


def not_the_record(path: Path, exc: ValidationError) -> InputError:
    """A file that holds JSON but not the record it should: the file and its first wrong key, one line."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return InputError(f"{path}: {where}: {first['msg']}")
