"""iter_records' fast path answers exactly as ``json.loads(line.strip())`` on every kind of line."""

from __future__ import annotations

import json
from pathlib import Path

from agent_runner.trace import iter_records

LINES = [
    '{"type": "turn", "step": 1}\n',
    '   {"type": "indented"}\t\n',  # leading whitespace: json.loads would refuse it unstripped
    '{"type": "form-feed after"}\x0c\n',  # str.strip removes it, JSON whitespace does not include it
    '{"type": "crlf"}\r\n',
    "\n",
    "   \n",
    '{"a": 1} {"b": 2}\n',  # trailing data
    '{"a": 1} x\n',
    "[1, 2]\n",
    "12 \n",
    "1.5e\n",
    "NaN\n",
    '"just a string"\n',
    "\ufeff{}\n",  # a BOM in the middle of a file
    '{"cut": "off\n',
    '{"dup": 1, "dup": 2}\n',
    '{"type": "last line", "no": "newline"}',
]


def _expected(lines: list[str]) -> list[tuple[int, dict[str, object]]]:
    out: list[tuple[int, dict[str, object]]] = []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        try:
            record = json.loads(text)
        except ValueError as exc:
            out.append((number, {"type": "corrupt", "error": f"not JSON ({exc.args[0]})", "text": text[:200]}))
            continue
        if not isinstance(record, dict):
            out.append((number, {"type": "corrupt", "error": f"a JSON {type(record).__name__}, not an object",
                                 "text": text[:200]}))
            continue
        out.append((number, record))
    return out


def test_every_kind_of_line_reads_as_json_loads_of_the_stripped_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(LINES), encoding="utf-8", newline="")
    got = list(iter_records(path))
    assert [repr(r) for r in got] == [repr(r) for r in _expected(LINES)]  # repr: NaN != NaN
    kinds = {n: r.get("type") for n, r in got}
    assert kinds[2] == "indented" and kinds[3] == "form-feed after" and kinds[4] == "crlf"
    assert kinds[7] == kinds[9] == kinds[14] == "corrupt"
    assert "Extra data" in str(dict(got)[7]["error"])


def test_iter_trace_streams_typed_records_migrated_with_damage_as_corrupt_lines(tmp_path: Path) -> None:
    from agent_runner.records import TraceFinish, TraceHeader, TraceTurn
    from agent_runner.trace import CorruptLine, iter_trace

    path = tmp_path / "t.0.jsonl"
    path.write_text("\n".join([
        json.dumps({"type": "header", "schema": "crosshost.trace/1", "run_id": "r", "host": "h", "task": "t",
                    "attempt": 0, "fingerprint": "f", "pins": {"runner_sha": "abc"}}),
        json.dumps({"type": "turn", "step": 1, "tool": "lookup", "args": {"q": "x"}, "args_fp": "a", "obs_fp": "o"}),
        "{not json",
        json.dumps({"type": "obs", "step": 1, "content": "x"}),
        json.dumps({"type": "finish", "reason": "stop", "final": "", "predicate_exit": 0, "verdict": "pass",
                    "why": "ok", "wall_ms": 5, "usage": {"n": 1}}),
    ]) + "\n")
    records = list(iter_trace(path))
    assert [(n, type(r)) for n, r in records] == [
        (1, TraceHeader), (2, TraceTurn), (3, CorruptLine), (5, TraceFinish)
    ]  # fmt: skip
    header, turn, corrupt, finish = (r for _, r in records)
    assert isinstance(header, TraceHeader) and header.pins == {"runner_source_sha": "abc"}
    assert isinstance(turn, TraceTurn) and (turn.tool, turn.args) == ("lookup", {"q": "x"})
    assert isinstance(corrupt, CorruptLine) and corrupt.error.startswith("not JSON")
    assert isinstance(finish, TraceFinish) and finish.verdict == "pass" and finish.extra == {"usage": {"n": 1}}


def test_file_evidence_is_read_back_as_written_and_a_damaged_file_is_named(tmp_path: Path) -> None:
    import pytest

    from agent_runner.errors import TraceError
    from agent_runner.filetrace import write_evidence
    from agent_runner.records import EvidenceCut, FileEvidence

    target = tmp_path / "out" / "files" / "t.0.json"
    cut = {"agent": EvidenceCut(dropped=3, under={"/usr/lib": 3})}
    write_evidence(target, traced=True, paths={"/etc/x": ["openat"]}, agent_paths={}, env_path="/usr/bin", cut=cut)
    written = json.loads(target.read_text())
    assert written["cut"] == {"agent": {"dropped": 3, "under": {"/usr/lib": 3}}}
    read = FileEvidence.from_json(written)
    assert read == FileEvidence(traced=True, paths={"/etc/x": ["openat"]}, env_path="/usr/bin", cut=cut)
    untraced = FileEvidence.from_json({"traced": False, "why": "no strace", "env_path": None})
    assert (untraced.traced, untraced.why) == (False, "no strace")
    with pytest.raises(TraceError, match="files/t.0.json: file evidence 'paths' is not an object"):
        FileEvidence.from_json({"traced": True, "paths": ["/etc/x"]}, "files/t.0.json")
