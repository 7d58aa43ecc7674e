"""`crosshost diff`: a call whose shape changed shows, beside the shape, the (redacted) value of each
key it gained or whose type changed: what tells a user why the shape moved."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from orchestrator.cli import app
from tests.support.rundirs import Attempt, RunSpec, build_run, two_hosts

runner = CliRunner()


def _run(tmp_path: Path, ref_args: dict[str, object], other_args: dict[str, object]) -> Path:
    attempts = {
        ("local", "t", 0): Attempt("pass", calls=[("read_unit_status", {"unit": "a"}), ("lookup", ref_args)]),
        ("box-b", "t", 0): Attempt("pass", calls=[("read_unit_status", {"unit": "a"}), ("lookup", other_args)]),
    }
    return build_run(tmp_path, RunSpec(hosts=two_hosts(), attempts=attempts))


def test_an_added_key_shows_its_value_beside_the_shape(tmp_path: Path) -> None:
    run = _run(tmp_path, {"key": "db"}, {"key": "db", "scope": "global"})
    out = runner.invoke(app, ["diff", str(run)])
    assert out.exit_code == 1, out.output
    lines = out.output.splitlines()
    assert "-lookup(key: str)" in lines and "+lookup(key: str, scope: str)" in lines
    assert '  step 2 lookup: shape differs; scope: (not passed) -> "global"' in lines


def test_a_key_whose_type_changed_shows_both_values_and_a_secret_stays_redacted(tmp_path: Path) -> None:
    run = _run(tmp_path, {"key": "db", "ttl": "30", "password": "hunter2-secret"},
               {"key": "db", "ttl": 30, "password": 12345678})  # fmt: skip
    out = runner.invoke(app, ["diff", str(run)])
    assert out.exit_code == 1, out.output
    line = next(ln for ln in out.output.splitlines() if "shape differs" in ln)
    assert 'ttl: "30" -> 30' in line
    assert "password: [REDACTED] (str) -> [REDACTED] (int)" in line
    assert "hunter2" not in out.output and "12345678" not in out.output
    assert "key:" not in line  # the same value on both: not news
