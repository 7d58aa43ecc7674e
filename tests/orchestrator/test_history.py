"""The history index: recording, rebuild, changes between runs, concurrent writers."""

from __future__ import annotations

import io
import json
import multiprocessing
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from orchestrator import ui
from orchestrator.errors import InputError
from orchestrator.store import history, run_changes, run_row
from orchestrator.store.records import HostRecord, Manifest, SuiteRef
from tests.support.runner import own_machine_python

HOSTS = ("local", "box-b")


def make_run_dir(
    runs_dir: Path,
    run_id: str,
    *,
    started: str,
    suite: str = "triage",
    suite_sha: str = "s" * 16,
    flips: tuple[str, ...] = (),
    tasks: tuple[str, ...] = ("t1", "t2", "t3"),
    pins: dict[str, Any] | None = None,
    verdicts: dict[str, dict[str, list[str]]] | None = None,
    valid: bool = True,
) -> Path:
    """A finished run dir (docs/run-directory.md): manifest.json + report.json (and results.jsonl).

    A task in ``flips`` passes on the reference and fails on box-b; others pass on both.
    """
    d = runs_dir / run_id
    (d / "hosts").mkdir(parents=True)
    pins = pins if pins is not None else {"t1": {"runner_source_sha": "r1", "contract_sha": "c1"}}
    manifest = Manifest(
        run_id=run_id,
        started=started,
        finished=started.replace(":00Z", ":30Z"),
        suite=SuiteRef(name=suite, sha=suite_sha, path=f"/suites/{suite}"),
        pins=pins,
        reference=HOSTS[0],
        crosshost_version="0.1.0",
        hosts={h: HostRecord(reachable=True, fingerprint=f"{i:016x}") for i, h in enumerate(HOSTS)},
    ).dump()
    report_tasks = []
    for t in tasks:
        v = (verdicts or {}).get(t) or {
            "local": ["pass", "pass"],
            "box-b": ["fail", "fail"] if t in flips else ["pass", "pass"],
        }
        report_tasks.append(
            {
                "task": t,
                "verdicts": v,
                "flip": t in flips,
                "flaky_hosts": [],
                "classification": "host_coupling" if t in flips else "agree",
                "action": "",
                "shape_diff": [],
                "leaks": [],
            }
        )
    report = {
        "run_id": run_id,
        "suite": suite,
        "valid": valid,
        "invalid_reasons": [] if valid else ["pins differ"],
        "gate": 0.1,
        "flip_rate": len(flips) / len(tasks),
        "reference": "local",
        "hosts": [
            {"name": h, "fingerprint": f"{i:016x}", "reachable": True, "error": None}
            for i, h in enumerate(HOSTS)
        ],
        "tasks": report_tasks,
    }
    (d / "manifest.json").write_text(json.dumps(manifest))
    (d / "report.json").write_text(json.dumps(report))
    return d


def three_runs(runs: Path) -> list[Path]:
    """The issue's scenario: the second run introduces a flip of t2, the third removes it."""
    return [
        make_run_dir(runs, "r1", started="2024-05-01T10:00:00Z"),
        make_run_dir(runs, "r2", started="2024-05-01T16:00:00Z", flips=("t2",)),
        make_run_dir(runs, "r3", started="2024-05-01T22:00:00Z"),
    ]


def dump(runs: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    conn = sqlite3.connect(history.index_path(runs))
    try:
        return (
            conn.execute("SELECT * FROM runs ORDER BY run_id").fetchall(),
            conn.execute("SELECT * FROM task_results ORDER BY run_id, task").fetchall(),
        )
    finally:
        conn.close()


def test_flip_appears_then_disappears(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    dirs = three_runs(runs)
    # compare_last as replay calls it, right after each run's report is written
    assert history.compare_last(runs, dirs[0]) == []
    assert history.compare_last(runs, dirs[1]) == ["t2"]
    assert history.compare_last(runs, dirs[2]) == []

    rows = history.history(runs, "triage")
    assert [r.run_id for r in rows] == ["r1", "r2", "r3"]
    assert [sorted(r.flipping) for r in rows] == [[], ["t2"], []]
    c12, c23 = run_changes.changes(rows[0], rows[1]), run_changes.changes(rows[1], rows[2])
    assert (c12.newly_flipping, c12.stopped_flipping) == (["t2"], [])
    assert (c23.newly_flipping, c23.stopped_flipping) == ([], ["t2"])
    assert c12.pins_moved == [] and c23.pins_moved == []


def test_row_contents(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    d = make_run_dir(
        runs,
        "r1",
        started="2024-05-01T10:00:00Z",
        tasks=("a", "b"),
        flips=("a",),
        verdicts={"a": {"local": ["pass", "pass"], "box-b": ["fail", "error"]}},
        valid=False,
    )
    row = history.record_run(runs, d)
    assert row.kind == "replay" and row.suite == "triage" and row.suite_sha == "s" * 16
    assert row.started == "2024-05-01T10:00:00.000000+00:00"
    assert row.valid is False and row.flip_rate == 0.5
    # error verdicts are the host's fault: not counted in the agent's pass rate
    assert row.pass_rate == {"box-b": round(2 / 3, 4), "local": 1.0}  # a: 0/1 (error dropped), b: 2/2
    assert [h["fingerprint"] for h in row.hosts] == ["0000000000000000", "0000000000000001"]
    (stored,) = history.history(runs)
    assert stored == row


def test_last_and_suite_filter(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for i in range(5):
        history.record_run(runs, make_run_dir(runs, f"r{i}", started=f"2024-05-0{i + 1}T10:00:00Z"))
    history.record_run(runs, make_run_dir(runs, "other", started="2024-05-09T10:00:00Z", suite="other"))
    assert [r.run_id for r in history.history(runs, "triage", last=2)] == ["r3", "r4"]
    assert [r.run_id for r in history.history(runs, last=2)] == ["r4", "other"]
    assert [r.run_id for r in history.history(runs, "other")] == ["other"]


def test_previous_is_same_suite_and_pins_moved(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    a = make_run_dir(
        runs, "a", started="2024-05-01T10:00:00Z", pins={"t1": {"runner_source_sha": "r1", "budget": {"max_steps": 8}}}
    )
    make_run_dir(runs, "x", started="2024-05-01T11:00:00Z", suite="other", flips=("t1",))
    b = make_run_dir(
        runs,
        "b",
        started="2024-05-01T12:00:00Z",
        suite_sha="t" * 16,
        pins={"t1": {"runner_source_sha": "r2", "budget": {"max_steps": 4}}},
        flips=("t1",),
    )
    history.rebuild(runs)
    prev = history.previous_run(runs, run_row.read_run(b))
    assert prev is not None and prev.run_id == "a"
    ch = run_changes.changes(prev, run_row.read_run(b))
    assert ch.newly_flipping == ["t1"]
    assert {m["pin"]: (m["old"], m["new"]) for m in ch.pins_moved} == {
        "suite_sha": ("s" * 16, "t" * 16),
        "t1.runner_source_sha": ("r1", "r2"),
        "t1.budget.max_steps": (8, 4),
    }
    assert history.previous_run(runs, run_row.read_run(a)) is None


def test_rebuild_equals_incremental(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for d in three_runs(runs):
        history.record_run(runs, d)
    history.record_run(runs, runs / "r2")  # recording twice changes nothing
    make_run_dir(runs, "x", started="2024-05-02T10:00:00Z", suite="other", flips=("t1", "t3"))
    history.record_run(runs, runs / "x")
    incremental = dump(runs)
    assert len(incremental[0]) == 4 and len(incremental[1]) == 12

    history.index_path(runs).unlink()
    for suffix in ("-wal", "-shm"):
        Path(str(history.index_path(runs)) + suffix).unlink(missing_ok=True)
    assert history.rebuild(runs) == (4, [])
    assert dump(runs) == incremental
    # rebuild over an index with stale rows drops them
    history.record_run(runs, runs / "x")
    import shutil

    shutil.rmtree(runs / "x")
    history.rebuild(runs)
    assert [r[0] for r in dump(runs)[0]] == ["r1", "r2", "r3"]


def test_unfinished_run_is_named_and_skipped_by_rebuild(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    d = make_run_dir(runs, "r1", started="2024-05-01T10:00:00Z")
    (d / "report.json").unlink()
    with pytest.raises(InputError, match=r"r1/report\.json: missing"):
        history.record_run(runs, d)
    make_run_dir(runs, "r2", started="2024-05-01T11:00:00Z")
    n, skipped = history.rebuild(runs)
    assert n == 1 and len(skipped) == 1 and skipped[0].startswith("r1:")
    (runs / "r2" / "report.json").write_text("{not json")
    with pytest.raises(InputError, match=r"r2/report\.json: line 1"):
        history.record_run(runs, runs / "r2")
    # JSON, but not a report: the file and the key it lacks, never a traceback
    (runs / "r2" / "report.json").write_text(json.dumps({"run_id": "r2", "tasks": []}))
    with pytest.raises(InputError, match=r"r2/report\.json: valid: Field required"):
        history.record_run(runs, runs / "r2")


def _record_many(runs: str, prefix: str, n: int, barrier: Any) -> None:
    barrier.wait()
    for i in range(n):
        history.record_run(Path(runs), Path(runs) / f"{prefix}{i:02d}")


def test_concurrent_writers_leave_consistent_index(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    n = 15
    for prefix in ("a", "b"):
        for i in range(n):
            make_run_dir(
                runs, f"{prefix}{i:02d}", started=f"2024-05-01T10:{i:02d}:00Z", flips=("t1",) * (i % 2)
            )
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_record_many, args=(str(runs), p, n, barrier)) for p in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]

    conn = sqlite3.connect(history.index_path(runs))
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (2 * n,)
        # every run has all three of its task rows: no half-written run
        per_run = dict(conn.execute("SELECT run_id, count(*) FROM task_results GROUP BY run_id").fetchall())
        assert per_run == {f"{p}{i:02d}": 3 for p in ("a", "b") for i in range(n)}
    finally:
        conn.close()
    incremental = dump(runs)
    history.rebuild(runs)
    assert dump(runs) == incremental


def test_history_command_shows_flip_appear_and_disappear(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli import app

    runs = tmp_path / "runs"
    for d in three_runs(runs):
        history.record_run(runs, d)
    make_run_dir(runs, "x", started="2024-05-02T10:00:00Z", suite="other", flips=("t1",))
    history.record_run(runs, runs / "x")
    cli = CliRunner()

    res = cli.invoke(app, ["history", "triage", "--out", str(runs)])
    assert res.exit_code == 0, res.output
    out = res.output
    assert all(r in out for r in ("r1", "r2", "r3")) and "other" not in out
    assert "local:100%" in out and "box-b:66.7%" in out  # r2: t2 failed twice on box-b
    r2_part, r3_part = out.split("r2 vs r1")[1].split("r3 vs r2")
    assert "newly flipping: t2" in r2_part and "stopped flipping" not in r2_part
    assert "stopped flipping: t2" in r3_part and "newly flipping" not in r3_part

    res = cli.invoke(app, ["history", "--last", "2", "--json", "--out", str(runs)])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [r["run_id"] for r in rows] == ["r3", "x"]
    assert rows[0]["changes"]["stopped_flipping"] == ["t2"] and rows[1]["changes"] is None

    history.index_path(runs).unlink()
    res = cli.invoke(app, ["history", "triage", "--rebuild", "--json", "--out", str(runs)])
    assert res.exit_code == 0, res.output
    assert [r["run_id"] for r in json.loads(res.stdout)] == ["r1", "r2", "r3"]


def test_history_table_fits_80_columns_one_line_a_run_and_wide_shows_every_column(tmp_path: Path) -> None:
    from rich.console import Console

    runs = tmp_path / "runs"
    run_ids = ["20240501T100000Z-1a2b3c", "20240501T160000Z-4d5e6f"]
    for run_id, started in zip(run_ids, ("2024-05-01T10:00:00Z", "2024-05-01T16:00:00Z"), strict=True):
        history.record_run(runs, make_run_dir(runs, run_id, started=started, flips=("t2",)))
    console = Console(width=80, record=True, file=io.StringIO())
    ui.history_table(history.history_view(runs, "triage"), console)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    for run_id in run_ids:  # each run is one line: id, suite, flip rate, validity and every host's rate
        (line,) = [x for x in lines if x.startswith(run_id) and " vs " not in x]
        assert line.split() == [run_id, "triage", "33.3%", "yes", "local:100%", "box-b:66.7%"]

    wide = Console(width=200, record=True, file=io.StringIO())
    ui.history_table(history.history_view(runs, "triage"), wide, wide=True)
    text = wide.export_text()
    assert "2024-05-01 10:00  20240501T100000Z-1a2b3c  triage  replay" in text
    assert "local:100% (00000000)" in text and "box-b:66.7% (00000000)" in text


def _replay_and_record(request: Any, bundle: Any, barrier: Any) -> None:
    from orchestrator.commands.replay import replay

    barrier.wait()
    outcome = replay(request, bundle=bundle)
    history.record_run(request.out, outcome.run_dir.path)  # what `replay` does after its report


def test_two_concurrent_replays(tmp_path: Path) -> None:
    """Two replays of one suite at the same moment: two complete run dirs, one consistent index."""
    import sys

    from agent_runner.trace import TraceWriter
    from orchestrator.commands import repro
    from orchestrator.commands.replay import ReplayRequest
    from orchestrator.hosts.bundle import build_bundle

    trace = tmp_path / "t.0.jsonl"
    with TraceWriter(trace) as w:
        w.header(run_id="x", host="a", task="t", attempt=0, fingerprint="0" * 16, pins={})
        w.turn(tool="shell", args={"argv": ["echo", "hi"]}, observation="exit 0\nhi\n", error=None)
        w.finish(reason="stop", final="ok", predicate_exit=None, verdict="pass", why="", wall_ms=1)
    suite = repro.build_suite(trace, tmp_path / "suite").path
    bundle = build_bundle(suite, tmp_path / "cache")  # built once: both replays push the same bundle
    inv = tmp_path / "hosts.toml"
    inv.write_text(
        f'[defaults]\npython = "{sys.executable}"\n'
        + "".join(
            f'[[hosts]]\nname = "{n}"\ntransport = "local"\nworkspace_root = "{tmp_path}/roots/{n}"\n'
            f'env = {{ TZ = "{tz}" }}\n'
            for n, tz in (("a", "UTC"), ("b", "Asia/Tokyo"))
        )
    )
    runs = tmp_path / "runs"
    request = ReplayRequest(suite_dir=suite, inventory_path=inv, out=runs)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_replay_and_record, args=(request, bundle, barrier)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    assert [p.exitcode for p in procs] == [0, 0]

    dirs = history.run_dirs(runs)
    assert len(dirs) == 2
    for d in dirs:
        manifest = json.loads((d / "manifest.json").read_text())
        assert manifest["finished"] and {h: r["reachable"] for h, r in manifest["hosts"].items()} == {
            "a": True,
            "b": True,
        }
        assert (d / "report.json").is_file()
        assert {
            (r["env"], r["task"]) for r in map(json.loads, (d / "results.jsonl").read_text().splitlines())
        } == {
            ("a", "t"),
            ("b", "t"),
        }
        for h in ("a", "b"):
            assert (d / "hosts" / h / "traces" / "t.0.jsonl").is_file()
    rows = history.history(runs)
    assert sorted(r.run_id for r in rows) == sorted(d.name for d in dirs)
    assert all(
        r.tasks == {"t": {"classification": r.tasks["t"]["classification"], "flip": False}} for r in rows
    )
    incremental = dump(runs)
    history.index_path(runs).unlink()
    history.rebuild(runs)
    assert dump(runs) == incremental


def test_after_replay_compare_last_exit_codes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    r1, r2, r3 = three_runs(runs)
    first = history.after_replay(r1, compare=True)
    assert first.newly_flipping == [] and first.exit_code(0) == 0
    second = history.after_replay(r2, compare=True)
    assert second.exit_code(0) == 1  # under the gate (exit 0), yet t2 newly flips
    assert second.exit_code(3) == 3  # an infrastructure failure keeps its own code
    assert second.message("triage") == "newly flipping against the previous run of triage: t2"
    third = history.after_replay(r3, compare=True)
    assert third.exit_code(0) == 0 and third.message("triage") is None
    assert [r.run_id for r in history.history(runs)] == ["r1", "r2", "r3"]


def test_after_replay_index_failure_is_a_warning(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    (d,) = three_runs(runs)[:1]
    history.index_path(runs).mkdir()  # something in the way of the index file
    res = history.after_replay(d)
    assert res.newly_flipping == [] and res.warning and "history index not updated" in res.warning
    assert res.exit_code(0) == 0  # recording is not the run's job: the run dir is intact
    asked = history.after_replay(d, compare=True)  # a comparison that cannot be made is never a pass
    assert asked.warning and asked.warning.startswith("--compare-last could not compare") and asked.exit_code(0) == 2


def _flip_suite(root: Path) -> Path:
    """Two tasks; `tz` passes only where the pinned TZ is UTC. The gate lets any flip rate through."""
    suite = root / "tzsuite"
    for task, check in (("tz", '[ "$(date +%Z)" = UTC ]'), ("plain", "true")):
        t = suite / "tasks" / task
        (t / "repo").mkdir(parents=True)
        (t / "task.toml").write_text('must_finish = "stop"\n')
        (t / "prompt.md").write_text("Say ok.\n")
        (t / "script.json").write_text('[{"content": "ok", "finish": "stop"}]\n')
        (t / "repo" / "run_tests.sh").write_text(f"#!/bin/sh\n{check}\n")
        (t / "repo" / "run_tests.sh").chmod(0o755)
    (suite / "suite.toml").write_text(
        'name = "tzsuite"\nrepeat = 1\n[agent]\nkind = "scripted"\n[gate]\nflip_rate = 1.0\n'
    )
    (suite / "contract.json").write_text('{"contract_id": "tz.v1", "tools": []}\n')
    (suite / "tools.json").write_text('{"allow": [], "deny": []}\n')
    return suite


def _two_local_hosts(path: Path, tz_b: str) -> Path:
    import sys

    path.write_text(
        f'[defaults]\npython = "{sys.executable}"\nenv_allowlist = ["PATH", "TZ", "LANG"]\n'
        + "".join(
            f'[[hosts]]\nname = "{n}"\ntransport = "local"\nworkspace_root = "{path.parent}/roots/{n}"\n'
            f'python = "{own_machine_python(path.parent, n)}"\n'  # two machines of their own
            f'env = {{ TZ = "{tz}", LANG = "{lang}" }}\n'
            for n, tz, lang in (("a", "UTC", "C"), ("b", tz_b, "C.UTF-8"))
        )
    )
    return path


@pytest.mark.root
def test_replay_compare_last_flip_appears_and_disappears(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli import app

    suite, runs = _flip_suite(tmp_path), tmp_path / "runs"
    cli = CliRunner()
    codes, outputs = [], []
    for tz_b in ("UTC", "Asia/Tokyo", "UTC"):  # the second run introduces the flip, the third removes it
        inv = _two_local_hosts(tmp_path / "hosts.toml", tz_b)
        res = cli.invoke(app, ["replay", str(suite), "-i", str(inv), "--out", str(runs), "--compare-last"])
        codes.append(res.exit_code)
        outputs.append(res.output)
    assert codes == [0, 1, 0], outputs
    assert "newly flipping against the previous run of tzsuite: tz" in outputs[1]

    rows = history.history(runs, "tzsuite")
    assert [sorted(r.flipping) for r in rows] == [[], ["tz"], []]
    assert rows[1].pass_rate == {"a": 1.0, "b": 0.5}
    res = cli.invoke(app, ["history", "tzsuite", "--out", str(runs)])
    assert res.exit_code == 0
    second, third = res.output.split(f"{rows[1].run_id} vs ")[1], res.output.split(f"{rows[2].run_id} vs ")[1]
    assert "newly flipping: tz" in second.split(" vs ")[0]
    assert "stopped flipping: tz" in third


def test_a_subset_run_is_compared_on_the_tasks_both_runs_replayed(tmp_path: Path) -> None:
    """`replay --tasks t1` after a full run: t2's flip did not stop and its pins did not move; they
    were not measured. What both runs replayed is still compared."""
    runs = tmp_path / "runs"
    full_pins = {"t1": {"prompt_sha": "p1"}, "t2": {"prompt_sha": "p2"}, "t3": {"prompt_sha": "p3"}}
    make_run_dir(runs, "r1", started="2026-11-01T00:00:00Z", flips=("t2",), pins=full_pins)
    make_run_dir(runs, "r2", started="2026-11-02T00:00:00Z", tasks=("t1",), flips=("t1",),
                 pins={"t1": {"prompt_sha": "p1-new"}})
    history.rebuild(runs)
    prev, cur = history.history(runs)[-2:]
    assert (prev.run_id, cur.run_id) == ("r1", "r2")
    ch = run_changes.changes(prev, cur)
    assert ch.newly_flipping == ["t1"]
    assert ch.stopped_flipping == []
    assert [m["pin"] for m in ch.pins_moved] == ["t1.prompt_sha"]


def test_history_says_when_two_runs_differ_in_hosts_tasks_repeat_or_a_fingerprint(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli import app

    runs = tmp_path / "runs"
    first = make_run_dir(runs, "r1", started="2024-05-01T10:00:00Z", tasks=("t1", "t2", "t3"))
    second = make_run_dir(runs, "r2", started="2024-05-01T16:00:00Z", tasks=("t1", "t2", "t4"))
    m1, m2 = (json.loads((d / "manifest.json").read_text()) for d in (first, second))
    m1["hosts"]["local"]["python"] = "CPython 3.11.7"
    m1["repeat"] = 1
    m2["repeat"] = 3
    # the scheduled run: the same host, another interpreter (cron's PATH), another fingerprint
    m2["hosts"]["local"].update(python="CPython 3.9.2", fingerprint="f" * 16)
    m2["hosts"]["box-c"] = m2["hosts"].pop("box-b")
    r2 = json.loads((second / "report.json").read_text())
    r2["hosts"] = [{"name": "local", "fingerprint": "f" * 16, "reachable": True},
                   {"name": "box-c", "fingerprint": "c" * 16, "reachable": True}]
    for t in r2["tasks"]:
        t["verdicts"] = {"local": t["verdicts"]["local"], "box-c": t["verdicts"]["box-b"]}
    (first / "manifest.json").write_text(json.dumps(m1))
    (second / "manifest.json").write_text(json.dumps(m2))
    (second / "report.json").write_text(json.dumps(r2))
    for d in (first, second):
        history.record_run(runs, d)

    res = CliRunner().invoke(app, ["history", "--out", str(runs)], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    after = res.output.split("r2 vs r1 (triage):\n")[1].splitlines()
    assert max(len(line) for line in after) <= 80  # wrapped, continuation lines indented
    assert after == [
        "  hosts differ: + box-c; - box-b",
        "  tasks differ: + t4; - t3 (compared on the tasks both ran)",
        "  repeat differs: 1 -> 3 attempts per task",
        f"  fingerprint of local changed: {'0' * 16} -> {'f' * 16} (python",
        "  CPython 3.11.7 -> CPython 3.9.2)",
    ]
    res = CliRunner().invoke(app, ["history", "--out", str(runs), "--json"])
    changes = json.loads(res.output)[1]["changes"]
    assert changes["fingerprints_changed"] == [
        {"host": "local", "old": "0" * 16, "new": "f" * 16, "python_old": "CPython 3.11.7", "python_new": "CPython 3.9.2"}
    ]
    assert changes["repeat"] == {"old": 1, "new": 3}


def test_an_index_written_before_repeat_existed_gets_the_column(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    old = sqlite3.connect(history.index_path(runs))
    old.execute(
        "CREATE TABLE runs (run_id TEXT PRIMARY KEY, kind TEXT NOT NULL, started TEXT, finished TEXT, suite TEXT,"
        " suite_sha TEXT, pins TEXT NOT NULL, hosts TEXT NOT NULL, flip_rate REAL, valid INTEGER,"
        " pass_rate TEXT NOT NULL)"
    )
    old.close()
    run = make_run_dir(runs, "r1", started="2024-05-01T10:00:00Z")
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "repeat": 2}))
    history.record_run(runs, run)
    assert [r.repeat for r in history.history(runs)] == [2]
