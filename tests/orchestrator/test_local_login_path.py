"""A `local` host's attempts start from a fixed login-like PATH, recorded in its fingerprint, never the
controller shell's: an activated venv or pyenv shims ahead of /usr/bin do not change the reference."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.hosts.transport.local import LocalHost, login_path


def _shadowing_python3(tmp_path: Path) -> Path:
    """A venv-like directory whose python3 is not the login's (it says so and runs the real one)."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    shim = venv / "python3"
    shim.write_text('#!/bin/sh\necho "venv python3 ran" >&2\nexec /usr/bin/python3 "$@"\n')
    shim.chmod(0o755)
    return venv


def test_a_local_hosts_commands_see_the_login_path_not_the_controllers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = _shadowing_python3(tmp_path)
    monkeypatch.setenv("PATH", f"{venv}:{os.environ['PATH']}")
    got = LocalHost().exec(["sh", "-c", 'echo "$PATH"; command -v python3'], 30)
    assert got.exit_code == 0, got.stderr
    path, python3 = got.stdout.splitlines()
    assert path == login_path() and str(venv) not in path
    assert not python3.startswith(str(venv))
    assert login_path() == ("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" if os.geteuid() == 0
                            else "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games")


def test_a_replays_local_fingerprint_records_the_login_path_whatever_the_controllers_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli import app
    from tests.support.runner import TRIAGE, own_machine_python

    inventory = tmp_path / "hosts.toml"
    inventory.write_text("".join(
        f'[[hosts]]\nname = "{n}"\ntransport = "local"\nworkspace_root = "{tmp_path}/roots/{n}"\n'
        f'python = "{own_machine_python(tmp_path, n)}"\n' for n in ("a", "b")
    ))

    def fingerprints(out: str) -> list[dict[str, object]]:
        res = CliRunner().invoke(app, ["replay", str(TRIAGE), "-i", str(inventory), "--tasks", "healthy-no-writes",
                                       "--out", str(tmp_path / out)])
        assert res.exit_code == 1, res.output  # one machine's fingerprint twice: same_host, invalid
        (run,) = (tmp_path / out).glob("2*")
        return [json.loads((run / "hosts" / h / "fingerprint.json").read_text()) for h in ("a", "b")]

    plain = fingerprints("plain")
    monkeypatch.setenv("PATH", f"{_shadowing_python3(tmp_path)}:{os.environ['PATH']}")
    shadowed = fingerprints("shadowed")
    assert [f["path"] for f in plain + shadowed] == [login_path()] * 4
    assert [f["fingerprint"] for f in plain] == [f["fingerprint"] for f in shadowed]
