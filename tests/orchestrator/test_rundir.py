"""The run directory: unique sortable ids, atomic writes, a manifest that round-trips, and the one
migration step that reads the shapes earlier versions and other tools wrote."""

from __future__ import annotations

import datetime as dt
import json
import threading
from pathlib import Path

import pytest

from agent_runner.records import Fingerprint, ResultRow
from orchestrator.errors import CrosshostError, InputError, TraceError
from orchestrator.store.jsonl import iter_results, read_jsonl
from orchestrator.store.records import HostRecord, Manifest, SuiteRef
from orchestrator.store.rundir import RunDir, load_run, new_run_id, write_json_atomic


def test_run_ids_sort_by_time_and_differ() -> None:
    early = new_run_id(dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
    late = new_run_id(dt.datetime(2025, 1, 2, 3, 4, 6, tzinfo=dt.UTC))
    assert early.startswith("20250102T030405Z-") and early < late
    assert new_run_id() != new_run_id()


def test_concurrent_creates_never_share_a_directory(tmp_path: Path) -> None:
    made: list[Path] = []
    lock = threading.Lock()

    def create() -> None:
        rd = RunDir.create(tmp_path / "runs")
        with lock:
            made.append(rd.path)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == 8


def test_explicit_existing_run_id_is_refused(tmp_path: Path) -> None:
    RunDir.create(tmp_path, run_id="r1")
    with pytest.raises(CrosshostError, match="exists already"):
        RunDir.create(tmp_path, run_id="r1")


def test_manifest_round_trip_keeps_retries_and_errors(tmp_path: Path) -> None:
    rd = RunDir.create(tmp_path)
    m = Manifest(
        run_id=rd.run_id,
        started="2025-01-01T00:00:00Z",
        suite=SuiteRef(name="triage", sha="ab" * 32, path="/s"),
        reference="local",
        crosshost_version="0.1.0",
        retries=[{"host": "box-b", "attempt": 1, "error": "connection refused", "wait_s": 0.5}],
        hosts={
            "local": HostRecord(reachable=True, fingerprint="0" * 16, workspace_removed=True),
            "box-b": HostRecord(reachable=False, error="box-b: HostUnreachable: refused"),
        },
    )
    rd.write_manifest(m)
    raw = json.loads(rd.manifest_path.read_text())
    assert raw["schema"] == "crosshost.manifest/2" and raw["kind"] == "replay"
    back = rd.read_manifest()
    assert back == m
    assert back.retries[0]["error"] == "connection refused"
    assert back.hosts["box-b"].error and not back.hosts["box-b"].reachable


def test_atomic_write_leaves_old_content_when_serialising_fails(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    write_json_atomic(target, {"ok": 1})
    with pytest.raises(TypeError):
        write_json_atomic(target, {"bad": object()})
    assert json.loads(target.read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_host_dir_refuses_path_like_names(tmp_path: Path) -> None:
    rd = RunDir.create(tmp_path)
    assert rd.host_dir("box-b") == rd.path / "hosts" / "box-b"
    for bad in ["../x", "a/b", ".hidden", ""]:
        with pytest.raises(CrosshostError):
            rd.host_dir(bad)


def test_read_jsonl_names_the_bad_line(tmp_path: Path) -> None:
    p = tmp_path / "results.jsonl"
    p.write_text('{"a": 1}\n\nnot json\n')
    with pytest.raises(TraceError, match=r"results.jsonl:3"):
        read_jsonl(p)
    assert read_jsonl(tmp_path / "missing.jsonl") == []


def test_a_directory_without_a_manifest_is_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"manifest\.json: missing; is .* a crosshost run directory"):
        RunDir(tmp_path).read_manifest()
    (tmp_path / "manifest.json").write_text('{"run_id": "r", "repeat": "twice"}')
    with pytest.raises(InputError, match=r"manifest\.json: repeat: "):
        RunDir(tmp_path).read_manifest()


_DAMAGED = b'{"task": "t1", "env": "a", "verdict": "pass"}\n\n\xff\xfe\n[1, 2]\nnot json\n{"task": "t2", "env": "a", "verdict": "fail"}\n'


def test_one_jsonl_reader_strict_and_tolerant(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"run_id": "r", "hosts": {"a": {}}}))
    (run / "results.jsonl").write_bytes(_DAMAGED)
    # strict readers stop at the first bad line, naming file and line
    with pytest.raises(TraceError, match=r"results\.jsonl:3: not UTF-8 text"):
        read_jsonl(run / "results.jsonl")
    with pytest.raises(TraceError, match=r"results\.jsonl:3: not UTF-8 text"):
        list(iter_results(run / "results.jsonl"))
    # the tolerant run-dir reader keeps the good rows and names every bad line
    rundir = load_run(run)
    assert sorted(rundir.results()) == [("a", "t1", 0), ("a", "t2", 0)]
    assert rundir.problems == [
        f"{run / 'results.jsonl'}:3: not UTF-8 text",
        f"{run / 'results.jsonl'}:4: expected a JSON object",
        f"{run / 'results.jsonl'}:5: not JSON (Expecting value)",
    ]


def test_history_names_a_damaged_results_file(tmp_path: Path) -> None:
    from orchestrator.errors import InputError
    from orchestrator.store import run_row

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"run_id": "r1", "hosts": ["a"]}))
    report = {"run_id": "r1", "valid": True, "gate": 0.1, "flip_rate": 0.0, "tasks": []}
    (run / "report.json").write_text(json.dumps(report))  # no verdicts: results count
    (run / "results.jsonl").write_bytes(_DAMAGED.replace(b"\xff\xfe", b""))
    with pytest.raises(InputError, match=r"results\.jsonl:4: expected a JSON object"):
        run_row.read_run(run)


# --- the one migration step: shapes other tools and earlier versions wrote ------------------------------


def test_a_schema_1_manifest_reads_as_today(tmp_path: Path) -> None:
    """/1 called the zipapp's digest ``runner_sha``, and so did the pins for the runner's sources."""
    (tmp_path / "manifest.json").write_text(json.dumps({
        "schema": "crosshost.manifest/1", "run_id": "r1", "started": "2025-01-01T00:00:00Z",
        "suite": {"name": "triage", "sha": "s" * 64, "path": "/s"}, "runner_sha": "z" * 64,
        "pins": {"t1": {"runner_sha": "r" * 64, "prompt_sha": "p"}}, "reference": "local",
        "crosshost_version": "0.1.0", "hosts": {"local": {"reachable": True}},
    }))  # fmt: skip
    m = RunDir(tmp_path).read_manifest()
    assert m.schema_ == "crosshost.manifest/2" and m.zipapp_sha == "z" * 64
    assert m.pins == {"t1": {"runner_source_sha": "r" * 64, "prompt_sha": "p"}}


def test_foreign_manifest_shapes_are_migrated(tmp_path: Path) -> None:
    run = tmp_path / "r9"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({
        "suite": "triage", "suite_sha": "s" * 16, "gate": {"flip_rate": 0.25},
        "hosts": ["local", {"name": "box-b", "reachable": False}], "inventory": [{"name": "box-c"}],
        "started": 1735689600,
    }))  # fmt: skip
    m = RunDir(run).read_manifest()
    assert (m.run_id, m.suite, m.gate) == ("r9", SuiteRef(name="triage", sha="s" * 16), 0.25)
    assert list(m.hosts) == ["local", "box-b"] and m.hosts["box-b"].reachable is False
    assert m.started == "2025-01-01T00:00:00.000000Z"
    assert load_run(run).hosts == ["local", "box-b", "box-c"]


def test_results_rows_of_other_tools_are_migrated(tmp_path: Path) -> None:
    """Rows other tools write: ``host`` for ``env``, ``passed`` (bool or 0/1) for ``verdict``, no attempt."""
    path = tmp_path / "results.jsonl"
    path.write_text('{"task": "a", "host": "x", "passed": true}\n{"task": "a", "env": "y", "passed": 0}\n')
    rows = [row for _, row in iter_results(path)]
    assert [(r.task, r.env, r.attempt, r.verdict) for r in rows] == [("a", "x", 0, "pass"), ("a", "y", 0, "fail")]
    assert rows[0].to_json()["passed"] is True and rows[1].to_json()["verdict"] == "fail"


def test_foreign_fingerprint_shapes_are_migrated(tmp_path: Path) -> None:
    """Other tools wrote the digest as ``id``/``digest``/``sha``/``env_sha`` and python as an object."""
    for key in ("id", "digest", "sha", "env_sha"):
        fp = Fingerprint.from_json({key: "a" * 16, "python": {"implementation": "CPython", "version": "3.11.2"}})
        assert (fp.fingerprint, fp.python) == ("a" * 16, "CPython 3.11.2")
        assert key not in fp.to_json()
    host_dir = tmp_path / "hosts" / "box-b"
    host_dir.mkdir(parents=True)
    (host_dir / "fingerprint.json").write_text(json.dumps({"id": "b" * 16, "hostname": "box-b", "os": "linux"}))
    fp, problem = RunDir(tmp_path).read_fingerprint("box-b")
    assert problem is None and fp is not None and fp.fingerprint == "b" * 16
    assert fp.to_json()["os"] == "linux"  # a field this version does not know is kept, not dropped


def test_results_round_trip_through_the_record(tmp_path: Path) -> None:
    rd = RunDir.create(tmp_path)
    row = ResultRow(task="t1", env="box-b", attempt=1, verdict="error", reason="box-b: HostUnreachable", run_id="r")
    rd.write_results([row])
    [(where, back)] = list(rd.iter_results())
    assert back == row and where.endswith("results.jsonl:1")
    assert "why" not in json.loads(rd.results_path.read_text())  # a row the controller made has no why


def test_trace_files_lists_what_globbing_and_sorting_paths_listed(tmp_path: Path) -> None:
    """The traces, read by name from the directory: the same keys and paths, in the same order, as
    ``sorted(traces.glob("*.jsonl"))`` gave (the plain way, kept here as the reference)."""
    run = RunDir(tmp_path / "run")
    names = ["b.1.jsonl", "a.10.jsonl", "a.2.jsonl", "A.0.jsonl", ".hidden.0.jsonl", "t.0.obs.jsonl",
             "no-attempt.jsonl", "t.x.jsonl", "t.0.JSONL", "café.0.jsonl", "t.0.jsonl.tmp", "dir.0.jsonl"]
    for host in ("box-b", "box-a"):
        traces = run.path / "hosts" / host / "traces"
        traces.mkdir(parents=True)
        for name in names:
            if name.startswith("dir."):
                (traces / name).mkdir()
            else:
                (traces / name).write_text("{}\n")
    (run.path / "hosts" / "box-c").mkdir()  # no traces directory
    (run.path / "hosts" / "box-d" / "traces").parent.mkdir()
    (run.path / "hosts" / "box-d" / "traces").write_text("a file, not a directory")

    def plain() -> list[tuple[tuple[str, str, int], Path]]:
        out = []
        for host in run.hosts_on_disk():
            traces = run.path / "hosts" / host / "traces"
            if not traces.is_dir():
                continue
            for trace in sorted(traces.glob("*.jsonl")):
                task, _, attempt = trace.name[: -len(".jsonl")].rpartition(".")
                if task and attempt.isdigit():
                    out.append(((host, task, int(attempt)), trace))
        return out

    got = list(run.trace_files())
    assert got == plain()
    assert [k for k, _ in got][:3] == [("box-a", ".hidden", 0), ("box-a", "A", 0), ("box-a", "a", 10)]
