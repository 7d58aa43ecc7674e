"""`crosshost history` names the fingerprint fields that changed between two runs of a suite, not only
the two digests: a finding that appeared, a locale that moved, an environment key that went."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.store import history
from tests.orchestrator.test_history import make_run_dir
from tests.support.rundirs import fingerprint


def _with_fingerprint(run_dir: Path, host: str, fp: dict[str, Any]) -> None:
    (run_dir / "hosts" / host).mkdir(parents=True, exist_ok=True)
    (run_dir / "hosts" / host / "fingerprint.json").write_text(json.dumps(fp))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["hosts"][host]["fingerprint"] = fp["fingerprint"]
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    report = json.loads((run_dir / "report.json").read_text())
    for h in report["hosts"]:
        if h["name"] == host:
            h["fingerprint"] = fp["fingerprint"]
    (run_dir / "report.json").write_text(json.dumps(report))


def test_history_names_the_fingerprint_fields_that_changed(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first = make_run_dir(runs, "r1", started="2024-05-01T10:00:00Z")
    second = make_run_dir(runs, "r2", started="2024-05-01T16:00:00Z")
    before = fingerprint("local", "4730" + "0" * 12).to_json()
    before["locale"] = {"LANG": "C.UTF-8", "LC_ALL": None, "resolved": "C.UTF-8"}
    before["findings"] = [{"kind": "config_dir", "detail": "/root/.config", "action": "keep", "meaning": "m"}]
    before["env_keys"] = ["HOME", "LANG", "PATH", "VIRTUAL_ENV"]
    after = json.loads(json.dumps(before))
    after["fingerprint"] = "9942" + "0" * 12
    after["locale"] = {"LANG": "C", "LC_ALL": None, "resolved": "C"}
    after["findings"].append(
        {"kind": "docker_socket", "detail": "/var/run/docker.sock", "action": "burn", "meaning": "m"}
    )
    after["env_keys"] = ["HOME", "LANG", "PATH"]
    _with_fingerprint(first, "local", before)
    _with_fingerprint(second, "local", after)
    for d in (first, second):
        history.record_run(runs, d)

    res = CliRunner().invoke(app, ["history", "--out", str(runs)], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    after_lines = res.output.split("r2 vs r1 (triage):\n")[1].splitlines()
    assert max(len(line) for line in after_lines) <= 80
    assert after_lines[0] == f"  fingerprint of local changed: 4730{'0' * 12} -> 9942{'0' * 12}:"
    assert after_lines[1:] == [
        "    + /var/run/docker.sock (burn)",
        "    - env VIRTUAL_ENV",
        "    locale.LANG C.UTF-8 → C",
        "    locale.resolved C.UTF-8 → C",
    ]
    res = CliRunner().invoke(app, ["history", "--out", str(runs), "--json"])
    fields = json.loads(res.output)[1]["changes"]["fingerprints_changed"][0]["fields"]
    assert {"field": "locale.LANG", "old": "C.UTF-8", "new": "C"} in fields


def test_a_run_whose_fingerprint_file_is_gone_still_says_the_digests_changed(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first = make_run_dir(runs, "r1", started="2024-05-01T10:00:00Z")
    second = make_run_dir(runs, "r2", started="2024-05-01T16:00:00Z")
    _with_fingerprint(first, "local", fingerprint("local", "1" * 16).to_json())
    _with_fingerprint(second, "local", fingerprint("local", "2" * 16, tz={"TZ": None}).to_json())
    (first / "hosts" / "local" / "fingerprint.json").unlink()
    for d in (first, second):
        history.record_run(runs, d)
    res = CliRunner().invoke(app, ["history", "--out", str(runs)], env={"COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    # the digests still say it changed; no field is guessed
    assert f"  fingerprint of local changed: {'1' * 16} -> {'2' * 16}\n" in res.output


def test_a_run_whose_host_failed_says_why_in_history(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = make_run_dir(runs, "r1", started="2024-05-01T10:00:00Z")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["hosts"]["box-b"].update(reachable=False, error="box-b: HostUnreachable: connect to [127.0.0.1]:2223: refused")
    (run / "manifest.json").write_text(json.dumps(manifest))
    history.record_run(runs, run)
    res = CliRunner().invoke(app, ["history", "--out", str(runs)], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[lines.index("hosts that failed in a run:") + 1:] == [
        "  r1 box-b: box-b: HostUnreachable: connect to [127.0.0.1]:2223: refused"
    ]
