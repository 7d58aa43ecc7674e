"""Task selection, one syntax and one function for replay, report and diff: --tasks names or globs,
--exclude, --tags (task.toml tags = [...]); --hosts a,b."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.errors import InputError
from orchestrator.selection import TaskSelection
from tests.support.runner import own_machine_python

TASKS = ["net-dns", "net-http", "disk-full", "unicode"]
TAGS = {"net-dns": ["net"], "net-http": ["net", "slow"], "disk-full": ["disk", "slow"]}
runner = CliRunner()


@pytest.mark.parametrize(
    ("tasks", "exclude", "tags", "chosen"),
    [
        (None, None, None, TASKS),
        ("net-*", None, None, ["net-dns", "net-http"]),
        ("unicode,net-d?s", None, None, ["net-dns", "unicode"]),  # suite order, not the order named
        (None, "net-*", None, ["disk-full", "unicode"]),
        (None, None, "slow", ["net-http", "disk-full"]),
        (None, None, "disk,net", ["net-dns", "net-http", "disk-full"]),
        ("*-*", "disk-*", "slow", ["net-http"]),
    ],
)
def test_select_globs_exclusions_and_tags(tasks: str, exclude: str, tags: str, chosen: list[str]) -> None:
    assert TaskSelection.of(tasks, exclude, tags).select(TASKS, TAGS, "suite") == chosen


@pytest.mark.parametrize(
    ("selection", "tags", "message"),
    [
        (TaskSelection.of("nte-*"), TAGS, "suite: --tasks 'nte-*' matches no task (tasks: net-dns, net-http, disk-full, unicode)"),
        (TaskSelection.of(exclude="dsk"), TAGS, "suite: --exclude 'dsk' matches no task"),
        (TaskSelection.of(tags="fast"), TAGS, "suite: --tags 'fast': no task has it (tags: disk, net, slow)"),
        (TaskSelection.of(tags="net"), None, "suite: --tags: no task tags recorded here"),
        (TaskSelection.of("net-*", exclude="net-*"), TAGS, "suite: --tasks net-* --exclude net-* selects no task"),
    ],
)  # fmt: skip
def test_a_selection_that_matches_nothing_is_bad_input_naming_it(
    selection: TaskSelection, tags: dict[str, list[str]] | None, message: str
) -> None:
    with pytest.raises(InputError) as info:
        selection.select(TASKS, tags, "suite")
    assert str(info.value).startswith(message)


def _suite(root: Path) -> Path:
    (root / "tasks").mkdir(parents=True)
    (root / "suite.toml").write_text('name = "sel"\n[agent]\nkind = "none"\n')
    (root / "contract.json").write_text('{"contract_id": "s.v1", "tools": []}')
    for task in TASKS:
        d = root / "tasks" / task
        (d / "repo").mkdir(parents=True)
        (d / "prompt.md").write_text("nothing\n")
        (d / "task.toml").write_text(f"tags = {json.dumps(TAGS.get(task, []))}\n")
        (d / "repo" / "run_tests.sh").write_text("echo ok\n")
    return root


def _inventory(path: Path) -> Path:
    path.write_text(
        f'[defaults]\npython = "{sys.executable}"\nenv_allowlist = ["PATH", "LANG"]\n'
        + "".join(
            f'[[hosts]]\nname = "{n}"\ntransport = "local"\nworkspace_root = "{path.parent}/roots/{n}"\n'
            f'python = "{own_machine_python(path.parent, n)}"\nenv = {{ LANG = "{lang}" }}\n'
            for n, lang in (("a", "C"), ("b", "C.UTF-8"), ("c", "C.UTF-8"))
        )
    )
    return path


@pytest.mark.root
def test_replay_report_and_diff_take_the_same_selection(tmp_path: Path) -> None:
    from orchestrator.cli import app

    suite, inv, runs = _suite(tmp_path / "sel"), _inventory(tmp_path / "hosts.toml"), tmp_path / "runs"
    res = runner.invoke(app, ["replay", str(suite), "-i", str(inv), "--out", str(runs), "--hosts", "a,c",
                              "--tags", "slow,net", "--exclude", "*-dns"])  # fmt: skip
    assert res.exit_code == 0, res.output
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["tasks"] == ["disk-full", "net-http"]  # the suite's order (its tasks/ sorted)
    assert manifest["task_tags"] == {"disk-full": ["disk", "slow"], "net-http": ["net", "slow"]}
    assert sorted(p.name for p in (run / "hosts").iterdir()) == ["a", "c"]
    traces = sorted(p.name for p in (run / "hosts" / "c" / "traces").glob("*.jsonl") if ".obs." not in p.name)
    assert traces == ["disk-full.0.jsonl", "net-http.0.jsonl"]  # the runner ran only those

    full = (run / "report.json").read_text()
    res = runner.invoke(app, ["report", str(run), "--format", "json", "--tags", "disk"])
    assert res.exit_code == 0, res.output
    assert [t["task"] for t in json.loads(res.output)["tasks"]] == ["disk-full"]
    assert (run / "report.json").read_text() == full  # a subset never replaces the run's report
    res = runner.invoke(app, ["report", str(run), "--tasks", "nope*"])
    assert res.exit_code == 2 and "--tasks 'nope*' matches no task (tasks: disk-full, net-http)" in res.output

    res = runner.invoke(app, ["diff", str(run), "--hosts", "c,a", "--exclude", "net-*"])
    assert res.exit_code == 0, res.output
    assert res.output == "# disk-full: same shapes and values on c and a (attempts 0)\n"
    res = runner.invoke(app, ["diff", str(run), "--hosts", "c"])  # one name: the reference against it
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0].endswith("on a and c (attempts 0)")


def test_tags_in_task_toml_are_checked(tmp_path: Path) -> None:
    from agent_runner.errors import SuiteError
    from agent_runner.suite import load_suite

    suite = _suite(tmp_path / "sel")
    (suite / "tasks" / "unicode" / "task.toml").write_text('tags = ["a,b"]\n')
    with pytest.raises(SuiteError, match=r"unicode/task.toml: tags: tag 'a,b' must be letters"):
        load_suite(suite)
