"""Ranked attribution per flipped task, whole values, and argument values beside their hashes."""

from __future__ import annotations

from pathlib import Path

from orchestrator.analysis import analyse_run
from orchestrator.analysis.attribution import cut_words
from orchestrator.analysis.diff import run_diff
from orchestrator.report import render_markdown
from tests.support.rundirs import HEALTHY, Attempt, RunSpec, build_run, fingerprint


def _hosts():
    long_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:" + ":".join(
        f"/opt/tool{i}/bin" for i in range(40)
    )
    return {
        "local": fingerprint("devbox-ref", "a" * 16),
        "box-b": fingerprint(
            "box-b", "b" * 16, python="CPython 3.11.9", python_executable=long_path,
            locale={"LANG": None, "LC_ALL": None, "preferred_encoding": "ANSI_X3.4-1968", "resolved": None},
        ),  # fmt: skip
    }


def _two_tasks(tmp_path: Path):
    attempts = {
        ("local", "locale-probe", 0): Attempt("pass", predicate_output="ok: 4 characters (LANG=C.UTF-8)"),
        ("box-b", "locale-probe", 0): Attempt(
            "fail", why="predicate exited 1", predicate_output="FAIL: counted 5 characters (LANG=unset LC_ALL=unset)"
        ),
        ("local", "flag-probe", 0): Attempt("pass", predicate_output="ok: feature flag off"),
        ("box-b", "flag-probe", 0): Attempt("fail", predicate_output="FAIL: /opt/demo/feature.flag is set"),
    }
    return analyse_run(build_run(tmp_path, RunSpec(hosts=_hosts(), attempts=attempts)))


def test_a_fact_the_task_names_is_ranked_first_and_is_the_cause(tmp_path):
    report = _two_tasks(tmp_path)
    task = next(t for t in report.tasks if t.task == "locale-probe")
    [attr] = task.attribution
    assert attr.fields[0].field == "locale.LANG"
    assert (attr.fields[0].reference, attr.fields[0].other) == ("C.UTF-8", None)
    assert attr.fields[0].tied == "the task's output names LANG"
    assert task.cause.startswith("box-b: locale.LANG C.UTF-8 → unset")
    assert attr.fields[-1].field == "hostname"  # the host's name explains nothing by itself


def test_tasks_of_one_run_get_their_own_ranking_and_an_honest_cause(tmp_path):
    report = _two_tasks(tmp_path)
    flag = next(t for t in report.tasks if t.task == "flag-probe")
    locale = next(t for t in report.tasks if t.task == "locale-probe")
    assert not any(f.tied for f in flag.attribution[0].fields)
    assert flag.cause.startswith("box-b: no differing fact named by the task")
    # untied facts: the locale before the interpreter, the host's name last of the known facts
    order = [f.field for f in flag.attribution[0].fields]
    assert order.index("locale.LANG") < order.index("python") < order.index("hostname")
    assert [f.field for f in flag.attribution[0].fields] != [f.field for f in locale.attribution[0].fields]


def test_values_are_whole_in_report_json_and_md(tmp_path):
    report = _two_tasks(tmp_path)
    task = next(t for t in report.tasks if t.task == "flag-probe")
    executable = next(f for f in task.attribution[0].fields if f.field == "python_executable")
    assert executable.other is not None and executable.other.endswith("/opt/tool39/bin") and len(executable.other) > 300
    md = render_markdown(report)
    assert "/opt/tool39/bin" in md
    assert "- cause: box-b: locale.LANG C.UTF-8 → unset" in md


def test_cut_words_never_cuts_mid_word():
    text = "box-b: locale.LANG C.UTF-8 → unset; box-c: tz.TZ UTC → Europe/Berlin"
    out = cut_words(text, 40)
    assert out.endswith("…") and len(out) <= 40
    assert text.startswith(out[:-1]) and text[len(out) - 1] in " ;,"  # the next character ends a word
    assert cut_words("short", 40) == "short"


def test_differing_argument_values_are_shown_redacted_beside_their_hashes(tmp_path):
    secret = "sk-" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4"
    ref_calls = [("read_unit_status", {"unit": "nginx.service", "token": "x"}), HEALTHY[1]]
    other_calls = [("read_unit_status", {"unit": "app.service", "token": secret}), HEALTHY[1]]
    attempts = {
        ("local", "t", 0): Attempt("pass", calls=ref_calls),
        ("box-b", "t", 0): Attempt("pass", calls=other_calls),
    }
    run = build_run(tmp_path, RunSpec(hosts=_hosts(), attempts=attempts))
    report = analyse_run(run)
    [d] = report.tasks[0].args_diff
    values = {v.key: (v.reference, v.other) for v in d.values}
    assert values["unit"] == ("nginx.service", "app.service")
    assert "token" in values and secret not in str(values)
    md = render_markdown(report)
    assert '`unit`: "nginx.service" → "app.service"' in md and secret not in md
    lines = run_diff(run).lines
    assert any("args_fp" in line for line in lines)
    assert '    unit: "nginx.service" -> "app.service"' in lines
    assert secret not in "\n".join(lines)


def test_a_utc_offset_the_output_prints_names_the_time_zone_among_many_differing_facts(tmp_path):
    """A predicate prints ``-0500``; the fingerprint says tz.utc_offset_s -18000 against 0, among
    facts that differ for other reasons: the cause names the time zone, not "no differing fact"."""
    hosts = {
        "local": fingerprint("devbox-ref", "a" * 16, tz={"TZ": None, "tzname": ["CST", "CDT"], "utc_offset_s": -18000}),
        "box-b": fingerprint(
            "box-b", "b" * 16, python="CPython 3.11.9", cpu_count=8, home="/home/ci", uid=1000,
        ),  # fmt: skip
    }
    attempts = {
        ("local", "report-date", 0): Attempt("pass", predicate_output="ok: stamped 2026-12-01T08:00:00-0500"),
        ("box-b", "report-date", 0): Attempt(
            "fail", why="predicate exited 1", predicate_output="FAIL: want a local stamp, got 2026-12-01T13:00:00+0000"
        ),
    }
    task = analyse_run(build_run(tmp_path, RunSpec(hosts=hosts, attempts=attempts))).tasks[0]
    fields = task.attribution[0].fields
    assert len(fields) > 4 and fields[0].field == "tz.utc_offset_s"
    assert fields[0].tied == "the task's output shows '-0500' (tz.utc_offset_s -18000)"
    assert task.cause.startswith("box-b: tz.utc_offset_s -18000 → 0")
    assert "no differing fact" not in task.cause
