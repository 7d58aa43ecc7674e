"""Secret-shaped names and credential-looking strings, replaced before anything is written."""

from __future__ import annotations

import fnmatch
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
    "SSH_AUTH_SOCK",
    "OPENAI_*",
    "ANTHROPIC_*",
)

# Keys inside records (tool args, messages) whose values are secrets. "prompt_tokens" must not match,
# so the secret word has to end the key.
_SECRET_KEY = re.compile(
    r"(?i)(?:^|[_\-.])(?:api[_-]?key|apikey|token|secret|password|passwd|authorization|"
    r"private[_-]?key|access[_-]?key|client[_-]?secret|credentials?|cookie)$"
)

_CREDENTIAL = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)"
    r"|\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{16,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}"
    r"|\bgithub_pat_[A-Za-z0-9_]{20,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\bxox[abprs]-[A-Za-z0-9\-]{10,}"
)


def is_secret_env_key(name: str) -> bool:
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in SECRET_ENV_PATTERNS)


def secret_env_keys(keys: Iterable[str]) -> List[str]:
    return sorted(k for k in keys if is_secret_env_key(k))


def is_secret_key(name: str) -> bool:
    return bool(_SECRET_KEY.search(name)) or is_secret_env_key(name)


def redact_text(text: str) -> str:
    return _CREDENTIAL.sub(REDACTED, text)


def redact(obj: Any) -> Any:
    """A copy of a JSON-able value with secret-keyed values and credential-looking strings replaced."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if isinstance(key, str) and is_secret_key(key) and value not in (None, "", [], {}):
                out[key] = REDACTED
            else:
                out[key] = redact(value)
        return out
    if isinstance(obj, (list, tuple)):
        return [redact(v) for v in obj]
    return obj
