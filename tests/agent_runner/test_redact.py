"""Redaction: what a user would call a secret never reaches a trace, results row or error line."""

from __future__ import annotations

import json

import pytest

from agent_runner.redact import REDACTED, is_secret_env_key, redact, redact_text


@pytest.mark.parametrize(
    "key",
    [
        "accessToken",
        "authToken",
        "apiToken",
        "secret_key",
        "SECRET_KEY",
        "secretKey",
        "passphrase",
        "Authorization",
        "password",
        "api_key",
        "X-Api-Key",
        "client_secret",
    ],
)
def test_values_under_secret_shaped_keys_are_redacted(key: str) -> None:
    out = redact({"args": {"nested": [{key: "hunter2-value"}]}})
    assert "hunter2-value" not in json.dumps(out)


@pytest.mark.parametrize("key", ["prompt_tokens", "completion_tokens", "path", "tokenizer", "max_tokens"])
def test_ordinary_keys_are_kept(key: str) -> None:
    assert redact({key: "v"}) == {key: "v"}


@pytest.mark.parametrize(
    "text, secret",
    [
        ("Authorization: Bearer abcdef0123456789xyz", "abcdef0123456789xyz"),
        ("curl https://bob:hunter2pass@example.com/x", "hunter2pass"),
        ("export GITHUB_TOKEN=abc123def456", "abc123def456"),
        ("PGPASSWORD=s3cretpw psql", "s3cretpw"),
        ("ASIA" + "B" * 16, "ASIA" + "B" * 16),
        ("glpat-" + "c" * 20, "glpat-" + "c" * 20),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig_nature-x", "eyJzdWIiOiIxMjM0NTY3ODkwIn0"),
    ],
)
def test_credential_shaped_text_is_redacted(text: str, secret: str) -> None:
    out = redact_text(text)
    assert secret not in out
    assert REDACTED in out


def test_a_credential_used_as_a_dict_key_is_redacted() -> None:
    secret = "sk-" + "b" * 24
    assert secret not in json.dumps(redact({secret: 1}))


@pytest.mark.parametrize(
    "key",
    [
        "TOKEN",
        "API_KEY",
        "PASSWORD",
        "SECRET",
        "SECRET_KEY",
        "PGPASSWORD",
        "MYSQL_PWD",
        "DJANGO_SECRET_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
        # the issue's own list: *_API_KEY, *_TOKEN, *_SECRET, SSH_AUTH_SOCK, OPENAI_*, ANTHROPIC_*
        "FOO_API_KEY",
        "FOO_TOKEN",
        "FOO_SECRET",
        "SSH_AUTH_SOCK",
        "OPENAI_ORGANIZATION",
        "ANTHROPIC_BASE_URL",
    ],
)
def test_bare_and_prefixed_secret_env_keys_are_secret_shaped(key: str) -> None:
    assert is_secret_env_key(key)


@pytest.mark.parametrize(
    "key", ["PATH", "LANG", "LC_ALL", "TZ", "PWD", "OLDPWD", "HOME", "TOKENIZERS_PARALLELISM"]
)
def test_ordinary_env_keys_are_not_secret_shaped(key: str) -> None:
    assert not is_secret_env_key(key)


@pytest.mark.parametrize("pad", [0, 200, 240, 250, 300, 5000])
def test_a_credential_is_redacted_every_time_whatever_the_string_length(pad: int) -> None:
    # short strings are memoised, long ones are not: both sides of that line, and a repeat (a memo hit)
    text = "x" * pad + " Authorization: Bearer abcdef0123456789 and sk-" + "A" * 24
    for _ in range(2):
        out = redact_text(text)
        assert "abcdef0123456789" not in out and "sk-AAAA" not in out
        assert out.startswith("x" * pad + " Authorization: Bearer " + REDACTED)


def test_a_repeated_key_in_many_records_is_redacted_in_each() -> None:
    records = [{"api_token": f"v{i}", "note": "db_password=hunter2", "ok": "plain"} for i in range(3)]
    assert [redact(r) for r in records] == [
        {"api_token": REDACTED, "note": f"db_password={REDACTED}", "ok": "plain"}
    ] * 3
