"""open_host's connect retries against a port nobody listens on: the waits a user sees in the manifest."""

from __future__ import annotations

import socket
import subprocess
import warnings
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import HostUnreachable
from orchestrator.hosts.inventory import load_inventory
from orchestrator.hosts.transport import open_host


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_refused_connects_wait_on_a_jittered_exponential_floor_without_warnings(tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "id_ed25519")], check=True)
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(
        "[defaults]\nconnect_timeout_s = 2\n[[hosts]]\nname = \"box-z\"\ntransport = \"ssh\"\n"
        f"address = \"127.0.0.1\"\nport = {_closed_port()}\nuser = \"root\"\nidentity_file = \"id_ed25519\"\n"
    )
    retries: list[dict[str, Any]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. a DeprecationWarning from the retry library
        with pytest.raises(HostUnreachable, match="gave up after"):
            open_host(load_inventory(inventory).get("box-z"), on_retry=retries.append)
    assert len(retries) >= 2
    cap = 1.0  # max(1, connect_timeout_s / 2)
    for r in retries:
        floor = 0.5 * 2 ** (r["attempt"] - 1)  # 0.5 s, 1 s, ... plus up to 0.25 s of jitter, capped
        assert min(floor, cap) <= r["wait_s"] <= min(floor + 0.25, cap), retries
