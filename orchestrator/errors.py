"""The one exception tree of the controller.

Every error crosshost raises on purpose derives from ``CrosshostError``; foreign errors (paramiko,
socket, OSError, tomllib, pydantic) are mapped once, where they happen, with ``raise ... from exc``.
Each class carries its exit code (docs/errors-and-exit-codes.md), so the CLI maps an error to an exit
without a table.

    CrosshostError                      exit 1 unless a subclass says otherwise
    ├── InputError                      exit 2: the user's input is wrong; the message names file/key
    │   ├── InventoryError              hosts.toml
    │   ├── SuiteError                  a suite directory, suite.toml, task.toml, script.json
    │   ├── ContractError               contract.json, tools.json
    │   ├── TraceError                  a trace or results.jsonl
    │   └── ApiKeyMissing               [agent] api_key_env names a variable unset on the controller
    └── HostError                       exit 3: infrastructure; carries the host's name
        ├── HostUnreachable             connect refused / timed out / DNS (transient: retried)
        ├── HostKeyRejected             unknown or changed host key (never retried)
        ├── AuthenticationFailed        the key was refused (never retried)
        ├── TransferError               SFTP put/get failed
        ├── ArchiveRejected             a pulled archive held an unsafe member
        ├── RunnerCrashed               the runner exited in a way that is not a verdict
        └── WorkspaceLeft               the remote workspace could not be removed or verified gone

A CLI error is one line: ``box-b: HostKeyRejected: ...`` (host prefix only for HostError).
"""

from __future__ import annotations


class CrosshostError(Exception):
    """Root of every error crosshost raises on purpose."""

    exit_code = 1

    def one_line(self) -> str:
        return f"{type(self).__name__}: {self}"


class InputError(CrosshostError):
    """Bad input: the message names the file, the line or key, and what is wrong."""

    exit_code = 2


class InventoryError(InputError):
    pass


class SuiteError(InputError):
    pass


class ContractError(InputError):
    pass


class TraceError(InputError):
    pass


class ApiKeyMissing(InputError):
    pass


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
    transient = True


class HostKeyRejected(HostError):
    pass


class AuthenticationFailed(HostError):
    pass


class TransferError(HostError):
    pass


class ArchiveRejected(HostError):
    pass


class RunnerCrashed(HostError):
    pass


class WorkspaceLeft(HostError):
    pass
