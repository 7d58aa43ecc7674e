"""The tool-owned known_hosts: read, verify, and append (trust on first use, only when asked).

OpenSSH's format (``[127.0.0.1]:2222 ssh-ed25519 AAAA…``, hashed ``|1|salt|hash`` names too), so a
user can inspect it with ``ssh-keygen -F``. crosshost never writes ``~/.ssh/known_hosts`` and never
rewrites a line: a changed key is removed by hand, after checking, never by ``--accept-new``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import HostKeyRejected, HostKeyUnknown


@dataclass(frozen=True)
class KnownKey:
    """One known_hosts entry that matches a host."""

    line: int
    key_type: str
    key_b64: str

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.key_b64)


def host_label(address: str, port: int) -> str:
    """The name OpenSSH files a host under: ``[addr]:port``, or the bare address on port 22."""
    return address if port == 22 else f"[{address}]:{port}"


def fingerprint(key_b64: str) -> str:
    """OpenSSH's ``SHA256:…`` fingerprint of a base64 public key blob."""
    try:
        blob = base64.b64decode(key_b64, validate=True)
    except ValueError:  # a damaged known_hosts line: still a known (so changed) key, never a crash
        return "an unreadable key (not base64)"
    digest = hashlib.sha256(blob).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _name_matches(pattern: str, label: str) -> bool:
    if pattern.startswith("|1|"):  # HashKnownHosts: |1|base64(salt)|base64(hmac-sha1(salt, name))
        try:
            _, _, salt_b64, hash_b64 = pattern.split("|")
            salt = base64.b64decode(salt_b64)
            expected = base64.b64decode(hash_b64)
        except ValueError:
            return False
        return hmac.compare_digest(hmac.new(salt, label.encode(), hashlib.sha1).digest(), expected)
    return label in pattern.split(",")


def lookup(path: Path, label: str, *, host: str = "known_hosts") -> list[KnownKey]:
    """Every key recorded for ``label`` in ``path`` (a missing file knows no keys)."""
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:  # a directory, no permission: not transient, so never retried as a connect error
        raise HostKeyRejected(host, f"cannot read known_hosts {path}: {exc.strerror or exc}") from exc
    found = []
    for number, raw in enumerate(text.splitlines(), start=1):
        fields = raw.split()
        if len(fields) < 3 or fields[0].startswith("#"):
            continue
        if fields[0].startswith("@"):
            # @revoked / @cert-authority: crosshost does not interpret markers; a marked line must
            # not count as a trusted key, but it still proves the host is known (-> refused as changed)
            if len(fields) >= 4 and _name_matches(fields[1], label):
                found.append(KnownKey(number, f"{fields[0]} {fields[2]}", fields[3]))
            continue
        if _name_matches(fields[0], label):
            found.append(KnownKey(number, fields[1], fields[2]))
    return found


def append(path: Path, label: str, key_type: str, key_b64: str) -> None:
    """Record a key: one new line, file created 0600 with its directory if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as f:
        if f.tell() > 0 and not path.read_bytes().endswith(b"\n"):
            f.write("\n")
        f.write(f"{label} {key_type} {key_b64}\n")


def verify(
    path: Path, host: str, label: str, key_type: str, key_b64: str, *, accept_new: bool = False,
    shown: str | None = None,
) -> None:
    """Accept the key the server offered, or raise ``HostKeyRejected`` saying what to do.

    Known and equal: fine. Unknown: refused, unless ``accept_new`` (then recorded). Known with a
    different key (of any type): refused always — that is what a man in the middle looks like.
    ``shown`` is how the message names the server when ``label`` alone would mislead (a jump host:
    "jump host bastion ([127.0.0.1]:2601)").
    """
    said = shown or label
    known = lookup(path, label, host=host)
    offered = fingerprint(key_b64)
    if any(k.key_type == key_type and k.key_b64 == key_b64 for k in known):
        return
    if known:
        lines = ", ".join(str(k.line) for k in known)
        raise HostKeyRejected(
            host,
            f"host key for {said} has CHANGED: the server offers {key_type} {offered}, "
            f"{path} line {lines} holds {known[0].fingerprint}; refused "
            f"(--accept-new never accepts a changed key: check with the host's owner, "
            f"then remove line {lines} of {path} by hand)",
        )
    if not accept_new:
        raise HostKeyUnknown(host, f"unknown host key for {said} ({key_type} {offered}, not in {path})")
    append(path, label, key_type, key_b64)
