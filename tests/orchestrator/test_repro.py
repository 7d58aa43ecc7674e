"""repro without hosts: the suite built from a trace, and the step-by-step comparison."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_runner.records import Fingerprint
from agent_runner.suite import load_suite
from agent_runner.trace import TraceWriter
from orchestrator.commands import repro
from orchestrator.errors import InputError

Turn = tuple[str, dict[str, Any], str]  # tool, args, observation


def write_trace(
    path: Path, turns: list[Turn], *, host: str = "box-a", verdict: str = "pass", sidecar: bool = True
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    obs_path = path.with_suffix(".obs.jsonl") if sidecar else None
    with TraceWriter(path, obs_path) as w:
        w.header(
            run_id="r0",
            host=host,
            task="probe-opt",
            attempt=0,
            fingerprint="0" * 16,
            pins={"budget": {"max_steps": 3, "max_bytes": 4096, "timeout_s": 30}},
        )
        for tool, args, obs in turns:
            w.turn(tool=tool, args=args, observation=obs, error=None)
        w.finish(reason="stop", final="done", predicate_exit=None, verdict=verdict, why="", wall_ms=5)
    return path


INCIDENT: list[Turn] = [
    ("shell", {"argv": ["ls", "/opt"]}, "x\n"),
    ("read_unit_status", {"unit": "nginx.service"}, "ActiveState=inactive"),
    ("read_unit_status", {"unit": "app.service"}, "ActiveState=active"),
    ("shell", {"argv": ["cat", "/opt/x"]}, "hello\n"),
    ("http_get_health", {"url": "http://localhost/health"}, "status=200 body=ok"),
]


def test_suite_from_our_trace(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "in" / "probe-opt.0.jsonl", INCIDENT)
    built = repro.build_suite(trace, tmp_path / "suite")
    suite = load_suite(built.path)  # the runner's own validator accepts it
    (task,) = suite.tasks
    assert task.id == built.task == "probe-opt" and suite.name == "repro-probe-opt"
    assert task.agent.kind == "scripted"
    calls = [turn["tool_calls"][0] for turn in task.script or [] if "tool_calls" in turn]
    assert [(c["name"], c["args"]) for c in calls] == [(t, a) for t, a, _ in INCIDENT]
    assert task.script and task.script[-1] == {"content": "done", "finish": "stop"}
    assert task.budget.max_steps >= len(INCIDENT) + 1 and task.budget.timeout_s == 30
    # contract: built-ins + every tool the trace names; shell: exactly the commands it ran
    assert {t["name"] for t in suite.contract["tools"]} == {
        "shell",
        "read_file",
        "write_file",
        "list_dir",
        "read_unit_status",
        "http_get_health",
    }
    assert suite.tools == {"allow": [["ls", "/opt"], ["cat", "/opt/x"]], "deny": []}
    # non-built-ins answered from the recorded observations, per argument where they differ
    assert task.fixtures == {
        "http_get_health": "status=200 body=ok",
        "read_unit_status": {"nginx.service": "ActiveState=inactive", "app.service": "ActiveState=active"},
    }


def test_fixtures_from_trace_answers_builtins_too(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "probe-opt.0.jsonl", INCIDENT)
    task = load_suite(repro.build_suite(trace, tmp_path / "s", fixtures_from_trace=True).path).tasks[0]
    # argv is a list, which the runner's fixtures cannot key on: the first recorded output answers
    assert task.fixtures["shell"] == "x\n"
    assert task.fixtures["read_unit_status"] == {
        "nginx.service": "ActiveState=inactive",
        "app.service": "ActiveState=active",
    }
    plain = load_suite(repro.build_suite(trace, tmp_path / "p").path).tasks[0]
    assert "shell" not in plain.fixtures  # without the flag, the shell runs for real


def test_seed_trace_without_observations(tmp_path: Path) -> None:
    seed = tmp_path / "incident.json"
    seed.write_text(
        json.dumps(
            {
                "tool_calls": [
                    {"name": "shell", "args": {"argv": ["test", "-e", "/opt/x"]}},
                    {
                        "name": "add_label",
                        "arguments": json.dumps({"repo": "r", "issue_id": 1, "label": "bug"}),
                    },
                ]
            }
        )
    )
    built = repro.build_suite(seed, tmp_path / "s")
    suite = load_suite(built.path)
    assert built.task == "incident"
    assert suite.tools["allow"] == [["test", "-e", "/opt/x"]]
    assert suite.tasks[0].fixtures == {"add_label": repro.MISSING_OBS}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "not a trace"),
        ('{"tool_calls": []}', "no tool calls"),
        ('{"type":"turn","step":2,"tool":"shell","args":{}}\n', "step 2, expected 1"),
    ],
)
def test_bad_trace_is_input_error(tmp_path: Path, content: str, message: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    with pytest.raises(InputError, match=message):
        repro.build_suite(bad, tmp_path / "s")
    with pytest.raises(InputError, match="no such trace"):
        repro.build_suite(tmp_path / "absent.jsonl", tmp_path / "s")


def test_compare_names_first_diverging_step(tmp_path: Path) -> None:
    good = write_trace(tmp_path / "a" / "t.0.jsonl", INCIDENT, host="box-a")
    parted = list(INCIDENT)
    parted[3] = ("shell", {"argv": ["cat", "/opt/x"]}, "cat: /opt/x: No such file or directory\n")
    parted[4] = ("http_get_health", {"url": "http://localhost/health"}, "status=500")
    bad = write_trace(tmp_path / "b" / "t.0.jsonl", parted, host="box-b", verdict="fail")
    cmp = repro.compare_traces(
        "box-b",
        bad,
        "box-a",
        good,
        Fingerprint(hostname="box-b", python="CPython 3.11.2", platform="Linux-debian"),
        Fingerprint(hostname="box-a", python="CPython 3.11.7", platform="Linux-debian"),
    )
    assert cmp.parted and cmp.divergence is not None
    assert cmp.divergence.step == 4 and cmp.divergence.what == "observation"
    assert cmp.divergence.host.observation == "cat: /opt/x: No such file or directory\n"
    assert cmp.divergence.against.observation == "hello\n"
    assert cmp.fingerprint_diff == {"hostname": ["box-b", "box-a"], "python": ["CPython 3.11.2", "CPython 3.11.7"]}
    assert cmp.verdicts == {"box-b": "fail", "box-a": "pass"}

    same = repro.compare_traces("box-b", good, "box-a", good)
    assert not same.parted and same.divergence is None and same.steps_compared == len(INCIDENT)


def test_compare_shorter_trace_and_long_observation(tmp_path: Path) -> None:
    long_obs = "\n".join(f"line {i}" for i in range(500))
    a = write_trace(tmp_path / "a.jsonl", [("shell", {"argv": ["ls"]}, long_obs)])
    b = write_trace(
        tmp_path / "b.jsonl", [("shell", {"argv": ["ls"]}, long_obs + "!"), ("shell", {"argv": ["ls"]}, "")]
    )
    cmp = repro.compare_traces("b", b, "a", a)
    assert cmp.divergence is not None and cmp.divergence.step == 1
    shown = cmp.divergence.host.observation or ""
    assert shown.count("\n") <= repro.OBS_SHOWN_LINES + 1 and shown.endswith("chars in all)")
    a2 = write_trace(tmp_path / "a2.jsonl", [("shell", {"argv": ["ls"]}, long_obs + "!")])
    cmp = repro.compare_traces("b", b, "a", a2)
    assert cmp.divergence is not None and (cmp.divergence.step, cmp.divergence.what) == (2, "length")
    assert cmp.divergence.against.tool is None


def test_shown_observation_is_redacted(tmp_path: Path) -> None:
    out = repro.shown("token: ghp_abcdefghijklmnopqrstuvwxyz0123\nkey AKIAABCDEFGHIJKLMNOP\n") or ""
    assert "ghp_abc" not in out and "AKIAABC" not in out and out.count("[REDACTED]") == 2
