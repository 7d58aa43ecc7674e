"""A connection's socket acknowledges what it read at once: sshd writes without TCP_NODELAY until a
session starts, so its answer to the first channel open waited for the controller's delayed ACK of
the packet before it (up to 40 ms of every host's first exec). And it takes an AEAD cipher where the
server has one: paramiko then compares no MAC in Python, once per packet."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator

import paramiko
import pytest

from orchestrator.hosts.transport.session import acking


def _quick_after_each_read(wrap: Callable[[socket.socket], socket.socket]) -> list[int]:
    """A request/answer exchange over loopback TCP, the reader answering at once each time (which
    puts a plain socket in delayed-ACK mode); after each read, whether the reader acks at once."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        plain = socket.create_connection(server.getsockname()[:2], timeout=5)
        peer, _ = server.accept()
        reader = wrap(plain)
        quick = []
        with peer, reader:
            for _ in range(6):
                peer.sendall(b"answer")
                assert reader.recv(64) == b"answer"
                quick.append(reader.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK))
                reader.sendall(b"next")
                assert peer.recv(64) == b"next"
        return quick


def test_every_read_leaves_the_connection_acknowledging_at_once() -> None:
    assert _quick_after_each_read(acking) == [1] * 6
    # what the kernel does otherwise: once the reader answered soon after a read, its ACKs wait
    assert 0 in _quick_after_each_read(lambda s: s)


def test_the_acking_socket_is_the_same_connection_with_its_timeout() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        plain = socket.create_connection(server.getsockname()[:2], timeout=7)
        peer, _ = server.accept()
        with peer, acking(plain) as sock:
            assert plain.fileno() == -1 and sock.gettimeout() == 7
            assert acking(sock) is sock
            sock.sendall(b"ping")
            assert peer.recv(8) == b"ping"


@contextlib.contextmanager
def _box_a_transport(sshd_hosts: object) -> Iterator[paramiko.Transport]:
    """box-a's connection (an ``SshHost``'s transport); its exec answers; closed after."""
    from orchestrator.hosts.transport import open_host
    from orchestrator.hosts.transport.ssh import SshHost
    from tests.support.fleet import SshdHosts

    assert isinstance(sshd_hosts, SshdHosts)
    host = open_host(sshd_hosts.config("box-a"))
    try:
        assert isinstance(host, SshHost) and host._transport is not None
        yield host._transport
        assert host.exec(["echo", "ok"], 10).stdout.strip() == "ok"
    finally:
        host.close()


@pytest.mark.sshd
def test_a_host_connection_reads_through_an_acking_socket(sshd_hosts: object) -> None:
    with _box_a_transport(sshd_hosts) as transport:
        assert acking(transport.sock) is transport.sock  # already one: left as it is


@pytest.mark.sshd
def test_a_host_connection_uses_an_aead_cipher_when_the_server_has_one(sshd_hosts: object) -> None:
    """OpenSSH offers AES-GCM: the connection takes it, so no packet's MAC is compared in Python."""
    with _box_a_transport(sshd_hosts) as transport:
        assert transport.local_cipher in ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
        assert transport.remote_cipher == transport.local_cipher


def test_the_aead_ciphers_go_first_and_no_cipher_is_dropped() -> None:
    from orchestrator.hosts.transport.session import _prefer_aead_ciphers

    a, b = socket.socketpair()
    with a, b:
        transport = paramiko.Transport(a)
        before = list(transport.get_security_options().ciphers)
        _prefer_aead_ciphers(transport)
        after = list(transport.get_security_options().ciphers)
        assert after[:2] == ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com"]
        assert sorted(after) == sorted(before)
