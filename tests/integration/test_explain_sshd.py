"""crosshost explain against a real sshd host: what it names, what it leaves, what it spends.

box-c has its own /opt holding the demo's feature flag and runs without LANG; the controller's
``local`` pins LANG=C.UTF-8. Two tasks flip: ``locale-probe`` (the environment) and
``feature-flag-probe`` (a file). Explain must name box-c's LANG as the cause of the first by a
counterfactual, must not pretend an environment fact explains the second, and must leave nothing on
either host.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from orchestrator.commands.explain import ExplainRequest, explain
from orchestrator.commands.replay import ReplayRequest, replay
from tests.integration.test_replay_sshd import TRIAGE, _left_of_run

pytestmark = pytest.mark.sshd


def _inventory(hosts: Any, tmp_path: Path) -> Path:
    """The fleet's inventory with local's LANG pinned and box-c's LANG kept out of its runs."""
    text = hosts.inventory_path.read_text()
    text = text.replace('transport = "local"', 'transport = "local"\nenv = { LANG = "C.UTF-8" }', 1)
    text = text.replace('name = "box-c"', 'name = "box-c"\nenv_allowlist = ["PATH", "LC_ALL", "TZ"]', 1)
    path = tmp_path / "hosts.toml"
    path.write_text(text)
    return path


def test_explain_names_the_locale_counterfactual_and_leaves_nothing(
    fresh_sshd_host: Any, tmp_path: Path
) -> None:
    flag = fresh_sshd_host.fleet.hosts["box-c"].dir / "opt" / "crosshost-demo" / "feature.flag"
    flag.parent.mkdir(parents=True)
    flag.touch()
    inventory = _inventory(fresh_sshd_host, tmp_path)
    tasks = ["locale-probe", "feature-flag-probe", "restart-unhealthy-only"]
    run = replay(
        ReplayRequest(
            suite_dir=TRIAGE, inventory_path=inventory, out=tmp_path / "runs", tasks=tasks, repeat=1
        )
    )
    report = run.report
    assert report is not None
    flipped = {t.task for t in report.tasks if t.flip}
    assert flipped == {"locale-probe", "feature-flag-probe"}, [(t.task, t.verdicts) for t in report.tasks]
    # ranked before explain: the task that prints LANG has it first; the flag task names no fact
    by_task = {t.task: t for t in report.tasks}
    assert by_task["locale-probe"].attribution[0].fields[0].field == "locale.LANG"
    assert "no differing fact named by the task" in by_task["feature-flag-probe"].cause

    out = explain(ExplainRequest(run_dir=run.run_dir.path, inventory_path=inventory))
    assert out.exit_code == 0 and not out.errors, out.errors
    record = json.loads((run.run_dir.path / "explain.json").read_text())
    entries = {t["task"]: t for t in record["tasks"]}
    assert set(entries) == flipped
    locale = entries["locale-probe"]
    assert locale["again"] == {"local": "pass", "box-c": "fail"}  # the flip holds when replayed once more
    lang = next(cf for cf in locale["counterfactuals"] if cf["fact"] == "LANG")
    assert (lang["host"], lang["value"], lang["verdict"], lang["reproduces"]) == ("box-c", None, "fail", True)
    flag_entry = entries["feature-flag-probe"]
    assert not any(cf["reproduces"] for cf in flag_entry["counterfactuals"])
    # file evidence: strace saw the predicate look for the flag; its state differs, and only it does
    [flag_path] = [p for p in flag_entry["paths"] if p["path"] == "/opt/crosshost-demo/feature.flag"]
    assert flag_path["state"]["local"] == "absent" and flag_path["state"]["box-c"].startswith(
        "file 0 bytes sha256 "
    )
    assert flag_path["touched_on"] == ["local", "box-c"]
    assert (
        flag_entry["not_collected"] == [] and locale["paths"] == []
    )  # the locale task read no differing file
    assert record["replays"] == 1 + len(
        {(cf["host"], cf["fact"]) for t in record["tasks"] for cf in t["counterfactuals"]}
    )
    assert record["replays"] <= 1 + record["max_counterfactuals"]

    # every report carries it: the cause first, the counterfactual in report.md, the cost once
    report_json = json.loads((run.run_dir.path / "report.json").read_text())
    causes = {t["task"]: t["cause"] for t in report_json["tasks"]}
    assert causes["locale-probe"].startswith("with box-c's LANG (unset), local fails too")
    assert (
        causes["feature-flag-probe"].startswith(
            "run_tests.sh looked up /opt/crosshost-demo/feature.flag: present on box-c (file 0 bytes sha256 "
        )
        and "absent on local" in causes["feature-flag-probe"]
    )
    assert "crosshost explain looks further" not in causes["feature-flag-probe"]  # it did
    md = (run.run_dir.path / "report.md").read_text()
    assert "local with box-c's LANG (unset): fail, reproduces the flip" in md
    assert report_json["explain"].startswith(f"explain: {record['replays']} replay(s) in ")

    # no residue of explain's own runs on either host
    for run_id in record["runs"]:
        assert _left_of_run(inventory, run_id) == {"local": "", "box-c": ""}


def test_a_host_without_strace_gets_counterfactuals_and_a_plain_line(
    fresh_sshd_host: Any, tmp_path: Path
) -> None:
    """box-c's runs see a PATH without strace: its file evidence is said to be missing, not guessed."""
    flag = fresh_sshd_host.fleet.hosts["box-c"].dir / "opt" / "crosshost-demo" / "feature.flag"
    flag.parent.mkdir(parents=True)
    flag.touch()
    bare = Path(tempfile.mkdtemp(prefix="crosshost-nostrace-", dir="/var/tmp"))  # box-c sees /var/tmp
    try:
        for tool in ("sh", "python3", "wc", "tr", "ls", "head", "cat", "env"):
            found = shutil.which(tool, path="/usr/local/bin:/usr/bin:/bin")  # not the test's venv
            assert found is not None, tool
            (bare / tool).symlink_to(found)
        inventory = _inventory(fresh_sshd_host, tmp_path)
        text = inventory.read_text().replace(
            'env_allowlist = ["PATH", "LC_ALL", "TZ"]',
            f'env_allowlist = ["PATH", "LC_ALL", "TZ"]\nenv = {{ PATH = "{bare}" }}',
        )
        inventory.write_text(text)
        run = replay(
            ReplayRequest(
                suite_dir=TRIAGE,
                inventory_path=inventory,
                out=tmp_path / "runs",
                tasks=["locale-probe", "feature-flag-probe"],
                repeat=1,
            )  # fmt: skip
        )
        out = explain(ExplainRequest(run_dir=run.run_dir.path, inventory_path=inventory))
        assert out.exit_code == 0 and not out.errors, out.errors
        entries = {t.task: t for t in out.record.tasks}
        for entry in entries.values():
            assert entry.not_collected == [
                "file evidence not collected on box-c: strace is not in this host's system directories"
            ]
        assert any(cf.fact == "LANG" and cf.reproduces for cf in entries["locale-probe"].counterfactuals)
        # local's trace still names the flag; its state is checked on both hosts
        [flag_path] = [
            p for p in entries["feature-flag-probe"].paths if p.path == "/opt/crosshost-demo/feature.flag"
        ]
        assert flag_path.touched_on == ["local"] and flag_path.state["local"] == "absent"
        md = (run.run_dir.path / "report.md").read_text()
        assert "- explain: file evidence not collected on box-c: strace is not in this host's system directories" in md
    finally:
        shutil.rmtree(bare)


def test_a_stale_wheel_in_one_hosts_tmp_is_named_by_its_path(fresh_sshd_host: Any, tmp_path: Path) -> None:
    """The demo's stale-wheel-probe with the wheel in box-c's own /tmp (this machine's /tmp is shared
    with whatever else runs here): explain names the wheel first, then the cache directory."""
    wheels = fresh_sshd_host.fleet.hosts["box-c"].dir / "tmp" / "crosshost-demo" / "wheels"
    wheels.mkdir(parents=True)
    (wheels / "triage_tools-0.9-py3-none-any.whl").touch()
    inventory = fresh_sshd_host.inventory_path
    run = replay(
        ReplayRequest(
            suite_dir=TRIAGE, inventory_path=inventory, out=tmp_path / "runs", tasks=["stale-wheel-probe"], repeat=1
        )
    )
    assert run.report is not None and [t.flip for t in run.report.tasks] == [True]
    out = explain(ExplainRequest(run_dir=run.run_dir.path, inventory_path=inventory))
    assert out.exit_code == 0 and not out.errors, out.errors
    [entry] = out.record.tasks
    wheel = "/tmp/crosshost-demo/wheels/triage_tools-0.9-py3-none-any.whl"
    assert [p.path for p in entry.paths[:2]] == [wheel, "/tmp/crosshost-demo/wheels"]
    assert entry.paths[0].state["local"] == "absent" and entry.paths[0].state["box-c"].startswith("file 0 bytes")
    assert out.report is not None
    assert out.report.tasks[0].cause.startswith(f"run_tests.sh looked up {wheel}: present on box-c (file 0 bytes")


def _tool_suite(root: Path) -> Path:
    """One predicate-only task that fails where a ``demo-tool`` is on PATH."""
    suite = root / "tool"
    suite.mkdir()
    shutil.copy(TRIAGE / "contract.json", suite / "contract.json")
    shutil.copy(TRIAGE / "tools.json", suite / "tools.json")
    (suite / "suite.toml").write_text(
        'name = "tool"\nrepeat = 1\ncontract = "contract.json"\ntools = "tools.json"\n'
        '[agent]\nkind = "none"\n[budget]\nmax_steps = 2\nmax_bytes = 4096\ntimeout_s = 30\n'
    )
    task = suite / "tasks" / "tool-probe"
    (task / "repo").mkdir(parents=True)
    (task / "task.toml").write_text('description = "fails where demo-tool is installed"\n[agent]\nkind = "none"\n')
    (task / "prompt.md").write_text("nothing to do\n")
    script = task / "repo" / "run_tests.sh"
    script.write_text('#!/bin/sh\nif demo-tool >/dev/null 2>&1; then echo "FAIL: the new tool answered"; exit 1; fi\necho ok\n')
    script.chmod(0o755)
    return suite


def test_a_command_on_one_hosts_path_is_named_by_its_executable(fresh_sshd_host: Any, tmp_path: Path) -> None:
    tool = fresh_sshd_host.fleet.hosts["box-c"].dir / "opt" / "bin" / "demo-tool"  # box-c's own /opt
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    inventory = tmp_path / "hosts.toml"
    path = "/opt/bin:/usr/local/bin:/usr/bin:/bin"
    text = fresh_sshd_host.inventory_path.read_text()
    text = text.replace('transport = "local"', f'transport = "local"\nenv = {{ PATH = "{path}" }}', 1)
    text = text.replace('name = "box-c"', f'name = "box-c"\nenv = {{ PATH = "{path}" }}', 1)
    inventory.write_text(text)
    run = replay(ReplayRequest(suite_dir=_tool_suite(tmp_path), inventory_path=inventory, out=tmp_path / "runs"))
    assert run.report is not None and [t.flip for t in run.report.tasks] == [True]
    out = explain(ExplainRequest(run_dir=run.run_dir.path, inventory_path=inventory))
    assert out.exit_code == 0, out.errors
    [entry] = out.record.tasks
    [differing] = [p for p in entry.paths if p.path == "/opt/bin/demo-tool"]
    assert "execve" in differing.calls
    assert differing.state["local"] == "absent" and differing.state["box-c"].startswith("file ")
    assert out.report is not None
    assert out.report.tasks[0].cause.startswith("run_tests.sh executed /opt/bin/demo-tool: present on box-c")


_READER = """import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from protocol import call, final, task
task()
if sys.argv[1] == "itself":  # the agent's own process looks for the file
    new = os.path.exists("/opt/crosshost-demo/agent.flag")
else:  # a tool process it asks for reads it
    new = call("shell", {"argv": ["cat", "/opt/crosshost-demo/tool.flag"]}).startswith("exit 0")
call("write_file", {"path": "mode.txt", "content": "new" if new else "old"})
final("done")
"""


def _agent_suite(root: Path) -> Path:
    """Two command-agent tasks whose agent (not the predicate) reads a file of box-c's /opt: itself, or
    through a shell tool; each predicate reads only the workspace."""
    suite = root / "agents"
    (suite / "agent").mkdir(parents=True)
    # no path invariant: the tool's argument names a path of /opt on purpose
    (suite / "contract.json").write_text(json.dumps({
        "contract_id": "agents.v1", "invariants": [],
        "tools": [{"name": "shell", "required_args": ["argv"]}, {"name": "write_file", "required_args": ["path", "content"]}],
    }))  # fmt: skip
    shutil.copy(TRIAGE / "tools.json", suite / "tools.json")
    shutil.copy(TRIAGE / "agent" / "protocol.py", suite / "agent" / "protocol.py")
    (suite / "agent" / "reader.py").write_text(_READER)
    (suite / "suite.toml").write_text(
        'name = "agents"\nrepeat = 1\ncontract = "contract.json"\ntools = "tools.json"\n'
        '[agent]\nkind = "none"\n[budget]\nmax_steps = 4\nmax_bytes = 8192\ntimeout_s = 30\n'
    )
    for name, how in (("agent-reads", "itself"), ("tool-reads", "tool")):
        task = suite / "tasks" / name
        (task / "repo").mkdir(parents=True)
        (task / "task.toml").write_text(
            f'description = "the agent decides by a host file"\n[agent]\nkind = "command"\n'
            f'command = ["python3", "{{suite}}/agent/reader.py", "{how}"]\n'
        )
        (task / "prompt.md").write_text("write mode.txt\n")
        script = task / "repo" / "run_tests.sh"
        script.write_text('#!/bin/sh\n[ "$(cat mode.txt)" = old ] || { echo "FAIL: new mode"; exit 1; }\necho ok\n')
        script.chmod(0o755)
    return suite


def test_a_file_only_the_agent_reads_is_named_by_its_path(fresh_sshd_host: Any, tmp_path: Path) -> None:
    """The agent's processes (the command agent itself, the tool processes it asks for) run under the
    trace too: a file of one host's /opt that only they read explains the flip, said as the agent's."""
    opt = fresh_sshd_host.fleet.hosts["box-c"].dir / "opt" / "crosshost-demo"
    opt.mkdir(parents=True)
    (opt / "agent.flag").touch()
    (opt / "tool.flag").write_text("on\n")
    inventory = fresh_sshd_host.inventory_path
    run = replay(ReplayRequest(suite_dir=_agent_suite(tmp_path), inventory_path=inventory, out=tmp_path / "runs"))
    assert run.report is not None
    assert {t.task: t.flip for t in run.report.tasks} == {"agent-reads": True, "tool-reads": True}, [
        (t.task, t.verdicts, t.why) for t in run.report.tasks
    ]
    out = explain(ExplainRequest(run_dir=run.run_dir.path, inventory_path=inventory))
    assert out.exit_code == 0 and not out.errors, out.errors
    entries = {t.task: t for t in out.record.tasks}
    for task, flag, verb in (("agent-reads", "agent.flag", "looked up"), ("tool-reads", "tool.flag", "read")):
        entry = entries[task]
        assert entry.not_collected == []
        [first, *_] = entry.paths
        assert (first.path, first.by, first.touched_on) == (f"/opt/crosshost-demo/{flag}", ["agent"], ["local", "box-c"])
        assert first.state["local"] == "absent" and first.state["box-c"].startswith("file ")
        # the attempt's own directories, the suite and the runner's files are not evidence
        assert not [p.path for p in entry.paths if "/crosshost" in p.path and "crosshost-demo" not in p.path], [
            (p.path, p.state) for p in entry.paths
        ]
        assert out.report is not None
        cause = next(t.cause for t in out.report.tasks if t.task == task)
        assert cause.startswith(f"the agent {verb} /opt/crosshost-demo/{flag}: present on box-c (file "), cause
        assert cause.endswith("absent on local") or "absent on local;" in cause, cause
    for run_id in out.record.runs:
        assert _left_of_run(inventory, run_id) == {"local": "", "box-c": ""}


def test_a_path_that_finds_a_command_is_named_by_the_path_counterfactual(
    fresh_sshd_host: Any, tmp_path: Path
) -> None:
    """The same demo-tool on both hosts (a directory both see), on box-c's PATH only: no file differs,
    and box-c's PATH applied on local reproduces the flip."""
    shared = Path(tempfile.mkdtemp(prefix="crosshost-pathtool-", dir="/var/tmp"))  # box-c sees /var/tmp
    try:
        (shared / "demo-tool").write_text("#!/bin/sh\nexit 0\n")
        (shared / "demo-tool").chmod(0o755)
        shared.chmod(0o755)
        plain = "/usr/local/bin:/usr/bin:/bin"
        text = fresh_sshd_host.inventory_path.read_text()
        text = text.replace('transport = "local"', f'transport = "local"\nenv = {{ PATH = "{plain}" }}', 1)
        text = text.replace('name = "box-c"', f'name = "box-c"\nenv = {{ PATH = "{shared}:{plain}" }}', 1)
        inventory = tmp_path / "hosts.toml"
        inventory.write_text(text)
        run = replay(ReplayRequest(suite_dir=_tool_suite(tmp_path), inventory_path=inventory, out=tmp_path / "runs"))
        assert run.report is not None and [t.flip for t in run.report.tasks] == [True]
        out = explain(ExplainRequest(run_dir=run.run_dir.path, inventory_path=inventory))
        assert out.exit_code == 0, out.errors
        [entry] = out.record.tasks
        [path_cf] = [cf for cf in entry.counterfactuals if cf.fact == "PATH"]
        assert (path_cf.host, path_cf.value, path_cf.verdict, path_cf.reproduces) == (
            "box-c", f"{shared}:{plain}", "fail", True
        )
        assert not [p for p in entry.paths if p.path.startswith(str(shared))]  # the same file on both hosts
        assert out.report is not None
        assert out.report.tasks[0].cause.startswith(f"with box-c's PATH ({shared}:{plain}), local fails too")
    finally:
        shutil.rmtree(shared)


def test_an_exec_agents_own_file_is_named_by_its_path(
    fresh_sshd_host: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exec agent (a program of its own, here one that asks no model) runs under the trace too."""
    monkeypatch.setenv("CROSSHOST_IT_EXPLAIN_KEY", "sk-" + "e" * 32)
    opt = fresh_sshd_host.fleet.hosts["box-c"].dir / "opt" / "crosshost-demo"
    opt.mkdir(parents=True)
    (opt / "exec.flag").touch()
    suite = tmp_path / "exec"
    (suite / "tasks" / "decide" / "repo").mkdir(parents=True)
    program = "if [ -e /opt/crosshost-demo/exec.flag ]; then echo new > mode.txt; else echo old > mode.txt; fi"
    (suite / "suite.toml").write_text(
        'name = "exec"\nrepeat = 1\n[agent]\nkind = "exec"\n'
        f"command = {json.dumps(['/bin/sh', '-c', program])}\n"
        'api = "openai"\nmodel = "m1"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'api_key_env = "CROSSHOST_IT_EXPLAIN_KEY"\nsampled = false\n[budget]\nmax_steps = 2\ntimeout_s = 30\n'
    )
    (suite / "contract.json").write_text(json.dumps({"contract_id": "exec.v1", "tools": [], "invariants": []}))
    (suite / "tools.json").write_text(json.dumps({"allow": [], "deny": []}))
    task = suite / "tasks" / "decide"
    (task / "task.toml").write_text("")
    (task / "prompt.md").write_text("decide\n")
    (task / "repo" / "run_tests.sh").write_text('[ "$(cat mode.txt)" = old ] || { echo "FAIL: new mode"; exit 1; }\n')
    inventory = fresh_sshd_host.inventory_path
    run = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs"))
    assert run.report is not None and [t.flip for t in run.report.tasks] == [True], [
        (t.task, t.verdicts, t.why) for t in run.report.tasks
    ]
    out = explain(ExplainRequest(run_dir=run.run_dir.path, inventory_path=inventory))
    assert out.exit_code == 0 and not out.errors, out.errors
    [entry] = out.record.tasks
    assert entry.paths[0].path == "/opt/crosshost-demo/exec.flag" and entry.paths[0].by == ["agent"]
    assert out.report is not None
    assert out.report.tasks[0].cause.startswith("the agent looked up /opt/crosshost-demo/exec.flag: present on box-c")
