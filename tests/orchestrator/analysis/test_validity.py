"""The validity rule, reason by reason; leaks across hosts; damaged traces; pass^k."""

from __future__ import annotations

import json

import pytest

from agent_runner.recordclass import replace
from orchestrator.analysis import analyse_run
from tests.support.rundirs import PINS, Attempt, RunSpec, build_run, fingerprint, two_hosts


def _spec(**kw) -> RunSpec:
    attempts = {
        ("local", "t1", 0): Attempt("pass"),
        ("box-b", "t1", 0): Attempt("pass"),
        ("local", "t2", 0): Attempt("pass"),
        ("box-b", "t2", 0): Attempt("pass"),
    }
    attempts.update(kw.pop("attempts", {}))
    return RunSpec(hosts=kw.pop("hosts", two_hosts()), attempts=attempts, **kw)


def test_a_clean_two_host_run_is_valid(tmp_path):
    report = analyse_run(build_run(tmp_path, _spec()))
    assert report.valid and report.invalid_reasons == []
    assert report.flip_rate == 0.0 and report.within_gate


def test_fingerprint_not_stored_makes_it_invalid(tmp_path):
    hosts = two_hosts()
    hosts["box-b"] = None
    report = analyse_run(build_run(tmp_path, _spec(hosts=hosts)))
    assert not report.valid
    [reason] = report.invalid_reasons
    assert reason.startswith("fingerprint not stored for box-b") and "fingerprint.json" in reason


def test_contract_not_stored_makes_it_invalid(tmp_path):
    report = analyse_run(build_run(tmp_path, _spec(contract=None)))
    assert not report.valid
    [reason] = report.invalid_reasons
    assert reason.startswith("contract not stored") and "contract.json" in reason


def test_one_host_replayed_is_invalid(tmp_path):
    attempts = {("local", "t1", 0): Attempt("pass")}
    report = analyse_run(
        build_run(tmp_path, RunSpec(hosts={"local": fingerprint("devbox-ref", "a" * 16)}, attempts=attempts))
    )
    assert report.invalid_reasons == ["fewer than two hosts replayed (local)"]


def test_identical_fingerprints_are_invalid(tmp_path):
    same = fingerprint("devbox-ref", "a" * 16)
    report = analyse_run(build_run(tmp_path, _spec(hosts={"local": same, "box-b": replace(same)})))
    assert report.invalid_reasons == [
        "no two replayed hosts have different fingerprints (box-b same as local)"
    ]


def test_pins_that_differ_name_the_pin_and_the_host(tmp_path):
    other = dict(PINS, prompt_sha="x" * 12)
    report = analyse_run(
        build_run(tmp_path, _spec(attempts={("box-b", "t2", 0): Attempt("pass", pins=other)}))
    )
    assert report.invalid_reasons == ["pins differ: prompt_sha on box-b (tasks: t2)"]


def test_nested_budget_pin_differs(tmp_path):
    other = json.loads(json.dumps(PINS))
    other["budget"]["max_steps"] = 4
    report = analyse_run(
        build_run(tmp_path, _spec(attempts={("box-b", "t1", 0): Attempt("pass", pins=other)}))
    )
    assert report.invalid_reasons == ["pins differ: budget.max_steps on box-b (tasks: t1)"]


@pytest.mark.parametrize("there", [True, 1.0], ids=["true", "1.0"])
def test_a_pin_equal_in_python_but_not_in_json_differs(tmp_path, there):
    # 1 == True == 1.0 in Python; as pins (JSON) they are three different values
    here, other = json.loads(json.dumps(PINS)), json.loads(json.dumps(PINS))
    here["budget"]["max_steps"], other["budget"]["max_steps"] = 1, there
    attempts = {("local", t, 0): Attempt("pass", pins=here) for t in ("t1", "t2")}
    attempts[("box-b", "t1", 0)] = Attempt("pass", pins=here)
    attempts[("box-b", "t2", 0)] = Attempt("pass", pins=other)
    report = analyse_run(build_run(tmp_path, _spec(attempts=attempts)))
    assert report.invalid_reasons == ["pins differ: budget.max_steps on box-b (tasks: t2)"]


def test_trace_holding_the_other_hosts_hostname_is_a_leak(tmp_path):
    # box-b's agent put the reference host's name into an argument: box-b's own check cannot see it
    leaky = [("http_get_health", {"url": "http://devbox-ref:8080/health"})]
    report = analyse_run(
        build_run(tmp_path, _spec(attempts={("box-b", "t1", 0): Attempt("pass", calls=leaky)}))
    )
    task = next(t for t in report.tasks if t.task == "t1")
    assert [(leak.host, leak.step, leak.kind) for leak in task.leaks] == [("box-b", 1, "hostname")]
    assert task.verdicts["box-b"] == ["fail"]  # pass needs a clean check against every host
    assert not report.valid
    [reason] = report.invalid_reasons
    assert reason.startswith("host leakage: 1 finding(s) in traces from box-b") and "devbox-ref" in reason


def test_contract_finding_is_not_a_leak(tmp_path):
    calls = [("restart_unit", {"unit": "nginx", "ssh_identity": "x"})]
    report = analyse_run(
        build_run(tmp_path, _spec(attempts={("box-b", "t1", 0): Attempt("pass", calls=calls)}))
    )
    task = next(t for t in report.tasks if t.task == "t1")
    assert task.leaks == [] and [f.kind for f in task.findings] == ["forbidden_args"]
    assert report.valid  # a contract violation fails the attempt but is no host leakage


def test_corrupt_trace_line_makes_the_attempt_error_and_names_file_and_line(tmp_path):
    run = build_run(tmp_path, _spec())
    trace = run / "hosts" / "box-b" / "traces" / "t1.0.jsonl"
    lines = trace.read_text().splitlines()
    lines.insert(2, '{"type": "turn", "step": 2, "tool": ')  # cut off mid-write
    trace.write_text("\n".join(lines) + "\n")
    report = analyse_run(run)
    task = next(t for t in report.tasks if t.task == "t1")
    assert task.verdicts["box-b"] == ["error"]
    assert task.classification == "infra_error" and not task.flip
    assert any(p.startswith(f"{trace}:3: not JSON") for p in task.problems)
    assert task.why["box-b"][0].startswith(f"damaged trace: {trace}:3:")


def test_trace_cut_short_is_an_error(tmp_path):
    run = build_run(tmp_path, _spec())
    trace = run / "hosts" / "box-b" / "traces" / "t1.0.jsonl"
    trace.write_text("\n".join(trace.read_text().splitlines()[:-1]) + "\n")  # no finish record
    task = next(t for t in analyse_run(run).tasks if t.task == "t1")
    assert task.verdicts["box-b"] == ["error"] and "no finish record" in task.why["box-b"][0]


def test_unreachable_host_gives_infra_error_with_its_error(tmp_path):
    spec = RunSpec(
        hosts=two_hosts(),
        attempts={("local", "t1", 0): Attempt("pass")},
        host_meta={"box-b": {"reachable": False, "error": "HostUnreachable: connection refused"}},
    )
    report = analyse_run(build_run(tmp_path, spec))
    task = report.tasks[0]
    assert task.verdicts == {"local": ["pass"], "box-b": ["error"]}
    assert task.classification == "infra_error"
    assert "connection refused" in task.why["box-b"][0]
    assert [h.reachable for h in report.hosts] == [True, False]
    assert "fewer than two hosts replayed (local)" in report.invalid_reasons


def test_interrupted_run_is_invalid(tmp_path):
    report = analyse_run(build_run(tmp_path, _spec(manifest_extra={"interrupted": True})))
    assert report.invalid_reasons == ["run interrupted: not every host finished"]


def test_gate_from_the_manifest_and_the_override(tmp_path):
    spec = _spec(attempts={("box-b", "t1", 0): Attempt("fail")}, gate=0.6)
    run = build_run(tmp_path, spec)
    report = analyse_run(run)
    assert (report.flip_rate, report.gate, report.within_gate) == (0.5, 0.6, True)
    assert analyse_run(run, gate=0.25).within_gate is False


def test_pass_rate_and_pass_hat_k_hand_computed(tmp_path):
    # local: a = pass pass fail (n=3,c=2), b = pass x3 (n=3,c=3), c = error error pass (n=1,c=1)
    verdicts = {"a": ["pass", "pass", "fail"], "b": ["pass"] * 3, "c": ["error", "error", "pass"]}
    attempts = {}
    for task, seq in verdicts.items():
        for i, v in enumerate(seq):
            attempts[("local", task, i)] = Attempt(v)
            attempts[("box-b", task, i)] = Attempt("pass")
    report = analyse_run(build_run(tmp_path, RunSpec(hosts=two_hosts(), attempts=attempts)))
    local = next(s for s in report.stats if s.host == "local")
    assert (local.attempts, local.passed, local.failed, local.errors) == (9, 6, 1, 2)
    assert local.pass_rate == pytest.approx(6 / 7, abs=1e-4)
    # k=1: (2/3 + 1 + 1)/3; k=2: (C(2,2)/C(3,2) + 1)/2 (task c has n=1 < 2); k=3: (0 + 1)/2
    assert local.pass_k == pytest.approx({"1": 0.8889, "2": 0.6667, "3": 0.5}, abs=1e-4)
    box_b = next(s for s in report.stats if s.host == "box-b")
    assert box_b.pass_k == {"1": 1.0, "2": 1.0, "3": 1.0}


def test_leak_deep_in_a_long_trace_is_found_at_its_step(tmp_path):
    # more turns than one checker batch: the leak sits in the second batch
    calls = [("read_unit_status", {"unit": f"u{i}.service"}) for i in range(299)]
    calls.append(("read_unit_status", {"unit": "nginx", "note": "/root/.ssh/id_ed25519"}))
    report = analyse_run(build_run(tmp_path, _spec(attempts={("box-b", "t1", 0): Attempt("pass", calls=calls)})))
    task = next(t for t in report.tasks if t.task == "t1")
    assert {(leak.step, leak.kind) for leak in task.leaks} >= {(300, "absolute_local_path"), (300, "home_directory")}


def test_a_pass_row_without_its_trace_is_an_error(tmp_path):
    run = build_run(tmp_path, _spec())
    trace = run / "hosts" / "box-b" / "traces" / "t2.0.jsonl"
    trace.unlink()
    task = next(t for t in analyse_run(run).tasks if t.task == "t2")
    assert task.verdicts["box-b"] == ["error"]
    assert task.why["box-b"] == [f"{trace}: missing"]


BURN = {"kind": "ssh_dir", "detail": "/root/.ssh", "action": "burn",
        "meaning": "private keys are readable by an agent run as this user; use a user or box without ~/.ssh"}
KEEP = {"kind": "tmp_shared", "detail": "/tmp", "action": "keep", "meaning": "fine, but look"}


def _burning_hosts():
    hosts = two_hosts()
    hosts["box-b"] = replace(hosts["box-b"], findings=[KEEP, BURN])
    return hosts


@pytest.mark.parametrize("invalidates", [False, True])
def test_burn_findings_are_always_listed_and_invalidate_only_when_the_suite_asks(tmp_path, invalidates):
    from rich.console import Console

    from orchestrator.report import render_markdown
    from orchestrator.ui import report_table

    spec = _spec(hosts=_burning_hosts(), manifest_extra={"burn_invalidates": invalidates})
    report = analyse_run(build_run(tmp_path, spec))
    assert [(f.host, f.kind, f.detail) for f in report.burn] == [("box-b", "ssh_dir", "/root/.ssh")]
    console = Console(width=200, record=True)
    console.print(report_table(report))
    text = console.export_text()
    line = next(x for x in text.splitlines() if x.startswith("burn:"))
    assert line.startswith("burn: box-b: ssh_dir (/root/.ssh): private keys are readable")
    assert "- burn: box-b: ssh_dir (/root/.ssh)" in render_markdown(report)
    if invalidates:
        assert not report.valid
        assert report.invalid_reasons == [
            "isolation: box-b has 1 burn finding(s) ([gate] burn_invalidates): ssh_dir (/root/.ssh)"
        ]
        assert "these burn findings invalidate the run ([gate] burn_invalidates = true)" in text
    else:
        assert report.valid, report.invalid_reasons
        assert "burn findings are listed; with [gate] burn_invalidates = true they invalidate the run" in text


def test_the_suite_asks_for_it_with_gate_burn_invalidates(tmp_path):
    import shutil
    from pathlib import Path

    from agent_runner.errors import SuiteError
    from agent_runner.suite import load_suite

    example = Path(__file__).resolve().parents[3] / "examples" / "suites" / "triage"
    suite = tmp_path / "triage"
    shutil.copytree(example, suite)
    assert load_suite(suite).gate.burn_invalidates is False
    toml = suite / "suite.toml"
    toml.write_text(toml.read_text().replace("[gate]\n", "[gate]\nburn_invalidates = true\n"))
    assert load_suite(suite).gate.burn_invalidates is True
    toml.write_text(toml.read_text().replace("burn_invalidates = true", 'burn_invalidates = "yes"'))
    with pytest.raises(SuiteError, match=r"suite.toml: \[gate\].burn_invalidates must be true or false"):
        load_suite(suite)


def test_a_leak_reason_keeps_a_long_path_whole(tmp_path):
    # a long workspace_root makes a long path: cut at 100 characters, the reason lost the path's end
    path = "/root/crosshost-hosts/local-root/runs/20261130T153456Z-1b7753-local/work/t1.0/notes-of-the-run.txt"
    leaky = [("read_unit_status", {"unit": "nginx", "note": path})]
    report = analyse_run(
        build_run(tmp_path, _spec(attempts={("box-b", "t1", 0): Attempt("pass", calls=leaky)}))
    )
    [reason] = report.invalid_reasons
    assert path in reason, reason
