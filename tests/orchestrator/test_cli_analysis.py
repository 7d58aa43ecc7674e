"""The analysis commands: flips (the attempt-paired table), check, report, diff."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from typer.testing import CliRunner

from orchestrator.cli import app
from tests.support.rundirs import (
    CONTRACT,
    HEALTHY,
    Attempt,
    RunSpec,
    build_run,
    fingerprint,
    two_hosts,
)

runner = CliRunner()

FOREIGN_ROWS = [
    ("restart-nginx-only", True, True),
    ("read-status", True, True),
    ("health-check", True, True),
    ("rotate-logs", True, False),
    ("label-issue", False, False),
    ("close-stale", True, True),
]


def _foreign_results(path, rows=FOREIGN_ROWS):
    """A results.jsonl as other tools write it: ``passed`` and no ``verdict``. ``flips`` reads it through
    the one migration step (``agent_runner.records.migrate_result_row``); crosshost's own rows are
    ``agent_runner.records.ResultRow``."""
    lines = []
    for task, a, b in rows:
        for env, passed in (("laptop", a), ("ci-box", b)):
            lines.append(
                json.dumps(
                    {
                        "run_id": "r1",
                        "task": task,
                        "env": env,
                        "env_sha": "0" * 16,
                        "attempt": 0,
                        "exit_code": 0 if passed else 1,
                        "passed": passed,
                        "wall_ms": 10,
                    }
                )
            )
    path.write_text("\n".join(lines) + "\n")
    return path


def test_flips_prints_the_seed_layout_and_exits_1_above_the_gate(tmp_path):
    results = _foreign_results(tmp_path / "results.jsonl")
    out = runner.invoke(app, ["flips", str(results), "laptop", "ci-box"])
    assert out.exit_code == 1
    assert out.output == (
        "close-stale pass pass\n"
        "health-check pass pass\n"
        "label-issue fail fail\n"
        "read-status pass pass\n"
        "restart-nginx-only pass pass\n"
        "rotate-logs pass fail <- flip\n"
        "tasks=6 flips=1 flip_rate=0.167 gate=0.10\n"
    )


def test_flips_within_the_gate_exits_0(tmp_path):
    results = _foreign_results(tmp_path / "results.jsonl")
    out = runner.invoke(app, ["flips", str(results), "laptop", "ci-box", "--gate", "0.2"])
    assert out.exit_code == 0
    assert out.output.splitlines()[-1] == "tasks=6 flips=1 flip_rate=0.167 gate=0.20"


def test_flips_at_the_gate_is_within_it(tmp_path):
    rows = [(f"t{i}", True, i != 0) for i in range(10)]  # 1 flip in 10 tasks: flip_rate == gate
    out = runner.invoke(app, ["flips", str(_foreign_results(tmp_path / "r.jsonl", rows)), "laptop", "ci-box"])
    assert out.output.splitlines()[-1] == "tasks=10 flips=1 flip_rate=0.100 gate=0.10"
    assert out.exit_code == 0


def test_flips_picks_the_attempt_and_counts_errors_apart(tmp_path):
    rows = [
        {"task": "a", "env": "x", "attempt": 0, "passed": True},
        {"task": "a", "env": "y", "attempt": 0, "passed": True},
        {"task": "a", "env": "x", "attempt": 1, "passed": True},
        {"task": "a", "env": "y", "attempt": 1, "passed": False},
        {"task": "b", "env": "x", "attempt": 1, "passed": 1},  # another tool's 0/1
        {"task": "b", "env": "y", "attempt": 1, "passed": False, "verdict": "error"},
    ]
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = runner.invoke(app, ["flips", str(results), "x", "y", "--attempt", "1", "--gate", "0.5"])
    assert out.output.splitlines() == [
        "a pass fail <- flip",
        "b pass error",
        "tasks=2 flips=1 flip_rate=1.000 gate=0.50 errors=1",
    ]
    assert out.exit_code == 1


def test_flips_bad_line_exits_2_naming_file_and_line(tmp_path):
    results = _foreign_results(tmp_path / "results.jsonl")
    with results.open("a") as fh:
        fh.write('{"task": "x", "env": "laptop", "passed": \n')
    out = runner.invoke(app, ["flips", str(results), "laptop", "ci-box"])
    assert out.exit_code == 2
    assert f"{results}:13: not JSON" in out.output


def test_flips_row_without_a_verdict_exits_2(tmp_path):
    results = tmp_path / "r.jsonl"
    results.write_text('{"task": "a", "env": "x", "passed": true}\n{"task": "a", "env": "y"}\n')
    out = runner.invoke(app, ["flips", str(results), "x", "y"])
    assert out.exit_code == 2
    assert f"{results}:2: row has neither 'verdict' nor a boolean 'passed'" in out.output


def test_flips_refuses_two_rows_for_one_task_env_and_attempt_naming_both_lines(tmp_path):
    results = tmp_path / "r.jsonl"
    results.write_text(
        '{"task": "a", "env": "x", "attempt": 0, "passed": true}\n'
        '{"task": "a", "env": "y", "attempt": 0, "passed": true}\n'
        '{"task": "a", "env": "x", "attempt": 1, "passed": false}\n'
        '{"task": "a", "env": "x", "attempt": 0, "passed": false}\n'
    )
    out = runner.invoke(app, ["flips", str(results), "x", "y"])
    assert out.exit_code == 2
    assert out.output == (
        f"TraceError: {results}:4: task 'a' env 'x' attempt 0 again (first at {results}:1); "
        "keep one row per task, env and attempt\n"
    )
    # another attempt of the same task and env is not a duplicate
    ok = runner.invoke(app, ["flips", str(results), "x", "y", "--attempt", "1"])
    # refused it is not; y has no attempt 1, so nothing is comparable and the gate is not passed
    assert ok.exit_code == 1 and "no task comparable" in ok.output, ok.output


def test_flips_unknown_env_exits_2(tmp_path):
    results = _foreign_results(tmp_path / "results.jsonl")
    out = runner.invoke(app, ["flips", str(results), "laptop", "nope"])
    assert out.exit_code == 2
    assert "no rows for env 'nope'" in out.output and "ci-box, laptop" in out.output


def _check_files(tmp_path, args):
    contract = tmp_path / "contract.json"
    contract.write_text(json.dumps(CONTRACT))
    trace = tmp_path / "seed.json"
    trace.write_text(json.dumps({"tool_calls": [{"name": "http_get_health", "args": args}]}))
    fps = tmp_path / "fingerprint.json"
    fps.write_text(json.dumps(fingerprint("box-b", "b" * 16).to_json()))
    return [str(contract), str(trace), str(fps)]


def test_check_passes_a_clean_seed_trace(tmp_path):
    out = runner.invoke(app, ["check", *_check_files(tmp_path, {"url": "http://127.0.0.1/health"})])
    assert (out.exit_code, out.output) == (0, "PASS\n")


def test_check_fails_a_hostname_leak(tmp_path):
    out = runner.invoke(app, ["check", *_check_files(tmp_path, {"url": "http://box-b/health"})])
    assert out.exit_code == 1
    assert out.output.startswith("FAIL\n") and "hostname" in out.output


def test_check_bad_contract_exits_2(tmp_path):
    files = _check_files(tmp_path, {"url": "x"})
    (tmp_path / "contract.json").write_text("{")
    out = runner.invoke(app, ["check", *files])
    assert out.exit_code == 2 and "contract.json" in out.output


def _flipped_run(tmp_path):
    attempts = {
        ("local", "t-ok", 0): Attempt("pass"),
        ("box-b", "t-ok", 0): Attempt("pass"),
        ("local", "t-flip", 0): Attempt("pass"),
        ("box-b", "t-flip", 0): Attempt("fail", why="predicate exit 1"),
        ("local", "t-shape", 0): Attempt("pass"),
        ("box-b", "t-shape", 0): Attempt(
            "pass", calls=[*HEALTHY, ("http_get_health", {"url": "http://x/h"})]
        ),
    }
    return build_run(tmp_path, RunSpec(hosts=two_hosts(), attempts=attempts, gate=0.10))


def test_report_writes_all_three_files_and_follows_the_exit_codes(tmp_path):
    run = _flipped_run(tmp_path)
    out = runner.invoke(app, ["report", str(run), "--format", "json"])
    assert out.exit_code == 1  # 1 flip of 3 comparable tasks is above the 0.10 gate
    data = json.loads(out.output)
    assert data == json.loads((run / "report.json").read_text())
    for key in (
        "run_id",
        "suite",
        "valid",
        "invalid_reasons",
        "gate",
        "flip_rate",
        "reference",
        "hosts",
        "tasks",
    ):
        assert key in data
    assert (data["flip_rate"], data["gate"], data["reference"], data["valid"]) == (0.333, 0.1, "local", True)
    flip = next(t for t in data["tasks"] if t["task"] == "t-flip")
    assert flip["verdicts"] == {"local": ["pass"], "box-b": ["fail"]}
    assert (flip["flip"], flip["classification"], flip["action"]) == (
        True,
        "host_coupling",
        "quarantine the agent",
    )
    assert set(data["hosts"][0]) >= {"name", "fingerprint", "reachable", "error"}
    assert "## Tasks" in (run / "report.md").read_text()
    assert runner.invoke(app, ["report", str(run), "--format", "md", "--gate", "0.5"]).exit_code == 0


def test_report_keeps_the_predicate_output_of_a_passing_attempt_as_of_a_failing_one(tmp_path):
    attempts = {
        ("local", "t-flip", 0): Attempt("pass", predicate_output="checking /opt\nok: the flag is absent"),
        ("box-b", "t-flip", 0): Attempt("fail", why="predicate run_tests.sh exited 1 (FAIL: the flag is set)",
                                        predicate_output="checking /opt\nFAIL: the flag is set"),
        ("local", "t-long", 0): Attempt("pass", predicate_output="x" * 5000 + "\nok: long"),
        ("box-b", "t-long", 0): Attempt("pass"),
    }  # fmt: skip
    run = build_run(tmp_path, RunSpec(hosts=two_hosts(), attempts=attempts, gate=1.0))
    out = runner.invoke(app, ["report", str(run), "--format", "md"])
    assert out.exit_code == 0, out.output
    data = json.loads((run / "report.json").read_text())
    tasks = {t["task"]: t for t in data["tasks"]}
    assert tasks["t-flip"]["predicate_output"] == {
        "local": ["checking /opt\nok: the flag is absent"], "box-b": ["checking /opt\nFAIL: the flag is set"]
    }  # fmt: skip
    kept = tasks["t-long"]["predicate_output"]["local"][0]
    assert kept.startswith("…") and kept.endswith("\nok: long") and len(kept) == 1001
    assert tasks["t-long"]["predicate_output"]["box-b"] == [None]  # a trace without one says nothing
    assert "- local attempt 0 (pass): predicate said: ok: the flag is absent" in out.output
    assert "- box-b attempt 0 (fail): predicate run_tests.sh exited 1 (FAIL: the flag is set)" in out.output


def test_report_junit_one_case_per_task_flip_is_a_failure(tmp_path):
    run = _flipped_run(tmp_path)
    out = runner.invoke(app, ["report", str(run), "--format", "junit"])
    suite = ET.fromstring(out.output).find("testsuite")
    assert suite is not None
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert sorted(cases) == ["t-flip", "t-ok", "t-shape"]
    assert cases["t-flip"].find("failure") is not None
    assert cases["t-ok"].find("failure") is None and cases["t-shape"].find("failure") is None
    assert suite.get("failures") == "1"


def test_report_junit_invalid_run_is_one_failing_case_of_its_own(tmp_path):
    run = _flipped_run(tmp_path)
    (run / "contract.json").unlink()
    out = runner.invoke(app, ["report", str(run), "--format", "junit"])
    assert out.exit_code == 1
    suite = ET.fromstring(out.output).find("testsuite")
    assert suite is not None
    cases = {c.get("name"): c.find("failure") for c in suite.iter("testcase")}
    assert sorted(cases) == ["run validity", "t-flip", "t-ok", "t-shape"]
    run_failure = cases["run validity"]
    assert run_failure is not None and "contract not stored" in run_failure.get("message", "")
    assert cases["t-ok"] is None and cases["t-shape"] is None  # an agreeing task did not fail
    assert cases["t-flip"] is not None and suite.get("failures") == "2"


def test_report_table_shows_flip_classification_validity_and_gate(tmp_path):
    run = _flipped_run(tmp_path)
    out = runner.invoke(app, ["report", str(run)], env={"COLUMNS": "200"})
    assert out.exit_code == 1
    row = next(line for line in out.output.splitlines() if "t-flip" in line)
    assert "<- flip" in row and "host_coupling" in row and "quarantine the agent" in row
    assert "valid" in out.output and "ABOVE gate=0.10" in out.output


def test_report_on_a_directory_that_is_not_a_run_exits_2(tmp_path):
    out = runner.invoke(app, ["report", str(tmp_path)])
    assert out.exit_code == 2 and "manifest.json" in out.output


def test_diff_prints_a_unified_shape_diff(tmp_path):
    run = _flipped_run(tmp_path)
    out = runner.invoke(app, ["diff", str(run), "--task", "t-shape"])
    assert out.exit_code == 1
    lines = out.output.splitlines()
    assert "--- hosts/local/traces/t-shape.0.jsonl" in lines
    assert "+++ hosts/box-b/traces/t-shape.0.jsonl" in lines
    assert "+http_get_health(url: str)" in lines
    assert " restart_unit(unit: str)" in lines


def test_diff_same_shapes_exit_0_and_unknown_host_exit_2(tmp_path):
    run = _flipped_run(tmp_path)
    out = runner.invoke(app, ["diff", str(run), "--hosts", "local,box-b", "--task", "t-ok"])
    assert out.exit_code == 0
    assert out.output == "# t-ok: same shapes and values on local and box-b (attempts 0)\n"
    bad = runner.invoke(app, ["diff", str(run), "--hosts", "local,box-z"])
    assert bad.exit_code == 2 and "no host 'box-z' (hosts: local, box-b)" in bad.output


def test_report_exits_as_the_replay_of_the_run_did(tmp_path, monkeypatch):
    """One exit policy: a run whose host failed (error verdicts) is exit 3 from replay and from report."""
    from pathlib import Path

    triage = Path(__file__).resolve().parents[2] / "examples" / "suites" / "triage"
    (tmp_path / "hosts.toml").write_text(
        f"[[hosts]]\nname = 'local'\ntransport = 'local'\nworkspace_root = '{tmp_path / 'ws-a'}'\n"
        f"[[hosts]]\nname = 'box-b'\ntransport = 'local'\nworkspace_root = '{tmp_path / 'ws-b'}'\n"
        "python = '/nonexistent/python3'\n"
    )
    monkeypatch.chdir(tmp_path)
    replayed = runner.invoke(app, ["replay", str(triage), "--tasks", "healthy-no-writes", "--out", "runs"])
    assert replayed.exit_code == 3, replayed.output
    (run,) = (tmp_path / "runs").glob("2*")
    for fmt in ("table", "junit"):
        reported = runner.invoke(app, ["report", str(run), "--format", fmt])
        assert reported.exit_code == 3, reported.output
        assert "exit 3: 2 error verdict(s) on box-b: RunnerCrashed: runner exited 127" in reported.output
