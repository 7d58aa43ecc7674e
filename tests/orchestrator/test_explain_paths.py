"""explain's file evidence as a user reads it: a device where a program should be is unusable, two
spellings of one file through a directory link (usr-merge /bin -> /usr/bin) are said once."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from orchestrator.analysis.attribution import path_line
from orchestrator.analysis.models import PathEvidence
from orchestrator.commands.explain import file_evidence, path_states
from orchestrator.hosts.inventory import HostConfig
from orchestrator.hosts.transport import open_host
from orchestrator.hosts.transport.base import ExecResult, Host
from orchestrator.store.rundir import RunDir


def test_a_character_device_is_unusable_and_said_so(tmp_path: Path) -> None:
    cfg = HostConfig(name="local", transport="local")
    os.mkfifo(tmp_path / "fifo")
    states = path_states(cfg, ["/dev/null", str(tmp_path / "fifo")], open_host, False)
    assert states == {"/dev/null": "character device", str(tmp_path / "fifo"): "fifo"}
    jq = PathEvidence(path="/usr/bin/jq", calls=["execve"], touched_on=["local", "box-c"],
                      state={"local": "file 9 bytes sha256 0123456789abcdef", "box-c": "character device"})  # fmt: skip
    assert path_line(jq) == (
        "run_tests.sh executed /usr/bin/jq: unusable on box-c (character device), "
        "present on local (file 9 bytes sha256 0123456789abcdef)"
    )


class _Elsewhere(Host):
    """Another host as its stat script answers: the same usr-merge link, no such file in it (a fake:
    the real script's answer on this machine is checked below)."""

    kind = "fake"

    def __init__(self, answer: dict[str, Any]) -> None:
        self.name, self.answer = "box-c", answer

    def exec(self, argv: list[str], timeout: float) -> ExecResult:
        return ExecResult(tuple(argv), 0, json.dumps(self.answer), "", 0.0)

    def put(self, local: Path, remote: str) -> None:
        raise NotImplementedError

    def get(self, remote: str, local: Path, **_: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def test_two_spellings_of_one_file_through_a_directory_link_are_said_once(tmp_path: Path) -> None:
    usr_bin = tmp_path / "usr" / "bin"
    usr_bin.mkdir(parents=True)
    (usr_bin / "jq").write_text("#!/bin/sh\n")
    (usr_bin / "jq").chmod(0o755)
    (tmp_path / "bin").symlink_to("usr/bin")
    merged, linked = str(usr_bin / "jq"), str(tmp_path / "bin" / "jq")
    run = tmp_path / "explain-run"
    for host in ("local", "box-c"):
        files = RunDir(run).host_dir(host) / "files"
        files.mkdir(parents=True)
        (files / "t.0.json").write_text(json.dumps(
            {"traced": True, "paths": {linked: ["execve"], merged: ["execve"]}, "agent_paths": {}}))
    elsewhere = {"states": {linked: "absent", merged: "absent"}, "canonical": {linked: merged, merged: merged}}

    def opener(cfg: HostConfig, accept_new: bool = False) -> Host:
        return open_host(cfg) if cfg.name == "local" else _Elsewhere(elsewhere)

    configs = {h: HostConfig(name=h, transport="local") for h in ("local", "box-c")}
    found, notes, _ = file_evidence(run, ["local", "box-c"], ["t"], configs, opener, False)
    assert notes == {"t": []}
    (only,) = found["t"]
    assert only.path == merged and only.aliases == [linked]
    assert path_line(only).startswith(f"run_tests.sh executed {merged} (also {linked}): present on local (file ")
    assert path_line(only).endswith(", absent on box-c")


def test_replay_explain_says_each_cause_once(tmp_path: Path) -> None:
    """`replay --explain` (what `make demo` runs): the cause of a flip is said by explain, with its
    evidence, and not a second time by the replay's table nor by a path line that repeats it."""
    import sys

    from typer.testing import CliRunner

    from orchestrator.cli import app
    from tests.support.runner import TRIAGE, own_machine_python

    inventory = tmp_path / "hosts.toml"
    inventory.write_text(
        f'[defaults]\nenv_allowlist = ["PATH", "LANG"]\npython = "{sys.executable}"\n' + "".join(
            f'[[hosts]]\nname = "{n}"\ntransport = "local"\nworkspace_root = "{tmp_path}/roots/{n}"\n'
            f'python = "{own_machine_python(tmp_path, n)}"\nenv = {{ LANG = "{lang}" }}\n'
            for n, lang in (("a", "C.UTF-8"), ("b", "C"))
        )
    )
    res = CliRunner().invoke(app, ["replay", str(TRIAGE), "-i", str(inventory), "--tasks", "locale-probe",
                                   "--out", str(tmp_path / "runs"), "--explain"], env={"COLUMNS": "200"})
    assert res.exit_code == 1, res.output
    lines = res.stdout.splitlines()
    assert not [ln for ln in lines if ln.startswith("cause locale-probe")], res.stdout
    (cause,) = [ln for ln in lines if ln.startswith("locale-probe: ")]
    assert "with b's LANG (C), a fails too" in cause
    said = [ln.strip() for ln in lines if ln.startswith("  ")]
    assert not [ln for ln in said if ln in cause], said
