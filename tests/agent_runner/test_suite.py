"""Suite input: TOML layout and normalised suite.json read the same; bad input stops the run (exit 2)
before any task, with a message naming the file and what is wrong."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent_runner.errors import SuiteError
from agent_runner.suite import load_suite, normalise_suite
from tests.support.runner import TRIAGE, run_runner, write_suite

GOOD = {"script": [{"content": "ok", "finish": "stop"}]}


def _bad_suites(root: Path) -> dict[str, tuple[Path, str, str]]:
    """name -> (suite dir, file the message must name, what it must say)."""
    cases: dict[str, tuple[Path, str, str]] = {}
    s = write_suite(root / "toml", {"a": GOOD, "b": dict(GOOD, toml="expect_tools = [\n")})
    cases["broken task TOML"] = (s, "tasks/b/task.toml", "broken TOML")
    s = write_suite(root / "suitetoml", {"a": GOOD}, suite_toml='name = "t"\nrepeat = \n')
    cases["broken suite TOML"] = (s, "suite.toml", "broken TOML")
    s = write_suite(root / "script", {"a": GOOD, "b": {"script": {"tool_calls": []}}})
    cases["script.json not a list"] = (s, "tasks/b/script.json", "must be a JSON list")
    s = write_suite(root / "dots", {"a": GOOD, "a..b": GOOD})
    cases["task id with .."] = (s, "tasks/a..b", "task id")
    s = write_suite(root / "prompt", {"a": GOOD, "b": dict(GOOD, prompt=None)})
    cases["missing prompt.md"] = (s, "tasks/b/prompt.md", "missing")
    s = write_suite(root / "kind", {"a": GOOD}, suite_toml='name = "t"\n[agent]\nkind = "gpt-magic"\n')
    cases["unknown agent.kind"] = (s, "suite.toml", "unknown agent kind 'gpt-magic'")
    s = write_suite(root / "taskkind", {"a": GOOD, "b": dict(GOOD, toml='[agent]\nkind = "robot"\n')})
    cases["unknown task agent.kind"] = (s, "tasks/b/task.toml", "unknown agent kind 'robot'")
    s = write_suite(root / "key", {"a": dict(GOOD, toml='expect_tool = ["x"]\n')})
    cases["unknown task key"] = (s, "tasks/a/task.toml", "unknown key(s) expect_tool")
    s = write_suite(root / "budget", {"a": dict(GOOD, toml="[budget]\nmax_steps = 0\n")})
    cases["bad budget"] = (s, "tasks/a/task.toml", "max_steps must be a positive integer")
    s = write_suite(root / "alpha", {"a": GOOD}, suite_toml='name = "t"\n[gate]\nalpha = 1.5\n')
    cases["alpha out of range"] = (s, "suite.toml", "[gate].alpha must be a number between 0 and 1")
    s = write_suite(root / "sampled", {"a": dict(GOOD, toml='[agent]\nkind = "scripted"\nsampled = true\n')})
    cases["sampled on a scripted agent"] = (s, "tasks/a/task.toml", "sampled must be true or false, for kind")
    s = write_suite(root / "contract", {"a": GOOD})
    (s / "contract.json").write_text('{"tools": "nope"}')
    cases["bad contract"] = (s, "contract.json", "'tools' must be a list")
    # The normalised form: a task id with '/' can only be written there.
    s = root / "json"
    s.mkdir()
    data: dict[str, Any] = normalise_suite(write_suite(root / "src", {"a": GOOD}))
    data["tasks"][0]["id"] = "../escape"
    (s / "suite.json").write_text(json.dumps(data))
    cases["task id with / in suite.json"] = (s, "suite.json", "tasks[0].id '../escape'")
    return cases


def test_every_bad_input_exits_2_before_any_task_and_names_the_file(tmp_path: Path) -> None:
    for name, (suite, file, what) in _bad_suites(tmp_path / "suites").items():
        out = tmp_path / "out" / name.replace(" ", "-")
        done = run_runner("run", "--suite", str(suite), "--out", str(out))
        assert done.returncode == 2, (name, done.stderr)
        message = done.stderr.strip()
        assert len(message.splitlines()) == 1, (name, message)
        assert file in message and what in message, (name, message)
        assert not out.exists(), name  # stopped before any task: nothing written


def test_each_bad_input_is_one_suite_error(tmp_path: Path) -> None:
    for name, (suite, file, _) in _bad_suites(tmp_path).items():
        with pytest.raises(SuiteError, match=file.replace(".", r"\.")):
            load_suite(suite)
        assert name


def test_normalised_suite_json_loads_like_the_toml_layout(tmp_path: Path) -> None:
    data = normalise_suite(TRIAGE)
    assert json.loads(json.dumps(data)) == data  # JSON-able
    assert data["name"] == "triage" and len(data["tasks"]) >= 10
    shipped = tmp_path / "suite"
    shipped.mkdir()
    (shipped / "suite.json").write_text(json.dumps(data))
    shutil.copytree(TRIAGE / "agent", shipped / "agent")
    for task in (TRIAGE / "tasks").iterdir():
        if (task / "repo").is_dir():
            shutil.copytree(task / "repo", shipped / "tasks" / task.name / "repo")
    from_toml, from_json = load_suite(TRIAGE), load_suite(shipped)
    assert from_json.data == from_toml.data
    assert [(t.id, t.agent, t.budget, t.script, t.fixtures, t.must_finish, t.repo_dir is not None)
            for t in from_json.tasks] == [
        (t.id, t.agent, t.budget, t.script, t.fixtures, t.must_finish, t.repo_dir is not None)
        for t in from_toml.tasks]
    budget_task = from_json.task("metrics-retry-budget")
    assert budget_task.budget.max_steps == 4 and budget_task.budget.timeout_s == 20  # override merges
    assert from_json.task("feature-flag-probe").agent.kind == "none"
    assert from_json.task("leaky-workdir").agent.command == ["python3", "{suite}/agent/leaky_agent.py"]


def test_shipped_suite_json_runs_and_pins_match_the_toml_run(tmp_path: Path) -> None:
    shipped = tmp_path / "suite"
    shipped.mkdir()
    (shipped / "suite.json").write_text(json.dumps(normalise_suite(TRIAGE)))
    shutil.copytree(TRIAGE / "agent", shipped / "agent")
    for task in ("fix-nginx-config", "leaky-workdir"):
        if (TRIAGE / "tasks" / task / "repo").is_dir():
            shutil.copytree(TRIAGE / "tasks" / task / "repo", shipped / "tasks" / task / "repo")
    pins = []
    for suite, out in ((shipped, tmp_path / "a"), (TRIAGE, tmp_path / "b")):
        done = run_runner("run", "--suite", str(suite), "--out", str(out), "--tasks", "fix-nginx-config,leaky-workdir",
                          "--repeat", "1")
        assert done.returncode == 0, done.stderr
        pins.append([json.loads((out / "traces" / f"{t}.0.jsonl").read_text().splitlines()[0])["pins"]
                     for t in ("fix-nginx-config", "leaky-workdir")])
    assert pins[0] == pins[1]


def test_unknown_task_selected_is_bad_input(tmp_path: Path) -> None:
    done = run_runner("run", "--suite", str(TRIAGE), "--out", str(tmp_path / "o"), "--tasks", "nope")
    assert done.returncode == 2 and "no task 'nope'" in done.stderr


def test_sampled_agents_and_alpha_are_read_from_the_suite(tmp_path: Path) -> None:
    from agent_runner.suite_model import Gate, is_sampled

    command = '[agent]\nkind = "command"\ncommand = ["python3", "x.py"]\n'
    suite = write_suite(
        tmp_path / "s",
        {"det": dict(GOOD, toml=command), "coin": dict(GOOD, toml=command + "sampled = true\n"), "a": GOOD},
        suite_toml='name = "t"\n[gate]\nalpha = 0.01\n',
    )
    loaded = load_suite(suite)
    assert loaded.gate == Gate(flip_rate=0.1, alpha=0.01)
    assert [t.id for t in loaded.tasks if is_sampled(t.agent)] == ["coin"]
    assert loaded.sampled_task_ids() == ["coin"]


@pytest.mark.parametrize(
    ("gate", "said"),
    [
        ('correction = "bonferroni"', "[gate].correction must be"),
        ("undecided = -1", "[gate].undecided must be a whole number"),
        ("undecided = 1.5", "[gate].undecided must be a whole number"),
    ],
)
def test_gate_correction_and_undecided_are_checked(tmp_path: Path, gate: str, said: str) -> None:
    from agent_runner.suite import Gate

    good = write_suite(tmp_path / "ok", {"a": GOOD}, suite_toml='name = "t"\n[gate]\ncorrection = "holm"\nundecided = 2\n')
    assert load_suite(good).gate == Gate(correction="holm", undecided=2)
    bad = write_suite(tmp_path / "bad", {"a": GOOD}, suite_toml=f'name = "t"\n[gate]\n{gate}\n')
    with pytest.raises(SuiteError, match=re.escape(said)):
        load_suite(bad)


def test_hold_model_is_true_false_or_strict(tmp_path: Path) -> None:
    agent = ('[agent]\nkind = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\napi_key_env = "K"\n'
             'hold_model = "maybe"\n')
    suite = write_suite(tmp_path / "s", {"a": dict(GOOD, toml=agent)})
    with pytest.raises(SuiteError, match=r'hold_model must be true, false or "strict"'):
        load_suite(suite)
