"""The runner's own error tree (it never imports ``orchestrator``; the controller maps these).

    RunnerError          exit 3: an internal failure of the runner
    └── InputError       exit 2: bad input; the message names the file/key and what is wrong
        ├── SuiteError       a suite directory, suite.toml, task.toml, script.json, suite.json
        ├── ContractError    contract.json, tools.json
        ├── TraceError       a trace that is unreadable or not a trace at all
        └── SecretVisible    the runner can see a secret-shaped environment key
"""

from __future__ import annotations


class RunnerError(Exception):
    """Root of every error the runner raises on purpose."""

    exit_code = 3


class InputError(RunnerError):
    exit_code = 2


class SuiteError(InputError):
    pass


class ContractError(InputError):
    pass


class TraceError(InputError):
    pass


class SecretVisible(InputError):
    pass
