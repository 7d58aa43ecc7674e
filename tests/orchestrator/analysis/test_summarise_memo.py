"""The analysis' per-run memo: every trace is summarised as if it were read alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_runner.trace import iter_records
from orchestrator.analysis import analyse_run
from orchestrator.analysis.attempts import TraceSummariser, iter_steps, summarise_trace
from orchestrator.analysis.shapes import ShapeHasher, args_differences, step_of
from orchestrator.analysis.task_report import MAX_ARGS_DIFFS
from tests.support.rundirs import CONTRACT, Attempt, RunSpec, build_run, two_hosts

LEAKY = ("read_unit_status", {"unit": "nginx.service", "note": "copied from box-b:/root/.cache"})


def _spec(**attempts: Attempt) -> RunSpec:
    keys = {"local_t1": ("local", "t1", 0), "box_b_t1": ("box-b", "t1", 0),
            "local_t2": ("local", "t2", 0), "box_b_t2": ("box-b", "t2", 0)}
    return RunSpec(hosts=two_hosts(), attempts={keys[k]: a for k, a in attempts.items()})


def _trace(run: Path, host: str, task: str) -> Path:
    return run / "hosts" / host / "traces" / f"{task}.0.jsonl"


def test_a_leak_repeated_in_every_trace_of_a_run_is_found_in_each_at_its_step(tmp_path: Path) -> None:
    clean = ("read_unit_status", {"unit": "nginx.service"})
    run = build_run(tmp_path, _spec(
        local_t1=Attempt("pass", calls=[clean, LEAKY]), box_b_t1=Attempt("pass", calls=[LEAKY, clean, LEAKY]),
        local_t2=Attempt("pass", calls=[clean] * 3 + [LEAKY]), box_b_t2=Attempt("pass", calls=[clean])))
    report = analyse_run(run)
    leaks = {(t.task, leak.host, leak.step, leak.kind) for t in report.tasks for leak in t.leaks}
    for task, host, step in [("t1", "local", 2), ("t1", "box-b", 1), ("t1", "box-b", 3), ("t2", "local", 4)]:
        assert {(task, host, step, kind) for kind in ("hostname", "absolute_local_path", "home_directory")} <= leaks
    assert not any(host == "box-b" and task == "t2" for task, host, _, _ in leaks)
    assert {t.task: t.verdicts for t in report.tasks}["t1"] == {"local": ["fail"], "box-b": ["fail"]}


def _hashes_one_step_at_a_time(path: Path) -> tuple[str, str, int]:
    """The reference: a Step per turn, as the analysis hashed shapes before it memoised them."""
    hasher = ShapeHasher()
    for _, record in iter_records(path):
        step = step_of(record) if record.get("type") == "turn" else None
        if step is not None:
            hasher.add(step)
    return hasher.shape_hash, hasher.values_hash, hasher.steps


def test_shape_hash_is_the_per_step_hash_and_value_types_are_never_conflated(tmp_path: Path) -> None:
    # 1 == 1.0 == True as dict keys: a memo keyed on values alone would give these one shape
    as_int = [("read_unit_status", {"unit": "a", "n": 1})] * 3
    as_bool = [("read_unit_status", {"unit": "a", "n": True})] * 3
    as_float = [("read_unit_status", {"unit": "a", "n": 1.0})] * 3
    many = [("read_unit_status", {"unit": f"u{i % 7}", "nested": [i % 2]}) for i in range(2500)]
    run = build_run(tmp_path, _spec(local_t1=Attempt("pass", calls=as_int), box_b_t1=Attempt("pass", calls=as_bool),
                                    local_t2=Attempt("pass", calls=as_float), box_b_t2=Attempt("pass", calls=many)))
    summariser = TraceSummariser(CONTRACT, [])
    summaries = {}
    for host, task in [("local", "t1"), ("box-b", "t1"), ("local", "t2"), ("box-b", "t2")]:
        path = _trace(run, host, task)
        summaries[(host, task)] = s = summariser.summarise(path, host, task, 0)
        assert (s.shape_hash, s.values_hash, s.steps) == _hashes_one_step_at_a_time(path)
    assert len({summaries[k].shape_hash for k in [("local", "t1"), ("box-b", "t1"), ("local", "t2")]}) == 3
    report = analyse_run(run)
    assert {t.task: t.classification for t in report.tasks}["t1"] == "unstable_contract"


def test_a_shared_summariser_equals_one_per_trace(tmp_path: Path) -> None:
    calls: list[tuple[str, dict[str, Any]]] = [LEAKY, ("restart_unit", {"unit": "x", "ssh_identity": "k"}),
                                               ("delete_everything", {}), ("http_get_health", {"url": 5})]
    run = build_run(tmp_path, _spec(local_t1=Attempt("pass", calls=calls * 5),
                                    box_b_t1=Attempt("pass", calls=list(reversed(calls)) * 5)))
    fingerprints = list(two_hosts().values())
    shared = TraceSummariser(CONTRACT, [f.to_json() for f in fingerprints if f])
    for host in ("local", "box-b"):
        path = _trace(run, host, "t1")
        alone = summarise_trace(path, host, "t1", 0, CONTRACT, [f.to_json() for f in fingerprints if f])
        assert shared.summarise(path, host, "t1", 0) == alone
        assert alone.n_findings == 5 * 5 and alone.n_leaks == 5 * 3  # per round: 3 leaks, forbidden, unknown


def test_args_diff_lists_the_first_differing_values_in_order_as_args_differences_does(tmp_path: Path) -> None:
    ref_calls = [("read_unit_status", {"unit": f"u{i}"}) for i in range(200)]
    # values differ at every 7th step, more often than the report keeps
    other_calls = [("read_unit_status", {"unit": f"u{i}" if i % 7 else f"moved{i}"}) for i in range(200)]
    run = build_run(tmp_path, _spec(local_t1=Attempt("pass", calls=ref_calls),
                                    box_b_t1=Attempt("pass", calls=other_calls)))
    report = analyse_run(run)
    t1 = next(t for t in report.tasks if t.task == "t1")
    expected = args_differences(iter_steps(_trace(run, "local", "t1")), iter_steps(_trace(run, "box-b", "t1")))
    assert len(expected) > MAX_ARGS_DIFFS
    assert [(d.step, d.reference_args_fp, d.args_fp) for d in t1.args_diff] == [
        (o.step, r.args_fp, o.args_fp) for r, o in expected[:MAX_ARGS_DIFFS]]
    assert [d.step for d in t1.args_diff][:3] == [1, 8, 15]
