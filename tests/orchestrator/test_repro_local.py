"""repro end to end on two LocalHost "hosts" that differ only in their pinned TZ.

The real runner runs the scripted suite repro builds; `date +%Z` is the step where they part.
(The sshd version, with hosts that differ in a file, is tests/integration/test_repro_sshd.py.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent_runner.trace import TraceWriter
from orchestrator.cli import app
from orchestrator.store import history


def inventory(tmp_path: Path, tz_bad: str) -> Path:
    path = tmp_path / f"hosts-{tz_bad.replace('/', '-')}.toml"
    path.write_text(
        f"""[defaults]
env_allowlist = ["PATH", "TZ", "LANG"]
timeout_s = 30
python = {json.dumps(sys.executable)}

[[hosts]]
name = "good"
transport = "local"
workspace_root = "{tmp_path}/roots/good"
env = {{ TZ = "UTC" }}

[[hosts]]
name = "bad"
transport = "local"
workspace_root = "{tmp_path}/roots/bad"
env = {{ TZ = {json.dumps(tz_bad)} }}
"""
    )
    return path


@pytest.fixture()
def incident(tmp_path: Path) -> Path:
    """As the runner recorded it on the bad host (shell observations are "exit N\\n<output>")."""
    path = tmp_path / "incident" / "tz-check.0.jsonl"
    path.parent.mkdir()
    with TraceWriter(path, path.with_suffix(".obs.jsonl")) as w:
        w.header(run_id="prod", host="bad", task="tz-check", attempt=0, fingerprint="f" * 16, pins={})
        w.turn(tool="shell", args={"argv": ["echo", "start"]}, observation="exit 0\nstart\n", error=None)
        w.turn(tool="lookup_ticket", args={"id": "T-1"}, observation="ticket T-1: open", error=None)
        w.turn(tool="shell", args={"argv": ["date", "+%Z"]}, observation="exit 0\nJST\n", error=None)
        w.turn(tool="shell", args={"argv": ["echo", "end"]}, observation="exit 0\nend\n", error=None)
        w.finish(reason="stop", final="ok", predicate_exit=None, verdict="pass", why="", wall_ms=3)
    return path


def repro_cli(*args: str, consent: tuple[str, ...] = ("--run-commands", "--on-local")) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["repro", *consent, *args])
    return res.exit_code, res.output


def test_repro_parts_at_the_tz_step(incident: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    code, output = repro_cli(str(incident), "--host", "bad", "-i", str(inventory(tmp_path, "Asia/Tokyo")),
                             "--out", str(out), "--json")  # fmt: skip
    assert code == 1, output
    record = json.loads(output)
    div = record["comparison"]["divergence"]
    assert (div["step"], div["what"], div["host"]["tool"]) == (3, "observation", "shell")
    assert div["host"]["observation"] == "exit 0\nJST\n" and div["against"]["observation"] == "exit 0\nUTC\n"
    assert record["recorded_match"] == ["bad"]
    assert record["comparison"]["fingerprint_diff"]["tz.TZ"] == ["Asia/Tokyo", "UTC"]
    assert record["fixture_tools"] == ["lookup_ticket"]  # answered from the recording, on both hosts

    run_dir = out / record["run_id"]
    assert json.loads((run_dir / "manifest.json").read_text())["kind"] == "repro"
    for host in ("good", "bad"):
        assert (run_dir / "hosts" / host / "traces" / "tz-check.0.jsonl").is_file()
    (row,) = history.history(out)
    assert (row.run_id, row.kind) == (record["run_id"], "repro")


def test_repro_same_behaviour_exits_0(incident: Path, tmp_path: Path) -> None:
    code, output = repro_cli(str(incident), "--host", "bad", "--against", "good",
                             "-i", str(inventory(tmp_path, "UTC")), "--out", str(tmp_path / "runs"))  # fmt: skip
    assert code == 0, output
    assert "bad and good behaved the same over 4 steps" in output


def test_repro_input_errors(incident: Path, tmp_path: Path) -> None:
    inv = inventory(tmp_path, "UTC")
    code, output = repro_cli(str(incident), "--host", "good", "-i", str(inv))
    assert code == 2 and "--against" in output  # the reference against itself says nothing
    code, output = repro_cli(str(incident), "--host", "elsewhere", "-i", str(inv))
    assert code == 2 and "elsewhere" in output
    bad = tmp_path / "bad.json"
    bad.write_text('{"tool_calls": "nope"}')
    code, output = repro_cli(str(bad), "--host", "bad", "-i", str(inv))
    assert code == 2 and "bad.json" in output and "Traceback" not in output


def test_repro_on_local_runs_nothing_without_both_opt_ins(tmp_path: Path) -> None:
    """A recorded `shell` call would run on this machine: listed and refused until --run-commands
    and --on-local are both given."""
    marker = tmp_path / "PWNED"
    trace = tmp_path / "incident" / "grab.0.jsonl"
    trace.parent.mkdir()
    with TraceWriter(trace, trace.with_suffix(".obs.jsonl")) as w:
        w.header(run_id="prod", host="bad", task="grab", attempt=0, fingerprint="f" * 16, pins={})
        w.turn(tool="shell", args={"argv": ["touch", str(marker)]}, observation="exit 0\n", error=None)
        w.finish(reason="stop", final="ok", predicate_exit=None, verdict="pass", why="", wall_ms=1)
    args = (str(trace), "--host", "bad", "-i", str(inventory(tmp_path, "UTC")), "--out", str(tmp_path / "runs"))

    code, output = repro_cli(*args, consent=())
    assert code == 2 and f"$ touch {marker}" in output and "--run-commands" in output, output
    code, output = repro_cli(*args, consent=("--run-commands",))
    assert code == 2 and "--on-local" in output and "bad, good" in output, output
    code, output = repro_cli(*args, consent=("--fixtures-from-trace",))  # answered from the recording
    assert code == 0, output
    assert not marker.exists()

    code, output = repro_cli(*args)
    assert code == 0, output
    assert marker.exists()
