"""What runs under test cannot reach the harness, on `local` and on real sshd hosts.

What a user relies on: an attempt cannot read the controller's or the runner's environment (its
secrets, the model URL); an agent that rewrites the host's bundle cache changes nothing for the next
run; no process or late file of a run remains after a normal end, a timeout or Ctrl-C (checked in
/proc, which the sshd test hosts share with this process); a file an attempt wrote outside its
workspace is a warning in report.json, report.md and on the terminal, and it and the run are kept valid;
a host that gives no isolation is a burn finding the report shows.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from orchestrator.commands.replay import ReplayRequest, replay
from orchestrator.hosts.transport import open_host
from orchestrator.store.jsonl import read_jsonl
from orchestrator.ui import render_replay
from tests.support.runner import write_suite

pytestmark = pytest.mark.sshd

REPO = Path(__file__).resolve().parents[2]
TRIAGE = REPO / "examples" / "suites" / "triage"
HOSTS = ("local", "box-a", "box-b")
SECRET = "sk-crosshost-isolation-7d2e"
MODEL_URL = "http://127.0.0.1:9/crosshost-isolation-model"

#: walks every process it can see (its ancestors among them) and fails when one's environment holds
#: the controller's secret or the model URL
ENVIRON_PROBE = f"""#!/bin/sh
found=""
for f in /proc/[0-9]*/environ; do
  if tr '\\000' '\\n' < "$f" 2>/dev/null | grep -q -e '{SECRET}' -e 'crosshost-isolation-model'; then found="$found $f"; fi
done
p=$$
while test "$p" -gt 1 2>/dev/null; do
  if tr '\\000' '\\n' < /proc/$p/environ 2>/dev/null | grep -q -e '{SECRET}' -e 'crosshost-isolation-model'; then found="$found ancestor:$p"; fi
  p=$(sed -n 's/^PPid:[[:space:]]*//p' /proc/$p/status 2>/dev/null)
done
if test -n "$found"; then echo "LEAK in$found"; exit 1; fi
echo "ok: no secret in $(ls -d /proc/[0-9]* | wc -l) visible processes"
"""


def _suite(root: Path, name: str, tasks: dict[str, dict[str, str]], *, timeout_s: int = 20) -> Path:
    """A suite of ``tasks``: id -> {"predicate": sh text, "agent": python text (a command agent)}."""
    suite = root / name
    (suite / "agent").mkdir(parents=True)
    shutil.copy(TRIAGE / "contract.json", suite / "contract.json")
    shutil.copy(TRIAGE / "tools.json", suite / "tools.json")
    (suite / "suite.toml").write_text(
        f'name = "{name}"\nrepeat = 1\ncontract = "contract.json"\ntools = "tools.json"\n'
        f'[agent]\nkind = "none"\n[budget]\nmax_steps = 4\nmax_bytes = 8192\ntimeout_s = {timeout_s}\n'
    )
    for task_id, parts in tasks.items():
        task = suite / "tasks" / task_id
        (task / "repo").mkdir(parents=True)
        agent = '[agent]\nkind = "none"\n'
        if "agent" in parts:
            (suite / "agent" / f"{task_id}.py").write_text(parts["agent"])
            agent = f'[agent]\nkind = "command"\ncommand = ["python3", "{{suite}}/agent/{task_id}.py", "{{suite}}"]\n'
        (task / "task.toml").write_text(f'description = "{task_id}"\n{agent}')
        (task / "prompt.md").write_text("do it\n")
        script = task / "repo" / "run_tests.sh"
        script.write_text(parts["predicate"])
        script.chmod(0o755)
    return suite


def _agent(body: str) -> str:
    """A command agent that reads the task, runs ``body`` (which sets ``said``), and ends."""
    return (
        "import json, os, subprocess, sys\nsys.stdin.readline()\nsaid = ''\n"
        f"{body}\n"
        "print(json.dumps({'type': 'final', 'content': said}), flush=True)\n"
    )


def _rows(out: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["env"], r["task"]): r for r in read_jsonl(out.run_dir.results_path)}


def _alive_with(token: str) -> list[str]:
    """Processes on this machine (the test hosts share its PID namespace) whose command line has ``token``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmd:
                found.append(entry + ": " + cmd.replace(b"\0", b" ").decode(errors="replace"))
    return found


def _token() -> str:
    """Digits only: it is also part of a ``sleep`` duration, found again in /proc."""
    return f"{uuid.uuid4().int % 10**10:010d}"


def _tmp_of(sshd_hosts: Any, name: str) -> Path:
    """The host's /tmp as this process sees it (each sshd host binds its own)."""
    return Path("/tmp") if name == "local" else sshd_hosts.fleet.hosts[name].dir / "tmp"


def test_no_attempt_reads_the_controllers_or_the_runners_environment(
    sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("CROSSHOST_MODEL_URL", MODEL_URL)
    agent = _agent(
        "r = subprocess.run(['sh', 'run_tests.sh'], capture_output=True, text=True)\n"
        "said = r.stdout.strip()\n"
        "if r.returncode: open('agent-saw-leak', 'w').write(said)"
    )
    suite = _suite(tmp_path, "environ", {
        "predicate-probe": {"predicate": ENVIRON_PROBE},
        "agent-probe": {"predicate": ENVIRON_PROBE + "test ! -e agent-saw-leak || { cat agent-saw-leak; exit 1; }\n",
                        "agent": agent},
    })  # fmt: skip
    out = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs"),
                 with_analysis=False)  # fmt: skip
    rows = _rows(out)
    for name in HOSTS:
        rec = out.manifest.hosts[name]
        assert rec.error is None and rec.workspace_removed is True, (name, rec)
        fp = json.loads((out.run_dir.path / "hosts" / name / "fingerprint.json").read_text())
        assert fp["isolation"] == "netns+pidns+uid", (name, fp["isolation"])  # root: PID and network namespaces, a uid
        for task in ("predicate-probe", "agent-probe"):
            row = rows[(name, task)]
            assert row["verdict"] == "pass", (name, task, row["why"])
    for path in out.run_dir.path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert SECRET.encode() not in data and b"crosshost-isolation-model" not in data, path


POISON_PREDICATE = "#!/bin/sh\necho 'FAIL: the real test fails'\nexit 1\n"
POISON_AGENT = _agent(
    "target = os.path.join(sys.argv[1], 'tasks', 'poisoned', 'repo', 'run_tests.sh')\n"
    "for path in (os.path.dirname(target), target):\n"
    "    try:\n        os.chmod(path, 0o777)\n    except OSError:\n        pass\n"
    "try:\n"
    "    with open(target, 'w') as fh:\n        fh.write('#!/bin/sh\\necho poisoned\\nexit 0\\n')\n"
    "    said = 'poisoned the cache'\n"
    "except OSError as exc:\n    said = 'could not: %s' % exc"
)


def _cached_predicate(sshd_hosts: Any, name: str, bundle_sha: str) -> str:
    cfg = sshd_hosts.config(name)
    host = open_host(cfg)
    try:
        path = f"{cfg.workspace_root}/bundles/{bundle_sha}/suite/tasks/poisoned/repo/run_tests.sh"
        return host.exec(["cat", path], 30).stdout
    finally:
        host.close()


def test_an_agent_that_rewrites_the_bundle_cache_changes_nothing_for_the_next_run(
    sshd_hosts: Any, tmp_path: Path
) -> None:
    suite = _suite(tmp_path, "poison", {"poisoned": {"predicate": POISON_PREDICATE, "agent": POISON_AGENT}})
    runs = tmp_path / "runs"
    for _ in range(2):
        out = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=runs),
                     with_analysis=False)  # fmt: skip
        rows = _rows(out)
        for name in HOSTS:
            assert out.manifest.hosts[name].error is None, (name, out.manifest.hosts[name])
            assert rows[(name, "poisoned")]["verdict"] == "fail", (name, rows[(name, "poisoned")])
            assert rows[(name, "poisoned")]["exit_code"] == 1
            assert _cached_predicate(sshd_hosts, name, out.manifest.bundle_sha or "") == POISON_PREDICATE
    # Where the attempt could write (a runner of the same uid), the next run finds the change, says so,
    # and replaces the bundle before using it.
    sha = out.manifest.bundle_sha or ""
    for name in HOSTS:
        cfg = sshd_hosts.config(name)
        host = open_host(cfg)
        try:
            target = f"{cfg.workspace_root}/bundles/{sha}/suite/tasks/poisoned/repo/run_tests.sh"
            assert host.exec(["sh", "-c", f"chmod u+w {target} && printf 'exit 0\\n' > {target}"], 30).ok
        finally:
            host.close()
    out = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=runs),
                 with_analysis=False)  # fmt: skip
    rows = _rows(out)
    for name in HOSTS:
        rec = out.manifest.hosts[name]
        assert rec.bundle_replaced is True and rec.bundle_pushed is True, (name, rec)
        assert rows[(name, "poisoned")]["verdict"] == "fail"
        assert _cached_predicate(sshd_hosts, name, sha) == POISON_PREDICATE
    manifest = json.loads((out.run_dir.path / "manifest.json").read_text())
    assert all(manifest["hosts"][name]["bundle_replaced"] is True for name in HOSTS)


#: how long after it starts a left-behind process writes its late file
LATE_S = 8


def _leaver(token: str, *, stray: bool = False) -> dict[str, str]:
    """A predicate and an agent that each leave a detached process behind (its own session) that
    writes a late file; the agent also writes a stray file outside its workspace (``stray``)."""
    late = f"setsid sh -c 'sleep {LATE_S}; echo late > /tmp/late-{token}-$0' %s < /dev/null > /dev/null 2>&1 &"
    return {
        "predicate": f"#!/bin/sh\n{late % 'predicate'}\nsleep 307.{token[:3]}1 &\necho ok\n",
        "agent": _agent(
            f"subprocess.Popen(['setsid', 'sh', '-c', 'sleep {LATE_S}; echo late > /tmp/late-{token}-agent; "
            f"sleep 307.{token[:3]}2'], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, "
            "stderr=subprocess.DEVNULL)\n"
            + (f"open('/tmp/stray-{token}', 'w').write('x')\n" if stray else "")
            + "said = 'left things behind'"
        ),
    }


def _nothing_left(sshd_hosts: Any, token: str, *, wait_s: float = LATE_S + 1) -> None:
    """No process of the run, and after the late writers' delay no late file, on any host."""
    assert _alive_with(token) == []
    assert _alive_with(f"307.{token[:3]}") == []
    time.sleep(wait_s)
    for name in HOSTS:
        left = sorted(p.name for p in _tmp_of(sshd_hosts, name).glob(f"*{token}*"))
        assert left == [], (name, left)


def test_nothing_of_a_run_outlives_a_normal_end(sshd_hosts: Any, tmp_path: Path) -> None:
    token = _token()
    suite = _suite(tmp_path, "leaver", {"leaver": _leaver(token, stray=True)})
    out = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs"))
    rows = _rows(out)
    report = json.loads((out.run_dir.path / "report.json").read_text())
    markdown = (out.run_dir.path / "report.md").read_text()
    terminal = Console(width=400, record=True)
    render_replay(out, out=terminal, err=terminal)
    shown = terminal.export_text()
    for name in HOSTS:
        rec = out.manifest.hosts[name]
        assert rec.error is None and rec.workspace_removed is True, (name, rec)
        # the file it wrote outside its workspace is a warning in every report, not a verdict
        assert rows[(name, "leaver")]["verdict"] == "pass", (name, rows[(name, "leaver")])
        trace = out.run_dir.path / "hosts" / name / "traces" / "leaver.0.jsonl"
        finish = json.loads(trace.read_text().splitlines()[-1])
        assert finish["outside_workspace"] == [f"/tmp/stray-{token}"], (name, finish)
        assert {"host": name, "task": "leaver", "attempt": 0, "paths": [f"/tmp/stray-{token}"],
                "count": 1} in report["outside_workspace"]  # fmt: skip
        line = f"warning: {name}: leaver.0 left 1 file(s) outside its workspace, kept on the host (not a verdict): "
        assert f"- {line}/tmp/stray-{token}" in markdown
        assert f"{line}/tmp/stray-{token}" in shown
        (_tmp_of(sshd_hosts, name) / f"stray-{token}").unlink()
    assert report["valid"] is True and out.exit_code == 0
    _nothing_left(sshd_hosts, token)


def test_nothing_of_a_run_outlives_a_timeout(sshd_hosts: Any, tmp_path: Path) -> None:
    token = _token()
    parts = _leaver(token)
    parts["predicate"] = parts["predicate"].replace("echo ok\n", "sleep 60\n")  # past the budget
    suite = _suite(tmp_path, "leaver", {"leaver": parts}, timeout_s=3)
    out = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs"),
                 with_analysis=False)  # fmt: skip
    rows = _rows(out)
    for name in HOSTS:
        assert out.manifest.hosts[name].workspace_removed is True, (name, out.manifest.hosts[name])
        assert rows[(name, "leaver")]["exit_code"] == 124, rows[(name, "leaver")]  # the predicate timed out
    _nothing_left(sshd_hosts, token)


def test_nothing_of_a_run_outlives_ctrl_c(sshd_hosts: Any, tmp_path: Path) -> None:
    token = _token()
    parts = _leaver(token)
    parts["predicate"] = parts["predicate"].replace("echo ok\n", "sleep 60\n")  # still running at Ctrl-C
    suite = _suite(tmp_path, "leaver", {"leaver": parts}, timeout_s=120)

    def hook(host: str, stage: str, detail: str) -> None:
        if host == "box-a" and stage == "run":
            deadline = time.monotonic() + 20
            # the other hosts' predicates are running: their sleepers are up
            while time.monotonic() < deadline and len(_alive_with(f"307.{token[:3]}1")) < len(HOSTS) - 1:
                time.sleep(0.2)
            raise KeyboardInterrupt

    out = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs",
                               jobs=3), on_event=hook, with_analysis=False)  # fmt: skip
    assert out.exit_code == 130
    for name in HOSTS:
        assert out.manifest.hosts[name].workspace_removed is not False, (name, out.manifest.hosts[name])
    _nothing_left(sshd_hosts, token)


def test_a_leftover_process_means_the_workspace_is_not_cleaned(tmp_path: Path) -> None:
    """The cleanup check looks for processes as well as files: one still running in the workspace
    (here started beside the runner, as an escaped process would be) is killed, and when it cannot be
    the workspace is not reported removed."""
    from orchestrator.hosts.transport.local import LocalHost
    from orchestrator.hosts.workspace import Workspace

    ws = Workspace(LocalHost("box"), "box", str(tmp_path / "root"), "r1")
    ws.create()
    token = _token()
    proc = subprocess.Popen(["sh", "-c", f"sleep 301; : {token}"], cwd=ws.path, start_new_session=True)
    try:
        time.sleep(0.3)
        ws.remove()
        assert proc.wait(timeout=10) == -9  # killed by the cleanup
        assert not Path(ws.path).exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_host_that_gives_no_isolation_is_a_burn_finding_the_report_shows(sshd_hosts: Any, tmp_path: Path) -> None:
    """The runner runs where the kernel refuses it new namespaces (inside a user namespace of its own
    whose max_user_namespaces is 0, and whose root cannot become another uid): attempts run beside the
    runner, and the report says so on local and on the sshd host; the suite's burn_invalidates makes
    the run invalid."""
    confined = sshd_hosts.fleet.state / f"no-namespaces-{tmp_path.name}"  # under /var/tmp: seen by every host
    confined.mkdir()
    wrapper = confined / "python3"
    wrapper.write_text("#!/bin/sh\nexec unshare --user --map-root-user sh -c "
                       "'echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" \"$@\"' "
                       "/usr/bin/python3 \"$@\"\n")
    wrapper.chmod(0o755)
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(sshd_hosts.inventory_path.read_text().replace(
        "[defaults]\n", f'[defaults]\npython = "{wrapper}"\n', 1))  # fmt: skip
    suite = write_suite(tmp_path / "s", {"t": {"script": [{"content": "done", "finish": "stop"}],
                                               "repo": {"run_tests.sh": "exit 0\n"}}},
                        suite_toml='name = "bare"\nrepeat = 1\n[agent]\nkind = "scripted"\n[budget]\n'
                                   'max_steps = 4\ntimeout_s = 60\nmax_bytes = 100000\n'
                                   '[gate]\nburn_invalidates = true\n')  # fmt: skip
    out = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs",
                               hosts=["local", "box-a"]))  # fmt: skip
    report = json.loads((out.run_dir.path / "report.json").read_text())
    burned = {(f["host"], f["kind"]) for f in report["burn"]}
    assert {("local", "no_isolation"), ("box-a", "no_isolation")} <= burned, report["burn"]
    markdown = (out.run_dir.path / "report.md").read_text()
    assert "- burn: box-a: no_isolation (attempts run beside the runner): this host gives neither" in markdown
    assert report["valid"] is False and out.exit_code == 1
    assert any(r.startswith("isolation: box-a has") and "no_isolation" in r for r in report["invalid_reasons"])
    for name in ("local", "box-a"):
        fp = json.loads((out.run_dir.path / "hosts" / name / "fingerprint.json").read_text())
        assert fp["isolation"] == "none", (name, fp["isolation"])
