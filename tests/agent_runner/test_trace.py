"""Reading traces never crashes on a damaged line; writing redacts first."""

from __future__ import annotations

import hashlib
import json
import tracemalloc
from pathlib import Path

import pytest

from agent_runner.errors import TraceError
from agent_runner.trace import CorruptLine, TraceWriter, fp, iter_observations, iter_records, read_trace


def _write_trace(path: Path) -> None:
    with TraceWriter(path) as writer:
        writer.header(run_id="r", host="h", task="t", attempt=0, fingerprint="f" * 16, pins={"budget": {}})
        writer.turn(tool="lookup", args={"q": "a"}, observation="found", error=None)
        writer.turn(tool="lookup", args={"q": "b"}, observation="error: no", error="no")
        writer.finish(reason="stop", final="done", predicate_exit=None, verdict="pass", why="ok", wall_ms=3)


def test_fp_is_the_first_12_hex_of_sha256_of_sorted_json() -> None:
    obj = {"b": 1, "a": [1, "x"]}
    assert fp(obj) == hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]
    assert fp({"a": [1, "x"], "b": 1}) == fp(obj)


def test_written_trace_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "t.0.jsonl"
    _write_trace(path)
    trace = read_trace(path)
    assert trace.problems == []
    assert trace.header is not None and trace.header["schema"] == "crosshost.trace/2"
    assert [(t.step, t.args) for t in trace.turns] == [(1, {"q": "a"}), (2, {"q": "b"})]
    assert trace.turns[0].args_fp == fp({"q": "a"}) and trace.turns[0].obs_fp == fp("found")
    assert trace.finish is not None and trace.finish["verdict"] == "pass"


def test_corrupt_lines_become_problems_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    _write_trace(path)
    lines = path.read_text().splitlines()
    lines.insert(2, '{"type": "turn", "step": 2, "tool": "lookup", "ar')  # cut mid-write
    lines.insert(3, "[1, 2]")
    path.write_text("\n".join(lines[:-1]) + "\n")  # and the finish record is lost
    kinds = [r["type"] for _, r in iter_records(path)]
    assert kinds == ["header", "turn", "corrupt", "corrupt", "turn"]
    trace = read_trace(path)
    assert len(trace.turns) == 2
    assert any(p.startswith(f"{path}:3: not JSON") for p in trace.problems)
    assert any(p.startswith(f"{path}:4: a JSON list") for p in trace.problems)
    assert any("no finish record" in p for p in trace.problems)


def test_seed_json_form_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "seed.json"
    path.write_text(json.dumps({"tool_calls": [
        {"name": "add_label", "args": {"repo": "r", "issue_id": 1, "label": "bug"}},
        {"name": "open", "arguments": "{\"x\": 1}"},
    ]}, indent=2))
    trace = read_trace(path)
    assert trace.form == "seed" and trace.problems == []
    assert [(t.step, t.tool, t.args) for t in trace.turns] == [
        (1, "add_label", {"repo": "r", "issue_id": 1, "label": "bug"}), (2, "open", {"x": 1})]


@pytest.mark.parametrize("content", ["", "hello\nworld\n", '{"a": 1}\n', "[]"])
def test_not_a_trace_raises_trace_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError, match="not a trace"):
        read_trace(path)


def test_unreadable_trace_raises_trace_error_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="missing.jsonl"):
        read_trace(tmp_path / "missing.jsonl")


def test_iter_records_streams_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    line = json.dumps({"type": "turn", "step": 1, "tool": "t", "args": {"k": "v" * 40}}) + "\n"
    with open(path, "w") as handle:
        handle.write(line * 20_000)  # ~1.7 MB: the file whole, or its records as a list, would pass the bound
    tracemalloc.start()
    count = sum(1 for _ in iter_records(path))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count == 20_000
    assert peak < 1_000_000


def test_writer_redacts_before_writing(tmp_path: Path) -> None:
    path, obs = tmp_path / "t.jsonl", tmp_path / "t.obs.jsonl"
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----"
    with TraceWriter(path, obs) as writer:
        writer.header(run_id="r", host="h", task="t", attempt=0, fingerprint="f", pins={})
        writer.turn(tool="x", args={"token": "plain-value", "note": "AKIAABCDEFGHIJKLMNOP"},
                    observation=f"key:\n{pem}", error=None, prompt_tokens=5)
        writer.finish(reason="stop", final="sk-ant-0123456789abcdefXYZ", predicate_exit=0, verdict="pass",
                      why="ok", wall_ms=1)
    text = path.read_text() + obs.read_text()
    for secret in ("plain-value", "AKIAABCDEFGHIJKLMNOP", "abc\n", "BEGIN OPENSSH", "sk-ant-0123"):
        assert secret not in text
    turn = read_trace(path).turns[0]
    assert turn.args == {"token": "[REDACTED]", "note": "[REDACTED]"} and turn.prompt_tokens == 5


def test_a_schema_1_trace_reads_as_today(tmp_path: Path) -> None:
    """Trace /1 named the runner's source digest ``pins.runner_sha``; it reads as ``runner_source_sha``."""
    path = tmp_path / "t.0.jsonl"
    header = {"type": "header", "schema": "crosshost.trace/1", "run_id": "r", "host": "h", "task": "t",
              "attempt": 0, "fingerprint": "f" * 16, "pins": {"runner_sha": "s" * 64}}
    finish = {"type": "finish", "reason": "stop", "final": "", "predicate_exit": None, "verdict": "pass",
              "why": "ok", "wall_ms": 1}
    path.write_text(json.dumps(header) + "\n" + json.dumps(finish) + "\n")
    trace = read_trace(path)
    assert trace.problems == []
    assert trace.header is not None and trace.header["pins"] == {"runner_source_sha": "s" * 64}


def test_an_unknown_trace_schema_is_a_problem_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "t.0.jsonl"
    _write_trace(path)
    lines = path.read_text().splitlines()
    lines[0] = lines[0].replace("crosshost.trace/2", "crosshost.trace/9")
    path.write_text("\n".join(lines) + "\n")
    assert read_trace(path).problems == [f"{path}:1: schema 'crosshost.trace/9', expected 'crosshost.trace/2'"]


def test_records_read_back_what_they_write(tmp_path: Path) -> None:
    from agent_runner.records import Fingerprint, ResultRow, TraceFinish, TraceHeader, TraceTurn

    path = tmp_path / "t.0.jsonl"
    _write_trace(path)
    header, first, _, finish = (record for _, record in iter_records(path))
    assert TraceHeader.from_json(header).to_json() == header
    assert TraceTurn.from_json(first).to_json() == first
    assert TraceFinish.from_json(finish).to_json() == finish
    row = ResultRow(task="t", env="h", attempt=0, verdict="pass", reason="stop", run_id="r", why="ok")
    assert ResultRow.from_json(row.to_json()) == row
    fingerprint = Fingerprint(fingerprint="a" * 16, hostname="h", python="CPython 3.11.2", extra={"new": 1})
    assert Fingerprint.from_json(fingerprint.to_json()) == fingerprint


def test_the_observation_sidecar_reads_back_typed(tmp_path: Path) -> None:
    trace, obs = tmp_path / "t.0.jsonl", tmp_path / "t.0.obs.jsonl"
    with TraceWriter(trace, obs) as w:
        w.header(run_id="r", host="h", task="t", attempt=0, fingerprint="f" * 16, pins={})
        w.turn(tool="read", args={"path": "a"}, observation="hello", error=None)
        w.finish(reason="stop", final="", predicate_exit=0, verdict="pass", why="ok", wall_ms=1)
    with obs.open("a") as f:  # what another tool may add: a non-text content, another type, damage
        f.write(json.dumps({"type": "obs", "step": 2, "tool": "ls", "content": ["a", "b"]}) + "\n")
        f.write(json.dumps({"type": "note", "step": 3}) + "\n{not json\n")
    got = list(iter_observations(obs))
    assert [r for _, r in got[:2]] == [
        {"type": "obs", "step": 1, "tool": "read", "content": "hello"},
        {"type": "obs", "step": 2, "tool": "ls", "content": '["a", "b"]'},
    ]
    assert len(got) == 3 and got[2][0] == 4 and isinstance(got[2][1], CorruptLine)  # line 4: the damage


def test_the_observation_sidecar_is_made_with_the_first_turn_only(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # A predicate-only attempt has no turns: no sidecar is made (nor announced), so none comes home;
    # an attempt with turns gets its sidecar, announced with the digest of what it holds.
    from agent_runner import paced

    out = tmp_path / "out"
    (out / "traces").mkdir(parents=True)
    none_trace, none_obs = out / "traces" / "p.0.jsonl", out / "traces" / "p.0.obs.jsonl"
    turn_trace, turn_obs = out / "traces" / "s.0.jsonl", out / "traces" / "s.0.obs.jsonl"
    with TraceWriter(none_trace, none_obs, announce_under=out) as w:
        w.header(run_id="r", host="h", task="p", attempt=0, fingerprint="f" * 16, pins={})
        w.finish(reason="stop", final="", predicate_exit=0, verdict="pass", why="ok", wall_ms=1)
    with TraceWriter(turn_trace, turn_obs, announce_under=out) as w:
        w.header(run_id="r", host="h", task="s", attempt=0, fingerprint="f" * 16, pins={})
        w.turn(tool="read", args={"path": "a"}, observation="hello", error=None)
        w.finish(reason="stop", final="", predicate_exit=None, verdict="pass", why="ok", wall_ms=1)
    paced.flush_all()
    announced = {line.split()[2]: line.split()[1] for line in capfd.readouterr().out.splitlines()}
    assert not none_obs.exists() and "traces/p.0.obs.jsonl" not in announced
    assert announced["traces/p.0.jsonl"] == hashlib.sha256(none_trace.read_bytes()).hexdigest()
    assert announced["traces/s.0.obs.jsonl"] == hashlib.sha256(turn_obs.read_bytes()).hexdigest()
    assert [r for _, r in iter_observations(turn_obs)] == [{"type": "obs", "step": 1, "tool": "read", "content": "hello"}]
