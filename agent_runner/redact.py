"""Secret-shaped names and credential-looking strings, replaced before anything is written."""

from __future__ import annotations

import functools
import re
from typing import Any, Iterable, List

REDACTED = "[REDACTED]"

# Environment keys the runner refuses to see and `fingerprint` reports (names only, never values).
SECRET_ENV_PATTERNS = (
    "*_API_KEY",
    "*_TOKEN",
    "*_SECRET",
    "*_PASSWORD",
    "*_ACCESS_KEY",
    "*_PRIVATE_KEY",
    "*SECRET_KEY",
    "*PASSWORD",  # PGPASSWORD too
    "*_PASSWD",
    "*_PWD",  # MYSQL_PWD; not PWD or OLDPWD
    "*_CREDENTIALS",
    "API_KEY",
    "TOKEN",
    "SECRET",
    "SSH_AUTH_SOCK",
    "OPENAI_*",
    "ANTHROPIC_*",
)
# The families of environment names that hold secrets under another name: PRIVATE_KEY, NPM_AUTH,
# GH_PAT, SECRET_KEY_BASE, ENCRYPTION_KEY, SIGNING_KEY. Wide on purpose (an allowlisted name is refused,
# never shipped); only for environment names, not for record keys.
SECRET_ENV_FAMILIES = ("*PRIVATE*", "*AUTH*", "*_PAT", "PAT", "*KEY_BASE", "*ENCRYPTION_KEY",
                       "*SIGNING_KEY", "*_CREDENTIAL")
# words inside a name that the families would catch but that hold no secret (a commit's author)
_HARMLESS_WORDS = re.compile(r"AUTHOR")
# The password family by `_`-separated word: a word that is or ends in PASS, PASSWD, PASSWORD or
# PASSPHRASE (DB_PASS, PGPASS, PASSWD, DB_PASSPHRASE); a word that only contains PASS holds no secret
# (TOX_TESTENV_PASSENV, PIP_PASSTHRU).
_PASSWORD_WORD = re.compile(r"(?:^|_)[A-Z0-9]*PASS(?:WD|WORD|PHRASE)?(?=_|$)")


# Keys inside records (tool args, messages) whose values are secrets. "prompt_tokens" must not match,
# so the secret word has to end the key.
_SECRET_KEY = re.compile(
    r"(?i)(?:^|[_\-.])(?:api[_-]?key|apikey|token|secret|password|passwd|passphrase|authorization|"
    r"private[_-]?key|access[_-]?key|secret[_-]?key|client[_-]?secret|credentials?|cookie|"
    r"pass|pgpass|auth|pat|key[_-]?base|encryption[_-]?key|signing[_-]?key)$"
)
# camelCase keys (accessToken, secretKey): a boundary is put before each inner capital first.
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")

_CREDENTIAL = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)"
    r"|\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{16,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}"
    r"|\bgithub_pat_[A-Za-z0-9_]{20,}"
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"
    r"|\bxox[abprs]-[A-Za-z0-9\-]{10,}"
    r"|\bglpat-[A-Za-z0-9_\-]{20,}"
    r"|\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*"  # a JWT
)
# Secrets that sit after a marker; the marker is kept so the text still reads.
_AFTER_MARKER = re.compile(
    r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=\-]{8,}"
    r"|(://[^/\s:@]+:)[^/\s@]+(?=@)"  # the password of scheme://user:password@host
    r"|(\b[A-Za-z_][A-Za-z0-9_]*(?:token|secret|password|passwd|api_key|access_key|secret_key|private_key)=)"
    r"(?!\[REDACTED\])[^\s'\"]+"
)


def _glob(name: str, pattern: str) -> bool:
    """``fnmatch.fnmatchcase`` for the patterns above, whose only wildcard is ``*``: without the
    regular expression ``fnmatch`` compiles for each (25 of them were ~4 ms of every runner's start)."""
    first, *rest = pattern.split("*")
    if not rest:
        return name == pattern
    last = rest.pop()
    end = len(name) - len(last)
    if end < len(first) or not name.startswith(first) or not name.endswith(last):
        return False
    at = len(first)
    for part in rest:  # each in turn, leftmost: what a ``*`` before it skips is the least it can be
        at = name.find(part, at, end)
        if at < 0:
            return False
        at += len(part)
    return True


# Keys repeat endlessly (every trace record is redacted; 17 patterns per key), so both answers are
# memoised. Bounded: a key is short, and an unbounded cache would grow with hostile input.
@functools.lru_cache(maxsize=4096)
def is_secret_env_key(name: str) -> bool:
    upper = name.upper()
    if any(_glob(upper, pattern) for pattern in SECRET_ENV_PATTERNS):
        return True
    if _PASSWORD_WORD.search(upper):
        return True
    upper = _HARMLESS_WORDS.sub("", upper)
    return any(_glob(upper, pattern) for pattern in SECRET_ENV_FAMILIES)


def looks_like_credential(value: str) -> bool:
    """Whether ``value`` holds something redaction would replace (a key, a JWT, a PEM block, a
    connection string with a password)."""
    return redact_text(value) != value


def secret_env_keys(keys: Iterable[str]) -> List[str]:
    return sorted(k for k in keys if is_secret_env_key(k))


@functools.lru_cache(maxsize=4096)
def is_secret_key(name: str) -> bool:
    upper = name.upper()
    return bool(_SECRET_KEY.search(_CAMEL.sub("_", name))) or any(
        _glob(upper, pattern) for pattern in SECRET_ENV_PATTERNS
    )


def _keep_marker(match: "re.Match[str]") -> str:
    return next(g for g in match.groups() if g is not None) + REDACTED


def _redact_text(text: str) -> str:
    return _AFTER_MARKER.sub(_keep_marker, _CREDENTIAL.sub(REDACTED, text))


# Every key and value of every trace record passes here and the same short strings repeat (keys,
# tool names, paths), so short ones are memoised; bounded in count and in length, so hostile input
# cannot grow it past a few MB.
_MEMO_MAX_LEN = 256
_redact_short = functools.lru_cache(maxsize=8192)(_redact_text)


def redact_text(text: str) -> str:
    if len(text) <= _MEMO_MAX_LEN:
        return _redact_short(text)
    return _redact_text(text)


def redact(obj: Any) -> Any:
    """A copy of a JSON-able value with secret-keyed values and credential-looking strings replaced."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            safe_key = redact_text(key) if isinstance(key, str) else key
            if isinstance(key, str) and is_secret_key(key) and value not in (None, "", [], {}):
                out[safe_key] = REDACTED
            else:
                out[safe_key] = redact(value)
        return out
    if isinstance(obj, (list, tuple)):
        return [redact(v) for v in obj]
    return obj
