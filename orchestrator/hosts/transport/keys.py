"""Client keys: an identity file (plain, or unlocked by ``passphrase_env``) and a running ssh-agent.

paramiko's key errors are mapped here, once: a passphrase-protected key that nothing unlocks is
``InventoryError`` (exit 2) naming the key file and both ways to unlock it, before any host is
touched; ``hosts`` and ``replay`` both load the inventory through this check, so they agree.
A key is decrypted once per process (bcrypt makes that slow) and kept in memory only.
"""

from __future__ import annotations

import base64
import os
import threading
from pathlib import Path

import paramiko

from orchestrator.errors import InventoryError

_cache: dict[tuple[str, int, str | None], paramiko.PKey] = {}
_cache_lock = threading.Lock()

_OPENSSH_BEGIN = "-----BEGIN OPENSSH PRIVATE KEY-----"
_OPENSSH_MAGIC = b"openssh-key-v1\x00"


def unlock_hint(path: Path) -> str:
    return (
        f"add it to a running ssh-agent (`ssh-add {path}`) and set use_agent = true, "
        'or set passphrase_env = "VAR" naming a controller variable that holds its passphrase'
    )


def is_locked(path: Path) -> bool:
    """Whether the private key file is passphrase-protected (read from its header: no decryption)."""
    text = Path(path).read_text(errors="replace")
    if "-----BEGIN ENCRYPTED PRIVATE KEY-----" in text or "Proc-Type: 4,ENCRYPTED" in text:
        return True
    if _OPENSSH_BEGIN not in text:
        return False
    body = text.split(_OPENSSH_BEGIN, 1)[1].split("-----END", 1)[0]
    try:
        blob = base64.b64decode("".join(body.split()))
    except ValueError:
        return False  # unreadable: paramiko says why when it loads it
    if not blob.startswith(_OPENSSH_MAGIC):
        return False
    rest = blob[len(_OPENSSH_MAGIC) :]
    size = int.from_bytes(rest[:4], "big")
    return rest[4 : 4 + size] != b"none"


def load_identity(path: Path, passphrase_env: str | None, *, where: str) -> paramiko.PKey:
    """The private key of ``path``, decrypted with ``$passphrase_env`` when it is locked.

    ``where`` names the inventory entry for the error line (``hosts.toml: host 'box-a'``).
    """
    try:
        stat = path.stat()
    except OSError as exc:
        raise InventoryError(f"{where}: key file {path}: {exc.strerror or exc}") from exc
    cache_key = (str(path), stat.st_mtime_ns, passphrase_env)
    with _cache_lock:
        if cache_key in _cache:
            return _cache[cache_key]
    passphrase: str | None = None
    if passphrase_env is not None:
        passphrase = os.environ.get(passphrase_env)
        if passphrase is None:
            raise InventoryError(
                f"{where}: key 'passphrase_env': {passphrase_env} is not set on the controller "
                f"(it must hold the passphrase of {path})"
            )
    try:
        # bytes: paramiko hands a str passphrase to cryptography, which wants bytes (a TypeError)
        key = paramiko.PKey.from_path(str(path), password=None if passphrase is None else passphrase.encode())
    except (paramiko.PasswordRequiredException, TypeError) as exc:
        # TypeError: cryptography's "Key is password-protected" for an OpenSSH-format key
        raise InventoryError(f"{where}: key file {path} is passphrase-protected: {unlock_hint(path)}") from exc
    except (paramiko.SSHException, ValueError) as exc:
        if passphrase is not None and is_locked(path):
            raise InventoryError(
                f"{where}: key file {path}: the passphrase in ${passphrase_env} does not unlock it"
            ) from exc
        raise InventoryError(f"{where}: key file {path} is not a usable private key: {exc}") from exc
    except OSError as exc:
        raise InventoryError(f"{where}: key file {path}: {exc.strerror or exc}") from exc
    with _cache_lock:
        _cache[cache_key] = key
    return key


def public_blob(path: Path) -> bytes | None:
    """The public key blob of ``path.pub``, when that file exists (to pick the agent's matching key)."""
    try:
        fields = Path(f"{path}.pub").read_text().split()
        return base64.b64decode(fields[1]) if len(fields) >= 2 else None
    except (OSError, ValueError):
        return None
