"""The run directory: unique sortable ids, atomic writes, a manifest that round-trips."""

from __future__ import annotations

import datetime as dt
import json
import threading
from pathlib import Path

import pytest

from orchestrator.errors import CrosshostError, TraceError
from orchestrator.store import (
    HostRecord,
    Manifest,
    RunDir,
    SuiteRef,
    load_manifest,
    new_run_id,
    read_jsonl,
    write_json_atomic,
)


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
    assert raw["schema"] == "crosshost.manifest/1" and raw["kind"] == "replay"
    back = load_manifest(rd.path)
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


def test_load_manifest_missing(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no manifest"):
        load_manifest(tmp_path)


_DAMAGED = b'{"task": "t1", "env": "a", "verdict": "pass"}\n\n\xff\xfe\n[1, 2]\nnot json\n{"task": "t2", "env": "a", "verdict": "fail"}\n'


def test_one_jsonl_reader_strict_and_tolerant(tmp_path: Path) -> None:
    from orchestrator.analysis.flips import iter_results
    from orchestrator.analysis.rundir import load_run

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
    from orchestrator import history
    from orchestrator.errors import InputError

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"run_id": "r1", "hosts": ["a"]}))
    (run / "report.json").write_text(json.dumps({"run_id": "r1", "tasks": []}))  # no verdicts: results count
    (run / "results.jsonl").write_bytes(_DAMAGED.replace(b"\xff\xfe", b""))
    with pytest.raises(InputError, match=r"results\.jsonl:4: expected a JSON object"):
        history.read_run(run)
