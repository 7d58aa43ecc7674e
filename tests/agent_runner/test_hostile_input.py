"""Hostile input on the runner's side: secrets by another name, credential-shaped values."""

from __future__ import annotations

import pytest

from agent_runner.envkeys import is_dangerous_env_key
from agent_runner.redact import REDACTED, is_secret_env_key, redact

SECRET_NAMES = ["DB_PASS", "PGPASS", "PRIVATE_KEY", "PASSWD", "SECRET_KEY_BASE", "ENCRYPTION_KEY", "SIGNING_KEY",
                "GH_PAT", "NPM_AUTH", "MYAPP_DB_PASSPHRASE", "VAULT_AUTH_METHOD", "PASS", "REDIS_PASS_FILE",
                "SMTP_PASSWD", "db_pass", "MYPASSWORD"]  # fmt: skip


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names_by_another_name_are_secret_shaped(name: str) -> None:
    assert is_secret_env_key(name)


@pytest.mark.parametrize("name", ["PATH", "LANG", "LC_ALL", "TZ", "GIT_AUTHOR_NAME", "PWD", "DATABASE_URL",
                                  # PASS inside a word, not the word: tox's, pip's and a test run's names
                                  "TOX_TESTENV_PASSENV", "PIP_PASSTHRU", "PASSTHROUGH_MODE", "CI_TESTS_PASSED"])
def test_ordinary_names_are_not(name: str) -> None:
    assert not is_secret_env_key(name)


@pytest.mark.parametrize("key", ["db_pass", "pgpass", "npm_auth", "gh_pat", "secret_key_base", "signingKey"])
def test_record_values_under_such_keys_are_redacted(key: str) -> None:
    assert redact({key: "hunter2", "passed": True, "pass_rate": 1.0}) == {
        key: REDACTED,
        "passed": True,
        "pass_rate": 1.0,
    }


@pytest.mark.parametrize(
    "value",
    [
        "postgres://app:hunter2@db.internal:5432/prod",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
    ],
)
def test_credential_looking_values_are_redacted_anywhere(value: str) -> None:
    out = redact({"note": f"connect with {value} now", "argv": ["x", value]})
    assert "hunter2" not in str(out) and "b3BlbnNzaC1rZXkt" not in str(out) and "eyJzdWIi" not in str(out)
    assert REDACTED in out["note"] and out["note"].startswith("connect with ")


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "BASH_ENV", "ENV", "IFS",
                                  "PYTHONSTARTUP", "DYLD_INSERT_LIBRARIES", "NODE_OPTIONS", "GIT_SSH_COMMAND",
                                  "GIT_EXTERNAL_DIFF", "GIT_SSH", "GIT_CONFIG_PARAMETERS", "SSH_ASKPASS",
                                  "SUDO_ASKPASS", "GIT_ASKPASS", "PROMPT_COMMAND", "EDITOR", "PAGER",
                                  "LESSOPEN", "git_ssh_command"])  # fmt: skip
def test_loader_hijacking_names_are_dangerous(name: str) -> None:
    assert is_dangerous_env_key(name)
    assert not is_dangerous_env_key("PATH") and not is_dangerous_env_key("LANG")
