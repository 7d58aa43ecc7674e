"""`crosshost replay` lints the suite first (errors: exit 2 before any host; warnings: said, the run
goes on) and says once per run which inventory values it replaced (HOME, TMPDIR, PWD)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from tests.support.runner import own_machine_python

CONTRACT = {"contract_id": "t.v1", "tools": [{"name": "read_file", "required_args": ["path"]}]}


def _suite(root: Path, task_toml: str = "") -> Path:
    task = root / "tasks" / "home"
    (task / "repo").mkdir(parents=True)
    (root / "suite.toml").write_text('name = "envsuite"\n[agent]\nkind = "none"\n')
    (root / "contract.json").write_text(json.dumps(CONTRACT))
    (task / "prompt.md").write_text("nothing to do\n")
    (task / "task.toml").write_text(task_toml)
    # the predicate says where HOME and TMPDIR point and whether they hold anything
    (task / "repo" / "run_tests.sh").write_text('echo "HOME=$HOME TMPDIR=$TMPDIR"; ls -A "$HOME"; ls -A "$TMPDIR"\n')
    return root


def _inventory(path: Path, *, allow_home: bool = False, pin_tmpdir: bool = False) -> Path:
    allow = ["PATH", "LANG"] + (["HOME"] if allow_home else [])
    lines = [f'[defaults]\npython = "{sys.executable}"\nenv_allowlist = {json.dumps(allow)}\n']
    for name, lang in (("a", "C"), ("b", "C.UTF-8")):  # two machines of their own, LANG differs
        env = f'LANG = "{lang}"' + (', TMPDIR = "/var/tmp/mine"' if pin_tmpdir and name == "b" else "")
        head = (f'[[hosts]]\nname = "{name}"\ntransport = "local"\nworkspace_root = "{path.parent}/roots/{name}"\n'
                f'python = "{own_machine_python(path.parent, name)}"\n')
        if pin_tmpdir and name == "b":
            lines.append(f'{head}env_allowlist = {json.dumps([*allow, "TMPDIR"])}\nenv = {{ {env} }}\n')
        else:
            lines.append(f'{head}env = {{ {env} }}\n')
    path.write_text("\n".join(lines))
    return path


def test_a_lint_error_stops_the_replay_before_any_host_with_exit_2(tmp_path: Path) -> None:
    suite = _suite(tmp_path / "s", 'expect_tools = ["read_fiel"]\n')
    runs = tmp_path / "runs"
    res = CliRunner().invoke(app, ["replay", str(suite), "-i", str(_inventory(tmp_path / "hosts.toml")),
                                   "--out", str(runs)])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert res.output == (
        f"SuiteError: {suite}/tasks/home/task.toml: expect_tools: 'read_fiel' is not a tool in contract.json; "
        "did you mean 'read_file'?\n"
    )
    assert not runs.exists() or not any(p.name != "index.sqlite" for p in runs.iterdir())


@pytest.mark.root
def test_lint_warnings_are_said_and_the_run_goes_on(tmp_path: Path) -> None:
    suite = _suite(tmp_path / "s", '[fixtures]\nread_file = "x"\n')
    res = CliRunner().invoke(app, ["replay", str(suite), "-i", str(_inventory(tmp_path / "hosts.toml")),
                                   "--out", str(tmp_path / "runs")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert (
        f"warning: {suite}/tasks/home/task.toml: fixtures.read_file: the agent is kind 'none' and calls no tool: "
        "this fixture for 'read_file' is never used"
    ) in res.output


@pytest.mark.root
def test_inventory_values_crosshost_replaces_are_said_once_and_kept_in_report_json(tmp_path: Path) -> None:
    suite = _suite(tmp_path / "s")
    inv = _inventory(tmp_path / "hosts.toml", allow_home=True, pin_tmpdir=True)
    runs = tmp_path / "runs"
    res = CliRunner().invoke(app, ["replay", str(suite), "-i", str(inv), "--out", str(runs)])
    assert res.exit_code == 0, res.output
    note = (
        "inventory values replaced: a (HOME); b (HOME, TMPDIR): every attempt gets a fresh, empty HOME and "
        "TMPDIR of its own and its workspace as PWD, whatever the inventory allowlists or pins"
    )
    assert " ".join(res.output.split()).count(f"note: {note}") == 1
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    assert json.loads((run / "report.json").read_text())["notes"] == [note]
    # and it is true: b's predicate saw a TMPDIR of its own, empty, not the pinned /var/tmp/mine
    finish = json.loads((run / "hosts" / "b" / "traces" / "home.0.jsonl").read_text().splitlines()[-1])
    said = finish["predicate_output"]
    assert said.startswith(f"HOME={tmp_path}/roots/b/") and "TMPDIR=/var/tmp/mine" not in said
    assert said.count("\n") == 0  # ls -A printed nothing: both directories empty


@pytest.mark.root
def test_an_inventory_that_names_none_of_them_gets_no_note(tmp_path: Path) -> None:
    suite = _suite(tmp_path / "s")
    runs = tmp_path / "runs"
    res = CliRunner().invoke(app, ["replay", str(suite), "-i", str(_inventory(tmp_path / "hosts.toml")),
                                   "--out", str(runs)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "inventory values replaced" not in res.output
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    assert json.loads((run / "report.json").read_text())["notes"] == []


@pytest.mark.root
def test_inventory_values_crosshost_ignores_are_said_too(tmp_path: Path) -> None:
    """A local host's own table naming keys only an ssh host uses: said ignored, once, and kept."""
    suite = _suite(tmp_path / "s")
    inv = _inventory(tmp_path / "hosts.toml")
    inv.write_text(inv.read_text().replace('name = "a"\n', 'name = "a"\nuser = "bob"\nport = 2200\n', 1))
    runs = tmp_path / "runs"
    res = CliRunner().invoke(app, ["replay", str(suite), "-i", str(inv), "--out", str(runs)])
    assert res.exit_code == 0, res.output
    note = f"a: {inv}: key(s) 'user', 'port' ignored: a local host is reached without SSH"
    assert " ".join(res.output.split()).count(f"note: {note}") == 1
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    assert json.loads((run / "report.json").read_text())["notes"] == [note]
