"""Every error crosshost raises on purpose, and the exit code it ends a command with.

One tree for the runner and the controller. The root and the input errors live here (standard
library only: this module travels in the runner zipapp); ``orchestrator.errors`` adds the errors only
the controller raises (the inventory, the model key, hosts) under the same root and re-exports these.

    CrosshostError           exit 1: a run could not go on for a reason that is neither input nor host
    ├── InputError           exit 2: the user's input is wrong; the message names file/key and what to do
    │   ├── SuiteError           a suite directory, suite.toml, task.toml, script.json, suite.json
    │   ├── ContractError        contract.json, tools.json
    │   ├── TraceError           a trace, a run directory's manifest or results.jsonl
    │   ├── SecretVisible        the runner sees a secret-shaped environment key
    │   ├── InventoryError       hosts.toml                                       (orchestrator.errors)
    │   └── ApiKeyMissing        [agent] api_key_env names an unset variable       (orchestrator.errors)
    ├── RunnerError          exit 3: the runner itself failed (not the input, not the agent)
    └── HostError            exit 3: a host failed; carries the host's name      (orchestrator.errors)
        ├── HostUnreachable      connect refused / timed out / DNS (transient: retried)
        ├── HostKeyRejected      unknown or changed host key (never retried)
        ├── AuthenticationFailed the key was refused (never retried)
        ├── TransferError        copying a file to or from the host failed
        ├── ArchiveRejected      a pulled archive held an unsafe member
        ├── RunnerCrashed        the runner exited in a way that is not a verdict
        └── WorkspaceLeft        the remote workspace could not be removed or verified gone

Foreign errors (OSError, json, tomllib, paramiko, socket, pydantic) are mapped once, where they
happen, with ``raise ... from exc``; an error is never re-classified by its message. A command
prints ``one_line()`` (``ClassName: message``, ``host: `` first for a HostError) and exits with
``exit_code``. What an agent does wrong inside an attempt is not an error of this tree: it is the
attempt's finish reason and verdict (``agent_runner.agents``).
"""

from __future__ import annotations


class CrosshostError(Exception):
    """Root of every error crosshost raises on purpose; raised itself when a run cannot go on (exit 1)."""

    exit_code = 1

    def one_line(self) -> str:
        return f"{type(self).__name__}: {self}"


class InputError(CrosshostError):
    """The user's input is wrong (a file, a flag, a key); the message names it and what to do."""

    exit_code = 2


class SuiteError(InputError):
    """A suite directory, suite.toml, task.toml, script.json or the shipped suite.json is invalid."""


class ContractError(InputError):
    """contract.json or tools.json cannot be read or is not a valid contract / allow-deny list."""


class TraceError(InputError):
    """A trace, a run directory's manifest or a results.jsonl is unreadable or not what it claims."""


class SecretVisible(InputError):
    """The runner was started with a secret-shaped environment key visible to it; it refuses to run."""


class RunnerError(CrosshostError):
    """The runner itself failed: its sources cannot be found, or attempt workspaces were left behind."""

    exit_code = 3
