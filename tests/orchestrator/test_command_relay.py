"""The command transport's relay end to end on this machine: an ``env`` prefix makes the host this
machine's own shell, so both ends of the relay (``RELAY_PY`` on the host, the controller's side here)
carry real connections: bytes each way, EOF each way, several connections in turn."""

from __future__ import annotations

import socket
import threading

from orchestrator.hosts.transport.command import CommandHost


def _upper_echo_server() -> socket.socket:
    """Answers each connection with what it sent, upper-cased, once the client sent EOF."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                got = b""
                while chunk := conn.recv(65536):
                    got += chunk
                conn.sendall(got.upper())

    threading.Thread(target=serve, daemon=True).start()
    return server


def _ask(port: int, text: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as conn:
        conn.sendall(text)
        conn.shutdown(socket.SHUT_WR)  # an E frame to the controller's side
        answer = b""
        while chunk := conn.recv(65536):  # the server's EOF comes back as an E frame
            answer += chunk
    return answer


def test_the_relay_carries_bytes_and_eof_both_ways_for_each_connection() -> None:
    server = _upper_echo_server()
    host = CommandHost("box-x", ["env"])
    try:
        port = host.forward_remote(server.getsockname()[1])
        assert [_ask(port, b"ping %d" % i) for i in range(3)] == [b"PING %d" % i for i in range(3)]
        big = bytes(range(256)) * 1024  # more than one frame each way
        assert _ask(port, big) == big.upper()
        host.cancel_forward(port)
    finally:
        host.close()
        server.close()
