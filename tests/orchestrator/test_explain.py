"""explain's choice of counterfactuals, how one is applied, its exit code and its evidence in a report."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.analysis import analyse_run
from orchestrator.analysis.models import Counterfactual, ExplainRecord, ExplainTask
from orchestrator.commands.explain import EnvFact, env_facts, with_fact
from orchestrator.exit_policy import explain_exit
from orchestrator.hosts.inventory import HostConfig
from orchestrator.report import render_markdown
from orchestrator.store.rundir import RunDir
from tests.support.rundirs import Attempt, RunSpec, build_run, fingerprint

ALLOW = ["PATH", "LANG", "LC_ALL", "TZ", "HTTP_PROXY"]


def test_facts_are_the_other_hosts_locale_tz_and_allowlisted_variables_it_lacks():
    ref = fingerprint("ref", "a" * 16, env_keys=["HTTP_PROXY", "LANG", "PATH", "PYENV_ROOT", "TZ"])
    other = fingerprint(
        "box-b",
        "b" * 16,
        env_keys=["PATH"],
        locale={"LANG": None, "LC_ALL": None},
        tz={"TZ": "Europe/Berlin"},
    )
    facts = env_facts(ref, other, "box-b", ALLOW)
    assert facts == [
        EnvFact("box-b", "LANG", None),
        EnvFact("box-b", "TZ", "Europe/Berlin"),
        EnvFact("box-b", "HTTP_PROXY", None),
    ]  # PYENV_ROOT is not allowlisted: no run of the reference sees it, so it explains nothing


def test_same_environment_gives_no_counterfactual():
    ref = fingerprint("ref", "a" * 16)
    assert env_facts(ref, fingerprint("box-b", "b" * 16, python="CPython 3.12.0"), "box-b", ALLOW) == []


def test_a_fact_pins_the_value_or_leaves_the_variable_out():
    cfg = HostConfig(name="local", transport="local", env={"LANG": "C.UTF-8"})
    unset = with_fact(EnvFact("box-b", "LANG", None))(cfg)
    assert "LANG" not in unset.env_allowlist and "LANG" not in unset.env
    berlin = with_fact(EnvFact("box-b", "TZ", "Europe/Berlin"))(cfg)
    assert berlin.env["TZ"] == "Europe/Berlin" and "TZ" in berlin.env_allowlist
    assert cfg.env == {"LANG": "C.UTF-8"} and "LANG" in cfg.env_allowlist  # the inventory entry is untouched


def test_explain_exit_codes():
    assert explain_exit({}) == 0
    assert explain_exit({"box-b": "unreachable"}) == 3
    assert explain_exit({}, 1) == 1 and explain_exit({"box-b": "x"}, 1) == 3
    assert explain_exit({"box-b": "x"}, 130) == 130 and explain_exit({}, 3) == 3


def test_a_reproducing_counterfactual_leads_the_cause_in_every_report(tmp_path: Path):
    hosts = {
        "local": fingerprint("devbox-ref", "a" * 16),
        "box-b": fingerprint("box-b", "b" * 16, locale={"LANG": None, "LC_ALL": None}),
    }
    attempts = {("local", "locale-probe", 0): Attempt("pass"), ("box-b", "locale-probe", 0): Attempt("fail")}
    run = build_run(tmp_path, RunSpec(hosts=hosts, attempts=attempts))
    record = ExplainRecord(
        run_id=run.name, reference="local", replays=2, seconds=3.5, max_counterfactuals=8,
        tasks=[ExplainTask(
            task="locale-probe", again={"local": "pass", "box-b": "fail"},
            counterfactuals=[Counterfactual(host="box-b", fact="LANG", value=None, verdict="fail", reproduces=True)],
            not_collected=["file evidence not collected: this crosshost does not trace file access yet"],
        )],
    )  # fmt: skip
    RunDir(run).explain_path.write_text(json.dumps(record.model_dump(mode="json")))
    report = analyse_run(run)
    [task] = report.tasks
    assert task.cause.startswith("with box-b's LANG (unset), local fails too; box-b: ")
    assert task.explain is not None and task.explain.counterfactuals[0].reproduces
    assert report.explain is not None and report.explain.startswith("explain: 2 replay(s) in 3.5 s")
    md = render_markdown(report)
    assert "- explain, local with box-b's LANG (unset): fail, reproduces the flip" in md
    assert "- explain: file evidence not collected" in md


def test_a_damaged_explain_json_is_a_problem_not_a_crash(tmp_path: Path):
    hosts = {"local": fingerprint("devbox-ref", "a" * 16), "box-b": fingerprint("box-b", "b" * 16)}
    attempts = {("local", "t", 0): Attempt("pass"), ("box-b", "t", 0): Attempt("fail")}
    run = build_run(tmp_path, RunSpec(hosts=hosts, attempts=attempts))
    RunDir(run).explain_path.write_text("{not json")
    report = analyse_run(run)
    assert any("explain.json: unreadable explain evidence" in p for p in report.problems)
    assert report.tasks[0].explain is None


def test_an_unknown_task_is_bad_input_in_one_line(tmp_path: Path):
    from typer.testing import CliRunner

    from orchestrator.cli import app

    hosts = {"local": fingerprint("devbox-ref", "a" * 16), "box-b": fingerprint("box-b", "b" * 16)}
    run = build_run(
        tmp_path,
        RunSpec(
            hosts=hosts, attempts={("local", "t", 0): Attempt("pass"), ("box-b", "t", 0): Attempt("fail")}
        ),
    )
    result = CliRunner().invoke(app, ["explain", str(run), "--task", "nope"])
    assert result.exit_code == 2
    assert "--task 'nope' is not a task of this run" in result.output and "Traceback" not in result.output


def test_a_run_whose_suite_is_gone_is_bad_input(tmp_path: Path):
    from typer.testing import CliRunner

    from orchestrator.cli import app

    hosts = {"local": fingerprint("devbox-ref", "a" * 16), "box-b": fingerprint("box-b", "b" * 16)}
    run = build_run(
        tmp_path,
        RunSpec(
            hosts=hosts, attempts={("local", "t", 0): Attempt("pass"), ("box-b", "t", 0): Attempt("fail")}
        ),
    )
    result = CliRunner().invoke(app, ["explain", str(run)])
    assert result.exit_code == 2
    assert "the run's suite is not on this machine" in result.output and "Traceback" not in result.output


def test_a_differing_path_reads_as_a_sentence_and_leads_the_cause():
    from orchestrator.analysis.attribution import explain_cause, path_line
    from orchestrator.analysis.models import PathEvidence

    flag = PathEvidence(
        path="/opt/crosshost-demo/feature.flag", calls=["newfstatat"], touched_on=["local", "box-b"],
        state={"local": "absent", "box-b": "file 0 bytes sha256 e3b0c44298fc1c14"},
    )  # fmt: skip
    assert path_line(flag) == (
        "run_tests.sh looked up /opt/crosshost-demo/feature.flag: "
        "present on box-b (file 0 bytes sha256 e3b0c44298fc1c14), absent on local"
    )
    wheels = PathEvidence(path="/tmp/w", calls=["openat"], state={"local": "directory of 1 entries", "box-b": "absent"})
    assert path_line(wheels).startswith("run_tests.sh read /tmp/w: present on local")
    entry = ExplainTask(task="t", paths=[flag, wheels, flag])
    cause = explain_cause(entry, "local")
    assert cause.startswith("run_tests.sh looked up /opt/crosshost-demo/feature.flag") and "1 more differing path(s)" in cause


def test_path_states_give_digests_of_world_readable_files_only(tmp_path: Path):
    from orchestrator.commands.explain import path_states
    from orchestrator.hosts.transport import open_host

    public, private = tmp_path / "flag", tmp_path / "token"
    public.write_text("on\n")
    public.chmod(0o644)
    private.write_text("s3cr3t\n")
    private.chmod(0o600)
    cfg = HostConfig(name="local", transport="local")
    states = path_states(cfg, [str(public), str(private), str(tmp_path / "gone"), str(tmp_path)], open_host, False)
    assert states[str(public)].startswith("file 3 bytes sha256 ")
    assert states[str(private)] == "file 7 bytes, not world-readable (no digest)"
    assert states[str(tmp_path / "gone")] == "absent"
    assert states[str(tmp_path)] == "directory of 2 entries"


def test_the_other_hosts_path_is_a_fact_only_when_both_are_known_and_differ():
    from orchestrator.commands.explain import path_fact

    paths = {"local": "/usr/bin:/bin", "box-b": "/opt/bin:/usr/bin:/bin", "box-c": "/usr/bin:/bin"}
    assert path_fact(paths, "local", "box-b") == [EnvFact("box-b", "PATH", "/opt/bin:/usr/bin:/bin")]
    assert path_fact(paths, "local", "box-c") == [] and path_fact(paths, "local", "box-d") == []
    # the fingerprint's names never make an "unset PATH" fact: every attempt has a PATH
    ref = fingerprint("ref", "a" * 16, env_keys=["LANG", "PATH"])
    assert env_facts(ref, fingerprint("box-b", "b" * 16, env_keys=["LANG"]), "box-b", ALLOW) == []


def test_a_path_both_hosts_looked_up_outranks_one_only_one_host_touched():
    from orchestrator.analysis.models import PathEvidence
    from orchestrator.commands.explain import _ranked

    hosts = ["local", "box-b"]
    interpreter = PathEvidence(path="/a/python3", calls=["execve"], touched_on=["local"], by=["agent"],
                               state={"local": "file 9 bytes", "box-b": "absent"})  # fmt: skip
    flag = PathEvidence(path="/z/flag", calls=["newfstatat"], touched_on=hosts, by=["agent"],
                        state={"local": "absent", "box-b": "file 0 bytes"})  # fmt: skip
    changed = PathEvidence(path="/b/conf", calls=["openat"], touched_on=hosts, state={"local": "file 1 bytes", "box-b": "file 2 bytes"})
    assert _ranked([interpreter, changed, flag], hosts) == [flag, changed, interpreter]
    from orchestrator.analysis.attribution import path_line

    assert path_line(flag).startswith("the agent looked up /z/flag: present on box-b")
    both = flag.model_copy(update={"by": ["predicate", "agent"]})
    assert path_line(both).startswith("run_tests.sh and the agent looked up /z/flag")


def test_an_entry_of_a_directory_one_host_lacks_leads_its_directory():
    """The demo's stale wheel: both hosts list the cache directory, only local finds the wheel in it."""
    from orchestrator.analysis.models import PathEvidence
    from orchestrator.commands.explain import _ranked

    hosts = ["local", "box-b"]
    cache = PathEvidence(path="/tmp/w", calls=["openat"], touched_on=hosts,
                         state={"local": "directory of 1 entries", "box-b": "absent"})  # fmt: skip
    wheel = PathEvidence(path="/tmp/w/x.whl", calls=["statx"], touched_on=["local"],
                         state={"local": "file 0 bytes", "box-b": "absent"})  # fmt: skip
    elsewhere = PathEvidence(path="/opt/py/lib.so", calls=["openat"], touched_on=["local"],
                             state={"local": "file 9 bytes", "box-b": "absent"})  # fmt: skip
    assert _ranked([elsewhere, cache, wheel], hosts) == [wheel, cache, elsewhere]
