"""The tool-owned known_hosts: lookup (plain and hashed names), verify, append — without sshd."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stat
from pathlib import Path

import pytest

from orchestrator.errors import HostKeyRejected
from orchestrator.hosts import known_hosts

KEY_A = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519" + os.urandom(36)).decode()
KEY_B = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519" + os.urandom(36)).decode()
LABEL = "[127.0.0.1]:2222"


def test_label_follows_openssh() -> None:
    assert known_hosts.host_label("127.0.0.1", 2222) == "[127.0.0.1]:2222"
    assert known_hosts.host_label("box.example", 22) == "box.example"


def test_fingerprint_matches_ssh_keygen_format() -> None:
    fp = known_hosts.fingerprint(KEY_A)
    digest = hashlib.sha256(base64.b64decode(KEY_A)).digest()
    assert fp == "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def test_lookup_plain_comma_separated_and_hashed_names(tmp_path: Path) -> None:
    salt = os.urandom(20)
    hashed = hmac.new(salt, LABEL.encode(), hashlib.sha1).digest()
    name = f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(hashed).decode()}"
    path = tmp_path / "known_hosts"
    path.write_text(
        "# a comment\n"
        f"[127.0.0.1]:2223 ssh-ed25519 {KEY_B}\n"
        f"other,{LABEL} ssh-ed25519 {KEY_A}\n"
        f"{name} ssh-ed25519 {KEY_B}\n"
    )
    found = known_hosts.lookup(path, LABEL)
    assert [(k.line, k.key_b64) for k in found] == [(3, KEY_A), (4, KEY_B)]
    assert known_hosts.lookup(path, "[127.0.0.1]:9999") == []
    assert known_hosts.lookup(tmp_path / "missing", LABEL) == []


def test_verify_known_key_passes_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(f"{LABEL} ssh-ed25519 {KEY_A}\n")
    known_hosts.verify(path, "box-b", LABEL, "ssh-ed25519", KEY_A)
    known_hosts.verify(path, "box-b", LABEL, "ssh-ed25519", KEY_A, accept_new=True)
    assert path.read_text() == f"{LABEL} ssh-ed25519 {KEY_A}\n"


def test_unknown_key_is_refused_naming_host_label_and_file(tmp_path: Path) -> None:
    from orchestrator.errors import HostKeyUnknown

    path = tmp_path / "known_hosts"
    with pytest.raises(HostKeyUnknown) as info:  # the command that met it adds the complete hint
        known_hosts.verify(path, "box-b", LABEL, "ssh-ed25519", KEY_A)
    assert info.value.one_line().startswith(f"box-b: HostKeyUnknown: unknown host key for {LABEL} ")
    assert info.value.one_line().endswith(f", not in {path})")
    assert not path.exists()


def test_accept_new_appends_one_line_creating_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "state" / "known_hosts"
    known_hosts.verify(path, "box-b", LABEL, "ssh-ed25519", KEY_A, accept_new=True)
    assert path.read_text() == f"{LABEL} ssh-ed25519 {KEY_A}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_append_keeps_lines_apart_when_the_file_lacks_a_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(f"[127.0.0.1]:2223 ssh-ed25519 {KEY_B}")
    known_hosts.append(path, LABEL, "ssh-ed25519", KEY_A)
    assert path.read_text().splitlines() == [
        f"[127.0.0.1]:2223 ssh-ed25519 {KEY_B}",
        f"{LABEL} ssh-ed25519 {KEY_A}",
    ]


@pytest.mark.parametrize("accept_new", [False, True])
def test_changed_key_is_refused_and_never_rewritten(tmp_path: Path, accept_new: bool) -> None:
    path = tmp_path / "known_hosts"
    original = f"[127.0.0.1]:2223 ssh-ed25519 {KEY_B}\n{LABEL} ssh-ed25519 {KEY_A}\n"
    path.write_text(original)
    with pytest.raises(HostKeyRejected) as info:
        known_hosts.verify(path, "box-b", LABEL, "ssh-ed25519", KEY_B, accept_new=accept_new)
    line = info.value.one_line()
    assert "has CHANGED" in line and known_hosts.fingerprint(KEY_B) in line
    assert known_hosts.fingerprint(KEY_A) in line
    assert f"remove line 2 of {path} by hand" in line
    assert path.read_text() == original


def test_a_known_host_offering_another_key_type_counts_as_changed(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(f"{LABEL} ssh-ed25519 {KEY_A}\n")
    with pytest.raises(HostKeyRejected, match="CHANGED"):
        known_hosts.verify(path, "box-b", LABEL, "ecdsa-sha2-nistp256", KEY_B, accept_new=True)


OFFERED = base64.b64encode(b"k" * 51).decode()


@pytest.mark.parametrize("stored", ["!!notbase64", "AAAAA"])
def test_an_unreadable_known_key_is_still_a_changed_key_refused(tmp_path: Path, stored: str) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(f"[127.0.0.1]:2222 ssh-ed25519 {stored}\n")
    with pytest.raises(HostKeyRejected, match="CHANGED"):
        known_hosts.verify(path, "box-b", "[127.0.0.1]:2222", "ssh-ed25519", OFFERED, accept_new=True)
    assert path.read_text() == f"[127.0.0.1]:2222 ssh-ed25519 {stored}\n"  # never rewritten


def test_an_unreadable_known_hosts_is_a_host_key_error_not_a_retried_connect_error(tmp_path: Path) -> None:
    from orchestrator.errors import HostUnreachable

    directory = tmp_path / "known_hosts"
    directory.mkdir()
    with pytest.raises(HostKeyRejected, match="cannot read known_hosts") as caught:
        known_hosts.verify(directory, "box-b", "[127.0.0.1]:2222", "ssh-ed25519", OFFERED)
    assert caught.value.host == "box-b"
    assert not isinstance(caught.value, HostUnreachable)
