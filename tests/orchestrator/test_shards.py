"""Shards: ``crosshost replay --shard`` and ``crosshost merge``, through the real CLI, on two LocalHost
"hosts" that are machines of their own and differ only in their pinned TZ (the real runner).

What a user relies on: the shards split the tasks (each on every host), whatever engine index they
read; merging them gives the run the unsharded replay gives (classifications, flips, flip rate,
statistics, exit code); and shards that are not all of one run are refused in one line, exit 2.
(A Slurm job array over real sshd hosts: tests/integration/test_shards_slurm.py.) The replays run the
runner in a mount namespace of each host's own (own_machine_python): those tests are marked root.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.commands.shards import Shard, engine_index, parse_shard
from orchestrator.errors import InputError
from orchestrator.store.history import history_listing
from tests.support.runner import own_machine_python, predicate_suite

#: in suite order (a suite's tasks are its task directories, sorted)
TASKS = ["fail-d", "ok-b", "ok-e", "ok-g", "tz-a", "tz-c", "tz-f"]


def _suite(tmp_path: Path, name: str = "sharded") -> Path:
    """Seven predicate tasks: tz-* pass only where TZ is UTC, ok-* always, fail-* never."""
    suite = predicate_suite(tmp_path, "exit 0", tasks=len(TASKS), prefix="x", name=name)
    for i, task in enumerate(TASKS):
        (suite / "tasks" / f"x-{i}").rename(suite / "tasks" / task)
        script = suite / "tasks" / task / "repo" / "run_tests.sh"
        body = {"tz": '[ "$TZ" = UTC ] || { echo "TZ is $TZ"; exit 1; }', "ok": "exit 0", "fail": "exit 1"}
        script.write_text(f"#!/bin/sh\n{body[task.split('-')[0]]}\n")
    return suite


def _inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.toml"
    hosts = [("ref", "UTC"), ("tokyo", "Asia/Tokyo")]
    text = ['[defaults]\nenv_allowlist = ["PATH", "TZ", "LANG"]\ntimeout_s = 60\n']
    for name, tz in hosts:
        python = own_machine_python(tmp_path / "machines", name)
        text.append(
            f'[[hosts]]\nname = "{name}"\ntransport = "local"\nworkspace_root = "{tmp_path}/roots/{name}"\n'
            f"python = {json.dumps(str(python))}\nenv = {{ TZ = {json.dumps(tz)} }}\n"
        )
    path.write_text("\n".join(text))
    return path


def _cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args), env=env)
    return res.exit_code, res.output


def _report(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "report.json").read_text()))


def _judged(report: dict[str, Any]) -> dict[str, Any]:
    """What the merged run must share with the unsharded one."""
    return {
        "tasks": {
            t["task"]: (t["classification"], t["flip"], t["verdicts"], t.get("evidence")) for t in report["tasks"]
        },
        "flip_rate": report["flip_rate"],
        "valid": report["valid"],
        "within_gate": report["within_gate"],
        "stats": report["stats"],
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("shards")
    return _suite(root), _inventory(root), root


@pytest.fixture(scope="module")
def unsharded(setup: tuple[Path, Path, Path]) -> tuple[int, Path]:
    suite, inv, root = setup
    code, output = _cli("replay", str(suite), "-i", str(inv), "--out", str(root / "whole"), "--repeat", "2")
    run_dir = next(p for p in (root / "whole").iterdir() if (p / "manifest.json").is_file())
    return code, run_dir


@pytest.fixture(scope="module")
def shards(setup: tuple[Path, Path, Path]) -> list[Path]:
    """Shards 1-3 of run ``unit-run``, each started as a Slurm array task would start it."""
    suite, inv, root = setup
    dirs = []
    for task_id in range(3):
        env = {"SLURM_ARRAY_TASK_ID": str(task_id), "SLURM_ARRAY_TASK_COUNT": "3",
               "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "2", "SLURM_ARRAY_JOB_ID": "41"}
        code, output = _cli("replay", str(suite), "-i", str(inv), "--out", str(root / "shards"), "--repeat", "2",
                            "--shard", "auto", "--run-id", "unit-run", env=env)  # fmt: skip
        assert code == 0, output  # a shard's findings are the merged run's to judge
        assert "shard written, crosshost merge judges the run" in output
        dirs.append(root / "shards" / f"unit-run.shard-{task_id + 1}-of-3")
    return dirs


# ------------------------------------------------------------------------------------------- --shard


@pytest.mark.root
def test_the_shards_split_the_tasks_and_each_replays_on_every_host(shards: list[Path]) -> None:
    seen: list[str] = []
    for k, shard_dir in enumerate(shards, start=1):
        manifest = json.loads((shard_dir / "manifest.json").read_text())
        assert manifest["run_id"] == f"unit-run.shard-{k}-of-3"
        assert manifest["shard"] == {"run_id": "unit-run", "index": k, "count": 3, "by": "task", "tasks": TASKS}
        assert manifest["tasks"] == TASKS[k - 1 :: 3]
        assert list(manifest["hosts"]) == ["ref", "tokyo"] and manifest["reference"] == "ref"
        for host in ("ref", "tokyo"):
            traces = sorted(p.name for p in (shard_dir / "hosts" / host / "traces").glob("*.[01].jsonl"))
            assert traces == sorted(f"{t}.{a}.jsonl" for t in manifest["tasks"] for a in (0, 1))
        seen += manifest["tasks"]
    assert sorted(seen) == sorted(TASKS) and len(seen) == len(TASKS)


@pytest.mark.root
def test_merge_gives_the_unsharded_run(setup: tuple[Path, Path, Path], unsharded: tuple[int, Path],
                                       shards: list[Path]) -> None:  # fmt: skip
    _, _, root = setup
    whole_code, whole_dir = unsharded
    code, output = _cli("merge", *map(str, reversed(shards)), "--out", str(root / "merged"))
    merged = root / "merged" / "unit-run"
    assert code == whole_code == 1, output  # tz-* flip: 3 of 7 tasks, over the gate
    assert f"run directory: {merged}" in output
    assert "merged 3 shard(s) of run unit-run: unit-run.shard-1-of-3, unit-run.shard-2-of-3, unit-run.shard-3-of-3" in output
    assert _judged(_report(merged)) == _judged(_report(whole_dir))
    assert {t["task"]: t["classification"] for t in _report(merged)["tasks"]}["tz-c"] == "host_coupling"
    manifest = json.loads((merged / "manifest.json").read_text())
    assert manifest["run_id"] == "unit-run" and manifest["shard"] is None and manifest["tasks"] == TASKS
    assert manifest["shards"] == [f"unit-run.shard-{k}-of-3" for k in (1, 2, 3)]
    assert all(rec["reachable"] and rec["workspace_removed"] for rec in manifest["hosts"].values())
    rows = [json.loads(line) for line in (merged / "results.jsonl").read_text().splitlines()]
    assert [(r["env"], r["task"], r["attempt"]) for r in rows] == [
        (h, t, a) for h in ("ref", "tokyo") for t in TASKS for a in (0, 1)
    ]
    # `report` on the merged run says what merge said; the history knows the run, not its shards
    assert _cli("report", str(merged))[0] == code
    assert [e.row.run_id for e in history_listing(root / "merged").entries] == ["unit-run"]
    rebuilt = history_listing(root / "shards", rebuild_index=True)
    assert rebuilt.entries == []
    assert any("shard 2/3 of run unit-run, not a run of its own" in note for note in rebuilt.notes)


@pytest.mark.root
def test_a_shard_runs_once(setup: tuple[Path, Path, Path], shards: list[Path]) -> None:
    suite, inv, root = setup
    code, output = _cli("replay", str(suite), "-i", str(inv), "--out", str(root / "shards"), "--repeat", "2",
                        "--shard", "2/3", "--run-id", "unit-run")  # fmt: skip
    assert code == 2 and output.count("\n") == 1, output
    assert "shard 2/3 of run unit-run was written already" in output


@pytest.mark.parametrize(
    ("spec", "env", "expected"),
    [
        ("2/4", {}, Shard("given", 2, 4)),
        ("auto", {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "4"}, Shard("given", 1, 4)),
        # --array=1-4: the first task is shard 1 too
        ("auto", {"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "1",
                  "SLURM_ARRAY_TASK_MAX": "4"}, Shard("given", 4, 4)),
        ("auto/3", {"JOB_COMPLETION_INDEX": "2"}, Shard("given", 3, 3)),
        ("auto", {"CI_NODE_INDEX": "1", "CI_NODE_TOTAL": "2"}, Shard("given", 1, 2)),
    ],
)
def test_shard_specs_and_engine_indices(spec: str, env: dict[str, str], expected: Shard) -> None:
    assert parse_shard(spec, "given", env) == expected


def test_the_run_id_comes_from_the_flag_the_environment_or_the_slurm_array() -> None:
    slurm = {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_JOB_ID": "77",
             "SLURM_CLUSTER_NAME": "hpc"}  # fmt: skip
    assert parse_shard("auto", None, slurm).run_id == "slurm-hpc-77"
    assert parse_shard("auto", None, {**slurm, "CROSSHOST_RUN_ID": "nightly-5"}).run_id == "nightly-5"
    assert parse_shard("auto", "mine", slurm).run_id == "mine"
    assert engine_index({"CI_NODE_INDEX": "2", "CI_NODE_TOTAL": "3", "CI_PIPELINE_ID": "9"})[3] == "gitlab-9"


@pytest.mark.parametrize(
    ("spec", "run_id", "env", "says"),
    [
        ("0/4", "r", {}, "--shard 0/4: shard 0 of 4 does not exist (K runs from 1 to N)"),
        ("5/4", "r", {}, "shard 5 of 4 does not exist"),
        ("2/0", "r", {}, "N must be a whole number from 1"),
        ("two", "r", {}, "--shard two: expected K/N (shard K of N, from 1), auto or auto/N"),
        ("auto", "r", {}, "--shard auto: no job engine's index in the environment"),
        ("auto", "r", {"JOB_COMPLETION_INDEX": "0"}, "Kubernetes gives this task's index but not the number"),
        ("auto/5", "r", {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "4"}, "Slurm runs 4 task(s), not 5"),
        ("auto", "r", {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "0",
                       "SLURM_ARRAY_TASK_MAX": "2", "SLURM_ARRAY_TASK_STEP": "2"}, "submit it as --array=0-1"),
        ("2/4", None, {}, "every shard of one run needs the same run id: give --run-id ID"),
        ("2/4", "../x", {}, "--run-id '../x': letters, digits"),
    ],
)
def test_bad_shard_specs_are_one_line(spec: str, run_id: str | None, env: dict[str, str], says: str) -> None:
    with pytest.raises(InputError) as bad:
        parse_shard(spec, run_id, env)
    assert says in str(bad.value) and "\n" not in str(bad.value)


def test_more_shards_than_tasks_and_explain_with_a_shard_are_refused(setup: tuple[Path, Path, Path]) -> None:
    suite, inv, root = setup
    code, output = _cli("replay", str(suite), "-i", str(inv), "--out", str(root / "none"), "--shard", "1/8",
                        "--run-id", "r")  # fmt: skip
    assert code == 2 and "--shard 1/8: the selection has 7 task(s); split it into at most 7 shard(s)" in output
    code, output = _cli("replay", str(suite), "-i", str(inv), "--shard", "1/2", "--run-id", "r", "--explain")
    assert code == 2 and "explain the merged run" in output
    assert not (root / "none").exists() or not any((root / "none").iterdir())


# --------------------------------------------------------------------------------------------- merge


def _copy(shards: list[Path], where: Path) -> list[Path]:
    where.mkdir()
    return [Path(shutil.copytree(s, where / s.name, symlinks=True)) for s in shards]


def _edit_manifest(shard_dir: Path, **changes: Any) -> None:
    path = shard_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    for key, value in changes.items():
        target = manifest
        *parents, leaf = key.split("__")
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        target[leaf] = value
    path.write_text(json.dumps(manifest))


def _merge_refused(*dirs: Path, out: Path) -> str:
    code, output = _cli("merge", *map(str, dirs), "--out", str(out))
    assert code == 2, output
    assert output.count("\n") == 1, output  # one line
    assert not out.exists() or not any(out.iterdir()), "a refused merge writes nothing"
    return output


@pytest.mark.root
def test_merge_refuses_shards_of_different_runs(tmp_path: Path, shards: list[Path]) -> None:
    a = _copy(shards, tmp_path / "a")
    _edit_manifest(a[1], shard__run_id="other-run")
    said = _merge_refused(*a, out=tmp_path / "out")
    assert said == (
        f"InputError: {a[1]}: not a shard of the same run as {a[0]}: run id 'other-run', not 'unit-run'; "
        "merge the shards of one run\n"
    )


@pytest.mark.root
@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"suite__sha": "0" * 64}, "suite ('sharded', '0000"),
        ({"reference": "tokyo"}, "reference 'tokyo', not 'ref'"),
        ({"hold_model": "strict"}, "held model 'strict', not None"),
        ({"repeat": 3}, "repeat 3, not 2"),
        ({"bundle_sha": "f" * 64}, "bundle ('ffff"),
        ({"inventory__hosts__1__port": 2222}, "host tokyo's inventory entry differs"),
    ],
)
def test_merge_refuses_shards_that_differ_in_what_makes_a_run(
    tmp_path: Path, shards: list[Path], change: dict[str, Any], says: str
) -> None:
    a = _copy(shards, tmp_path / "a")
    _edit_manifest(a[2], **change)
    assert says in _merge_refused(*a, out=tmp_path / "out")


@pytest.mark.root
def test_merge_refuses_different_pins(tmp_path: Path, shards: list[Path]) -> None:
    a = _copy(shards, tmp_path / "a")
    manifest = json.loads((a[1] / "manifest.json").read_text())
    task = manifest["tasks"][0]
    _edit_manifest(a[1], **{f"pins__{task}__runner_source_sha": "e" * 64})
    assert f"pin runner_source_sha {'e' * 64}, not " in _merge_refused(*a, out=tmp_path / "out")


@pytest.mark.root
def test_merge_refuses_a_missing_a_doubled_or_an_unfinished_shard_and_a_plain_run(
    tmp_path: Path, shards: list[Path], unsharded: tuple[int, Path]
) -> None:
    a = _copy(shards, tmp_path / "a")
    assert "run unit-run: shard(s) 2/3 missing; give all 3 shard directories" in _merge_refused(
        a[0], a[2], out=tmp_path / "out"
    )
    assert "shard 1/3 is given twice" in _merge_refused(a[0], a[0], a[1], a[2], out=tmp_path / "out")
    assert "not a shard (its manifest.json has no shard)" in _merge_refused(
        unsharded[1], *a, out=tmp_path / "out"
    )
    _edit_manifest(a[1], finished=None)
    assert "shard 2/3 has not finished" in _merge_refused(*a, out=tmp_path / "out")


@pytest.mark.root
def test_merge_never_overwrites_a_run(tmp_path: Path, shards: list[Path]) -> None:
    (tmp_path / "out" / "unit-run").mkdir(parents=True)
    code, output = _cli("merge", *map(str, shards), "--out", str(tmp_path / "out"))
    assert code == 2 and "exists already (merged before?)" in output and output.count("\n") == 1


# ---------------------------------------------------------------------------------------- held model

KEY_ENV = "CROSSHOST_SHARD_TEST_KEY"
READ_TZ: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "shell", "args": {"argv": ["date", "+%Z"]}}]},
    {"tool_calls": [{"name": "lookup", "args": {"q": "after"}}]},
    {"content": "done", "finish": "stop"},
]


def _held_suite(root: Path, base_url: str) -> Path:
    suite = root / "held"
    (suite / "suite.toml").parent.mkdir(parents=True)
    (suite / "suite.toml").write_text(
        'name = "held"\nrepeat = 2\n'
        f'[agent]\nkind = "openai"\nmodel = "m1"\nbase_url = "{base_url}"\napi_key_env = "{KEY_ENV}"\n'
        "[budget]\nmax_steps = 6\ntimeout_s = 60\n"
    )
    contract = {"contract_id": "held.v1", "invariants": [],
                "tools": [{"name": "lookup", "required_args": ["q"]}, {"name": "shell", "required_args": ["argv"]}]}
    (suite / "contract.json").write_text(json.dumps(contract))
    (suite / "tools.json").write_text(json.dumps({"allow": ["date +%Z"], "deny": []}))
    for task in ("read-a", "read-b", "read-c"):
        (suite / "tasks" / task / "repo").mkdir(parents=True)
        (suite / "tasks" / task / "task.toml").write_text('[fixtures]\nlookup = "looked it up"\n')
        (suite / "tasks" / task / "prompt.md").write_text(f"Which time zone is this ({task})?\n")
        (suite / "tasks" / task / "repo" / "run_tests.sh").write_text("exit 0\n")
    return suite


def _hold_files(run_dir: Path) -> tuple[dict[str, Any], list[str]]:
    summary = json.loads((run_dir / "model_hold.json").read_text())
    summary["divergences"] = sorted(summary["divergences"], key=lambda d: (d["task"], d["attempt"], d["host"]))
    return summary, (run_dir / "model_record.jsonl").read_text().splitlines()


@pytest.mark.root
def test_the_held_model_is_held_in_every_shard_and_merged_into_one_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference is in every shard: each shard records its tasks and answers tokyo from them; the
    merged record, hold summary and report are the unsharded run's."""
    from tests.support.fake_provider import FakeProvider

    key = "sk-shard-test-0123456789abcdef"
    monkeypatch.setenv(KEY_ENV, key)
    inv = _inventory(tmp_path)
    with FakeProvider(script=READ_TZ, key=key) as provider:
        suite = _held_suite(tmp_path, provider.base_url)
        whole_code, output = _cli("replay", str(suite), "-i", str(inv), "--out", str(tmp_path / "whole"))
        asked_whole = len(provider.requests)
        for k in (1, 2):
            code, output = _cli("replay", str(suite), "-i", str(inv), "--out", str(tmp_path / "shards"),
                                "--shard", f"{k}/2", "--run-id", "held-run")  # fmt: skip
            assert code == 0, output
        asked_sharded = len(provider.requests) - asked_whole
    code, output = _cli("merge", *map(str, sorted((tmp_path / "shards").iterdir())), "--out", str(tmp_path / "m"))
    whole = next(p for p in (tmp_path / "whole").iterdir() if (p / "manifest.json").is_file())
    merged = tmp_path / "m" / "held-run"
    assert code == whole_code, output
    # tokyo's `date +%Z` differs: each attempt held for its first request, then diverged and live
    assert asked_sharded == asked_whole == 3 * 2 * 3 + 3 * 2 * 2
    summary, record = _hold_files(merged)
    assert (summary, record) == _hold_files(whole)
    assert summary["held"] == {"tokyo": {f"read-{t}.{a}": 1 for t in "abc" for a in (0, 1)}}
    assert len(summary["divergences"]) == 6 and len(record) == 3 * 2 * 3
    assert {t["task"]: t["model_hold"] for t in _report(merged)["tasks"]} == {
        t["task"]: t["model_hold"] for t in _report(whole)["tasks"]
    }
    assert _judged(_report(merged)) == _judged(_report(whole))
