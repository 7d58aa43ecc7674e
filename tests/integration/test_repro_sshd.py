"""`crosshost repro` on two real sshd hosts (own hostname, /root, /tmp and /opt each).

box-b has a file box-a lacks (/opt/x): the recorded incident trace reads it, so the replay on box-b
parts from box-a at exactly that step, and the fingerprints differ in the hostname. With the same file
on both, the hosts agree and repro exits 0.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent_runner.trace import TraceWriter
from orchestrator.cli import app
from orchestrator.store import history

pytestmark = pytest.mark.sshd

# as the runner records them: a shell observation is "exit N\n<output>"
INCIDENT = [
    ("shell", {"argv": ["echo", "checking"]}, "exit 0\nchecking\n"),
    ("read_unit_status", {"unit": "nginx.service"}, "ActiveState=active"),
    ("shell", {"argv": ["cat", "/opt/x"]}, "exit 0\nmarker-from-prod\n"),
    ("shell", {"argv": ["echo", "done"]}, "exit 0\ndone\n"),
]


@pytest.fixture()
def incident(tmp_path: Path) -> Path:
    """A trace as a production run on box-b recorded it (with its observation sidecar)."""
    path = tmp_path / "incident" / "probe-opt.0.jsonl"
    path.parent.mkdir()
    with TraceWriter(path, path.with_suffix(".obs.jsonl")) as w:
        w.header(run_id="prod", host="box-b", task="probe-opt", attempt=0, fingerprint="f" * 16, pins={})
        for tool, args, obs in INCIDENT:
            w.turn(tool=tool, args=args, observation=obs, error=None)
        w.finish(reason="stop", final="ok", predicate_exit=None, verdict="pass", why="", wall_ms=10)
    return path


@pytest.fixture()
def opt_files(sshd_hosts: object) -> Iterator[dict[str, Path]]:
    """Each host's /opt/x as seen from the controller (its bind source); removed afterwards."""
    files = {n: sshd_hosts.fleet.hosts[n].dir / "opt" / "x" for n in ("box-a", "box-b")}  # type: ignore[attr-defined]
    try:
        yield files
    finally:
        for f in files.values():
            f.unlink(missing_ok=True)


def run_repro(
    inventory: Path, trace: Path, out: Path, *extra: str, against: str = "box-a"
) -> tuple[int, str, dict]:
    argv = [
        "repro",
        "--run-commands",
        str(trace),
        "--host",
        "box-b",
        "--against",
        against,
        "-i",
        str(inventory),
        "--out",
        str(out),
    ]
    res = CliRunner().invoke(app, [*argv, *extra])
    # newest last by write time: two repros within one second have run ids that sort by their random suffix
    run_dirs = sorted(
        (p for p in out.iterdir() if (p / "repro.json").is_file()),
        key=lambda p: (p / "repro.json").stat().st_mtime_ns,
    )
    record = json.loads((run_dirs[-1] / "repro.json").read_text()) if run_dirs else {}
    return res.exit_code, res.output, record


def test_repro_names_first_diverging_step(
    sshd_hosts: object, opt_files: dict[str, Path], incident: Path, tmp_path: Path
) -> None:
    inventory = sshd_hosts.inventory_path  # type: ignore[attr-defined]
    opt_files["box-b"].write_text("marker-from-prod\n")  # only box-b has it, as in production
    out = tmp_path / "runs"

    code, output, record = run_repro(inventory, incident, out)
    assert code == 1, output
    div = record["comparison"]["divergence"]
    assert div["step"] == 3 and div["what"] == "observation"
    assert div["host"]["tool"] == "shell" and div["host"]["args"] == {"argv": ["cat", "/opt/x"]}
    assert "marker-from-prod" in div["host"]["observation"]
    assert "marker-from-prod" not in div["against"]["observation"]
    assert record["recorded_match"] == ["box-b"]  # the recording agrees with the incident host
    fp_diff = record["comparison"]["fingerprint_diff"]
    assert fp_diff["hostname"] == ["box-b", "box-a"]
    # what a person reads: the step, the call, both observations, the differing fingerprint fields
    assert "box-b parts from box-a at step 3" in output and "cat" in output and "hostname" in output

    run_dir = out / record["run_id"]
    for host in ("box-a", "box-b"):
        assert (run_dir / "hosts" / host / "traces" / "probe-opt.0.jsonl").is_file()
        assert (run_dir / "hosts" / host / "fingerprint.json").is_file()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["kind"] == "repro" and (run_dir / "repro-suite" / "suite.toml").is_file()
    (row,) = history.history(out, kind="repro")
    assert row.run_id == record["run_id"] and row.kind == "repro"

    # the same file on both hosts: they agree, exit 0
    opt_files["box-a"].write_text("marker-from-prod\n")
    code, output, record = run_repro(inventory, incident, out)
    assert code == 0, output
    assert record["parted"] is False and record["comparison"]["divergence"] is None
    assert "behaved the same over 4 steps" in output
    conn = sqlite3.connect(history.index_path(out))
    try:
        assert conn.execute("SELECT count(*) FROM runs WHERE kind = 'repro'").fetchone() == (2,)
    finally:
        conn.close()


def test_repro_fixtures_from_trace_hides_the_host(
    sshd_hosts: object, opt_files: dict[str, Path], incident: Path, tmp_path: Path
) -> None:
    """With every tool answered from the recording, the file on box-b no longer matters."""
    opt_files["box-b"].write_text("marker-from-prod\n")
    code, output, record = run_repro(
        sshd_hosts.inventory_path,
        incident,
        tmp_path / "runs",
        "--fixtures-from-trace",  # type: ignore[attr-defined]
    )
    # shell outputs are keyed on nothing (argv is a list): every shell call gets the first recording,
    # the same on both hosts, so they agree
    assert code == 0, output


def test_repro_bad_input_and_unreachable(sshd_hosts: object, incident: Path, tmp_path: Path) -> None:
    inventory = sshd_hosts.inventory_path  # type: ignore[attr-defined]
    cli = CliRunner()
    res = cli.invoke(
        app, ["repro", str(incident), "--host", "nope", "-i", str(inventory), "--out", str(tmp_path)]
    )
    assert res.exit_code == 2 and "nope" in res.output
    res = cli.invoke(app, ["repro", str(tmp_path / "absent.jsonl"), "--host", "box-b", "-i", str(inventory)])
    assert res.exit_code == 2 and "absent.jsonl: no such trace file" in res.output
    # a host that does not answer: exit 3, and the run is still written
    dead = tmp_path / "dead.toml"
    dead.write_text(
        inventory.read_text()
        + '\n[[hosts]]\nname = "box-dead"\ntransport = "ssh"\naddress = "127.0.0.1"\nport = 1\nuser = "root"\n'
        + f"identity_file = {json.dumps(str(sshd_hosts.fleet.identity))}\n"  # type: ignore[attr-defined]
    )
    code, output, record = run_repro(dead, incident, tmp_path / "runs-dead", against="box-dead")
    assert code == 3, output
    assert "box-dead" in record["errors"]


def test_repro_runs_no_recorded_command_without_consent(sshd_hosts: object, tmp_path: Path) -> None:
    """A trace is what a host wrote: its shell calls are listed, and run only after --run-commands."""
    pwned = {n: sshd_hosts.fleet.hosts[n].dir / "tmp" / "pwned" for n in ("box-a", "box-b")}  # type: ignore[attr-defined]
    trace = tmp_path / "hostile" / "grab.0.jsonl"
    trace.parent.mkdir()
    with TraceWriter(trace, trace.with_suffix(".obs.jsonl")) as w:
        w.header(run_id="prod", host="box-b", task="grab", attempt=0, fingerprint="f" * 16, pins={})
        w.turn(tool="shell", args={"argv": ["sh", "-c", "id > /tmp/pwned"]}, observation="exit 0\n", error=None)
        w.finish(reason="stop", final="ok", predicate_exit=None, verdict="pass", why="", wall_ms=1)
    inventory = sshd_hosts.inventory_path  # type: ignore[attr-defined]
    out = tmp_path / "runs"
    argv = ["repro", str(trace), "--host", "box-b", "--against", "box-a", "-i", str(inventory), "--out", str(out)]
    try:
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 2, res.output
        assert "$ sh -c 'id > /tmp/pwned'" in res.output and "--run-commands" in res.output
        assert not any(p.exists() for p in pwned.values())
        assert not out.exists() or not any((p / "manifest.json").exists() for p in out.iterdir())

        res = CliRunner().invoke(app, [*argv, "--run-commands"])
        assert res.exit_code in (0, 1), res.output
        assert all(p.exists() for p in pwned.values())  # opted in: it ran on both hosts
    finally:
        for p in pwned.values():
            p.unlink(missing_ok=True)
