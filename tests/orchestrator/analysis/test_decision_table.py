"""Every row of the decision table, built from real traces in a run directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_runner.recordclass import replace
from orchestrator.analysis import analyse_run
from tests.support.rundirs import HEALTHY, Attempt, RunSpec, build_run, fingerprint, two_hosts

EXTRA_CALL = [*HEALTHY, ("http_get_health", {"url": "http://127.0.0.1/health"})]
OTHER_KEYS = [("read_unit_status", {"unit": "nginx.service", "verbose": True}), HEALTHY[1]]


def _run(tmp_path: Path, local: list[Attempt], box_b: list[Attempt], hosts=None):
    attempts = {("local", "t", i): a for i, a in enumerate(local)}
    attempts.update({("box-b", "t", i): a for i, a in enumerate(box_b)})
    run = build_run(tmp_path, RunSpec(hosts=hosts or two_hosts(), attempts=attempts))
    report = analyse_run(run)
    assert [t.task for t in report.tasks] == ["t"]
    return report, report.tasks[0]


@pytest.mark.parametrize(
    ("local", "box_b", "classification", "action", "flip"),
    [
        ([Attempt("pass")], [Attempt("fail")], "host_coupling", "quarantine the agent", True),
        ([Attempt("fail")], [Attempt("pass")], "laptop_contamination", "clean local secrets", True),
        (
            [Attempt("pass")],
            [Attempt("pass", calls=EXTRA_CALL)],
            "unstable_contract",
            "pin tools, rerun",
            False,
        ),
        (
            [Attempt("pass")],
            [Attempt("pass", calls=OTHER_KEYS)],
            "unstable_contract",
            "pin tools, rerun",
            False,
        ),
        ([Attempt("fail")], [Attempt("fail")], "honest_bug", "fix the tool", False),
        (
            [Attempt("pass"), Attempt("pass")],
            [Attempt("pass"), Attempt("fail")],
            "flaky",
            "fix the test first",
            False,  # 2/2 vs 1/2 is no host difference (p = 1), whatever attempt 1 did on each host
        ),
        ([Attempt("pass")], [Attempt("error")], "infra_error", "fix the host, rerun", False),
        ([Attempt("pass")], [Attempt("pass")], "agree", "—", False),
    ],
    ids=[
        "host_coupling",
        "laptop_contamination",
        "unstable_contract_extra_call",
        "unstable_contract_keys",
        "honest_bug",
        "flaky",
        "infra_error",
        "agree",
    ],
)
def test_decision_table_row(tmp_path, local, box_b, classification, action, flip):
    report, task = _run(tmp_path, local, box_b)
    assert (task.classification, task.action, task.flip) == (classification, action, flip)


def test_same_host_when_fingerprints_are_identical(tmp_path):
    same = fingerprint("devbox-ref", "a" * 16)
    hosts = {"local": same, "box-b": replace(same)}
    report, task = _run(tmp_path, [Attempt("pass")], [Attempt("fail")], hosts=hosts)
    assert (task.classification, task.action) == ("same_host", "use a real second machine")
    assert not report.valid
    assert any("different fingerprints" in r for r in report.invalid_reasons)


def test_flaky_reference_host_is_flaky(tmp_path):
    _, task = _run(tmp_path, [Attempt("pass"), Attempt("fail")], [Attempt("pass"), Attempt("pass")])
    assert task.classification == "flaky"
    assert task.flaky_hosts == ["local"]


def test_error_is_counted_apart_and_never_a_flip(tmp_path):
    report, task = _run(tmp_path, [Attempt("pass"), Attempt("pass")], [Attempt("error"), Attempt("pass")])
    assert task.classification == "infra_error"
    assert not task.flip and task.comparable  # attempt 1 compared, attempt 0 excluded
    assert task.errors == 1 and report.error_attempts == 1 and report.error_tasks == 1


def test_both_fail_in_different_ways_is_not_an_honest_bug(tmp_path):
    _, task = _run(tmp_path, [Attempt("fail")], [Attempt("fail", calls=EXTRA_CALL)])
    assert task.classification == "unstable_contract"


def test_precedence_host_coupling_beats_agree_across_hosts(tmp_path):
    hosts = {**two_hosts(), "box-c": fingerprint("box-c", "c" * 16)}
    attempts = {
        ("local", "t", 0): Attempt("pass"),
        ("box-b", "t", 0): Attempt("pass"),
        ("box-c", "t", 0): Attempt("fail"),
    }
    report = analyse_run(build_run(tmp_path, RunSpec(hosts=hosts, attempts=attempts)))
    task = report.tasks[0]
    assert task.classification == "host_coupling"
    assert task.flipped_hosts == ["box-c"]


def test_values_differing_are_reported_apart_from_shapes(tmp_path):
    other_values = [("read_unit_status", {"unit": "app.service"}), HEALTHY[1]]
    _, task = _run(tmp_path, [Attempt("pass")], [Attempt("pass", calls=other_values)])
    assert task.classification == "agree"
    assert task.shape_diff == []
    assert [(d.host, d.step, d.tool) for d in task.args_diff] == [("box-b", 1, "read_unit_status")]


def test_shape_diff_names_the_extra_step(tmp_path):
    _, task = _run(tmp_path, [Attempt("pass")], [Attempt("pass", calls=EXTRA_CALL)])
    assert [(d.op, d.step, d.other) for d in task.shape_diff] == [("extra", 3, "http_get_health(url: str)")]


def test_flip_attribution_lists_differing_fingerprint_fields(tmp_path):
    _, task = _run(tmp_path, [Attempt("pass")], [Attempt("fail")])
    [attr] = task.attribution
    fields = {f.field: (f.reference, f.other) for f in attr.fields}
    assert fields["python"] == ("CPython 3.11.2", "CPython 3.11.9")
    assert fields["hostname"] == ("devbox-ref", "box-b")
    assert not any(f.startswith("locale") for f in fields)
    # the run's own working directory differs on every host by construction: never a lead
    assert "cwd" not in fields and "fingerprint" not in fields and "captured_at" not in fields


def test_an_error_on_the_reference_is_never_a_flip_nor_makes_it_flaky(tmp_path):
    # attempt 0: the reference errored and box-b passed; that pair is not comparable (an
    # error is never counted as a flip), and an error among passes is not a disagreement of attempts
    report, task = _run(tmp_path, [Attempt("error"), Attempt("pass")], [Attempt("pass"), Attempt("pass")])
    assert task.classification == "infra_error"
    assert (task.flip, task.flipped_hosts, task.flaky_hosts) == (False, [], [])
    assert task.comparable  # attempt 1 (pass, pass) still compared
    assert (report.flipped, report.comparable, report.flip_rate) == (0, 1, 0.0)


def test_attribution_keeps_an_unset_value_null_not_the_string_null(tmp_path):
    """box-b has no LANG: the report must say null (unset), not "null" (a value someone set)."""
    hosts = two_hosts()
    hosts["box-b"] = fingerprint("box-b", "b" * 16, locale={"LANG": None, "LC_ALL": None})
    _, task = _run(tmp_path, [Attempt("pass")], [Attempt("fail")], hosts=hosts)
    [attr] = task.attribution
    fields = {f.field: (f.reference, f.other) for f in attr.fields}
    assert fields["locale.LANG"] == ("C.UTF-8", None)


def _sampled_run(tmp_path, local: list[str], box_b: list[str], **manifest):
    attempts = {("local", "t", i): Attempt(v) for i, v in enumerate(local)}
    attempts.update({("box-b", "t", i): Attempt(v) for i, v in enumerate(box_b)})
    spec = RunSpec(hosts=two_hosts(), attempts=attempts, manifest_extra={"sampled": ["t"], **manifest})
    report = analyse_run(build_run(tmp_path, spec))
    return report, report.tasks[0]


def test_sampled_agent_pass_against_fail_once_is_underpowered_with_the_repeat_it_needs(tmp_path):
    report, task = _sampled_run(tmp_path, ["pass"], ["fail"])
    assert (task.classification, task.action, task.needed_repeat) == ("underpowered", "rerun with --repeat 4", 4)
    assert (task.flip, task.evidence, task.sampled) == (False, "statistical", True)
    assert (report.flipped, report.comparable, report.within_gate) == (0, 1, True)
    box_b = next(r for r in task.rates if r.host == "box-b")
    assert (box_b.n, box_b.passes, box_b.p_value, box_b.differs) == (1, 0, 1.0, False)


def test_sampled_agent_eight_against_none_is_host_coupling_with_its_p_value(tmp_path):
    report, task = _sampled_run(tmp_path, ["pass"] * 8, ["fail"] * 7 + ["pass"])
    assert (task.classification, task.flip, task.flipped_hosts) == ("host_coupling", True, ["box-b"])
    local, box_b = (next(r for r in task.rates if r.host == h) for h in ("local", "box-b"))
    assert local.p_value is None and (local.n, local.passes, local.pass_rate) == (8, 8, 1.0)
    assert box_b.p_value is not None and box_b.p_value < 0.01 and box_b.differs
    assert box_b.ci_low < 0.125 < box_b.ci_high and local.ci_high == 1.0
    assert report.flip_rate == 1.0 and not report.within_gate


def test_alpha_comes_from_the_manifest(tmp_path):
    # 7/8 against 1/8: p = 0.0101, a difference at alpha 0.05 and none at alpha 0.01
    _, task = _sampled_run(tmp_path / "a", ["pass"] * 7 + ["fail"], ["fail"] * 7 + ["pass"])
    assert task.classification == "host_coupling"
    report, task = _sampled_run(tmp_path / "b", ["pass"] * 7 + ["fail"], ["fail"] * 7 + ["pass"], alpha=0.01)
    assert report.alpha == 0.01 and not task.flip
    # eight attempts a host can reach p < 0.01; these did not: no host difference, the sampled agent draws
    assert task.classification == "sampled_noise" and task.needed_repeat is None


def test_report_markdown_shows_rates_intervals_and_p_values(tmp_path):
    from orchestrator.report import render_markdown

    report, _ = _sampled_run(tmp_path, ["pass"] * 8, ["fail"] * 8)
    md = render_markdown(report)
    assert "## Pass rates" in md
    assert "| t | statistical | 8/8 100% [68-100] | **0/8 0% [0-32] p=<0.001** |" in md


def test_attempt_marks_only_where_the_same_attempt_is_the_evidence(tmp_path):
    from orchestrator.analysis.flips import flipped_attempts
    from orchestrator.report.page_data import build_data

    report, task = _sampled_run(tmp_path, ["pass", "fail"] * 4, ["fail", "pass"] * 4)
    assert task.evidence == "statistical" and flipped_attempts(task, "box-b", "local") == set()
    row = next(t for t in build_data(report, tmp_path / report.run_id)["tasks"] if t["task"] == "t")
    assert row["flipped_attempts"] == {"local": [], "box-b": []}  # attempt i on box-b means nothing here


FORBIDDEN_CALL = [("restart_unit", {"unit": "nginx.service", "ssh_identity": "~/.ssh/id_ed25519"})]
LEAKY_CALL = [("read_unit_status", {"unit": "/tmp/crosshost/box-b-ws/nginx.service"})]


@pytest.mark.parametrize(
    ("local", "box_b", "classification", "action"),
    [
        # the agent's own call is wrong on both hosts: its author acts, not the tool's
        ([Attempt("fail", calls=FORBIDDEN_CALL)], [Attempt("fail", calls=FORBIDDEN_CALL)], "honest_bug",
         "fix the agent's call"),
        ([Attempt("fail", calls=LEAKY_CALL)], [Attempt("fail", calls=LEAKY_CALL)], "honest_bug",
         "fix the agent's call"),
        # the same calls, the same argument values, and a tool that answered otherwise on box-b
        ([Attempt("pass")], [Attempt("fail", answers=["ActiveState=failed", "ok"])], "host_coupling", "fix the tool"),
        ([Attempt("fail")], [Attempt("pass", answers=["ok", "ok=true"])], "laptop_contamination", "fix the tool"),
        # the same answers: the verdict moved with the host alone
        ([Attempt("pass")], [Attempt("fail")], "host_coupling", "quarantine the agent"),
    ],
    ids=["forbidden_argument", "leak", "tool_answers_differently", "tool_answers_differently_ref", "same_answers"],
)  # fmt: skip
def test_the_action_names_who_must_act(
    tmp_path: Path, local: list[Attempt], box_b: list[Attempt], classification: str, action: str
) -> None:
    _, task = _run(tmp_path, local, box_b)
    assert (task.classification, task.action) == (classification, action)
