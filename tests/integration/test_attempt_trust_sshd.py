"""The attempt is the unit of trust, on `local` and on real sshd hosts.

What a user relies on: with attempts running at once (``slots = 2``), an attacker attempt that knows
its victim's workspace can neither write, read nor list it (each attempt runs as a uid of its own),
so the victim's verdict is its own; an attempt reaches no port of the host (its network is its own:
``/proc/net/tcp`` shows nothing of the host and a listener on the host's loopback is out of reach),
unless the suite says ``network = "open"``; the fingerprint's isolation says which of the two it was.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator.commands.explain import ExplainRequest, explain
from orchestrator.commands.replay import ReplayRequest, replay
from orchestrator.store.jsonl import read_jsonl
from tests.support.fake_provider import FakeProvider, redirecting_provider
from tests.support.runner import write_suite

pytestmark = pytest.mark.sshd

REPO = Path(__file__).resolve().parents[2]
HOSTS = ("local", "box-a", "box-b")
TOML = 'name = "{name}"\nrepeat = 1\n{extra}[agent]\nkind = "none"\n[budget]\nmax_steps = 4\ntimeout_s = 60\n'


def _rows(out: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["env"], r["task"]): r for r in read_jsonl(out.run_dir.results_path)}


def _finish(out: Any, host: str, task: str) -> dict[str, Any]:
    trace = out.run_dir.path / "hosts" / host / "traces" / f"{task}.0.jsonl"
    return json.loads(trace.read_text().splitlines()[-1])


#: The victim publishes where it works (as /proc/net/unix or a log would), writes a secret into its
#: HOME and waits; its predicate fails unless ``answer.txt`` says 42 (which it never writes).
VICTIM = """\
import json, os, sys, time
sys.stdin.readline()
drop = sys.argv[1]
open(os.path.join(os.environ["HOME"], "secret.txt"), "w").write("victim-secret")
os.umask(0)
with open(drop + ".tmp", "w") as fh:
    fh.write(os.getcwd())
os.rename(drop + ".tmp", drop)
time.sleep(6)
print(json.dumps({"type": "final", "content": "waited"}), flush=True)
"""

#: The attacker waits for the victim's path, then tries to forge its answer, list its workspace and
#: read its HOME; it says what worked.
ATTACKER = """\
import json, os, sys, time
sys.stdin.readline()
drop = sys.argv[1]
deadline = time.time() + 30
while not os.path.exists(drop) and time.time() < deadline:
    time.sleep(0.05)
victim = open(drop).read()
done = []
try:
    with open(os.path.join(victim, "answer.txt"), "w") as fh:
        fh.write("42\\n")
    done.append("wrote")
except OSError:
    pass
try:
    os.listdir(victim)
    done.append("listed")
except OSError:
    pass
try:
    open(os.path.join(os.path.dirname(victim), "home", "secret.txt")).read()
    done.append("read")
except OSError:
    pass
print(json.dumps({"type": "final", "content": "did: " + ",".join(done)}), flush=True)
"""


def test_with_two_slots_an_attempt_cannot_forge_read_or_list_its_neighbours_workspace(
    sshd_hosts: Any, tmp_path: Path
) -> None:
    drop = f"/tmp/crosshost-victim-{tmp_path.name}"
    suite = write_suite(tmp_path / "s", {
        "attacker": {"toml": '[agent]\nkind = "command"\ncommand = ["python3", "{suite}/agent/attacker.py", '
                             f'"{drop}"]\n', "repo": {"run_tests.sh": "exit 0\n"}},
        "victim": {"toml": '[agent]\nkind = "command"\ncommand = ["python3", "{suite}/agent/victim.py", '
                           f'"{drop}"]\n', "repo": {"run_tests.sh": 'grep -qx 42 answer.txt 2>/dev/null || '
                                                                     '{ echo "no answer"; exit 1; }\n'}},
    }, suite_toml=TOML.format(name="neighbours", extra=""),
        agent_files={"attacker.py": ATTACKER, "victim.py": VICTIM})  # fmt: skip
    for name in HOSTS:
        host_tmp = Path("/tmp") if name == "local" else sshd_hosts.fleet.hosts[name].dir / "tmp"
        (host_tmp / Path(drop).name).unlink(missing_ok=True)
        out = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs",
                                   hosts=[name], slots=2), with_analysis=False)  # fmt: skip
        (host_tmp / Path(drop).name).unlink(missing_ok=True)
        rows = _rows(out)
        assert out.manifest.hosts[name].error is None, (name, out.manifest.hosts[name])
        attacker = _finish(out, name, "attacker")
        assert attacker["final"] == "did: ", (name, attacker)  # it wrote, listed and read nothing
        victim = rows[(name, "victim")]
        assert victim["verdict"] == "fail" and "no answer" in victim["why"], (name, victim)
        # what the victim left in /tmp is its own stray, never its neighbour's
        assert "outside_workspace" not in attacker, (name, attacker)
        assert _finish(out, name, "victim")["outside_workspace"] == [drop], name


class _Listener:
    """A TCP listener on this machine's loopback (which the sshd test hosts share), counting callers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.callers = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn = self.sock.accept()[0]
            except OSError:
                return
            self.callers += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


#: Connects to every listener /proc/net/tcp shows and to the port it was told; exits 0 when it reached
#: none, 1 naming what it reached, the told port first (a verdict's reason keeps only its first 200
#: characters, and a busy machine has dozens of listeners below it).
SCANNER = """\
import socket, sys
told = int(sys.argv[1])
ports = {told}
for line in open("/proc/net/tcp").read().splitlines()[1:]:
    local, state = line.split()[1], line.split()[3]
    if state == "0A":
        ports.add(int(local.split(":")[1], 16))
reached = []
for port in [told] + sorted(ports - {told}):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        reached.append(port)
    except OSError:
        pass
print("reached %s of %d listeners" % (reached, len(ports)))
sys.exit(1 if reached else 0)
"""


@pytest.mark.parametrize("network", ["isolated", "open"])
def test_an_attempt_reaches_no_port_of_the_host_unless_the_suite_opens_the_network(
    sshd_hosts: Any, tmp_path: Path, network: str
) -> None:
    listener = _Listener()
    try:
        extra = 'network = "open"\n' if network == "open" else ""
        suite = write_suite(tmp_path / "s", {"scan": {
            "toml": '[agent]\nkind = "none"\n',
            "repo": {"run_tests.sh": f"python3 scan.py {listener.port}\n", "scan.py": SCANNER}}},
            suite_toml=TOML.format(name="scan", extra=extra))  # fmt: skip
        out = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs"),
                     with_analysis=False)  # fmt: skip
        rows = _rows(out)
        for name in HOSTS:
            assert out.manifest.hosts[name].error is None, (name, out.manifest.hosts[name])
            fp = json.loads((out.run_dir.path / "hosts" / name / "fingerprint.json").read_text())
            row = rows[(name, "scan")]
            if network == "isolated":
                assert fp["isolation"] == "netns+pidns+uid", (name, fp["isolation"])
                assert row["verdict"] == "pass", (name, row["why"])
            else:
                assert fp["isolation"] == "pidns+uid", (name, fp["isolation"])
                assert row["verdict"] == "fail" and str(listener.port) in row["why"], (name, row["why"])
        assert listener.callers == (0 if network == "isolated" else len(HOSTS))
    finally:
        listener.close()


#: what the controller and the runner would run through PATH; planted, each leaves a mark when run
PLANTED = ("python3", "unshare", "setpriv", "strace", "timeout", "env")


def test_explain_never_runs_a_program_a_hosts_path_names_on_the_controller(sshd_hosts: Any, tmp_path: Path) -> None:
    """box-a's PATH starts with a /tmp directory that, on the controller, an earlier attempt (a uid of
    the attempt range) filled with a python3, unshare, strace... Explain replays the reference with
    box-a's PATH: the runner and every program it starts as itself are found elsewhere, so none of
    the planted ones runs, while the counterfactual still reproduces the flip."""
    planted = Path(f"/tmp/crosshost-planted-{tmp_path.name}")
    marks = Path(f"/tmp/crosshost-planted-{tmp_path.name}-ran")
    planted.mkdir()
    marks.mkdir()
    marks.chmod(0o1777)
    try:
        for name in PLANTED:
            real = shutil.which(name, path="/usr/local/bin:/usr/bin:/bin")
            script = planted / name
            script.write_text(f'#!/bin/sh\ntouch "{marks}/$(id -u)-{name}"\nexec {real} "$@"\n')
            script.chmod(0o755)
            os.chown(script, 1_990_999_998, 1_990_999_998)
        os.chown(planted, 1_990_999_998, 1_990_999_998)
        suite = write_suite(tmp_path / "s", {"path-probe": {
            "script": [{"content": "done", "finish": "stop"}],
            "repo": {"run_tests.sh": f'case ":$PATH:" in *:{planted}:*) echo "a host PATH"; exit 1;; esac\n'}}},
            suite_toml='name = "path"\nrepeat = 1\n[agent]\nkind = "scripted"\n[budget]\nmax_steps = 4\n'
                       'timeout_s = 60\n')  # fmt: skip
        inventory = tmp_path / "hosts.toml"
        inventory.write_text(sshd_hosts.inventory_path.read_text().replace(
            'name = "box-a"', f'name = "box-a"\nenv = {{ PATH = "{planted}:/usr/local/bin:/usr/bin:/bin" }}', 1))
        run = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs",
                                   hosts=["local", "box-a"]))  # fmt: skip
        assert run.report is not None and [t.task for t in run.report.tasks if t.flip] == ["path-probe"]
        out = explain(ExplainRequest(run_dir=run.run_dir.path, inventory_path=inventory))
        assert out.exit_code == 0 and not out.errors, out.errors
        [entry] = out.record.tasks
        assert any(cf.fact == "PATH" and cf.reproduces for cf in entry.counterfactuals), entry.counterfactuals
        assert sorted(p.name for p in marks.iterdir()) == []
    finally:
        shutil.rmtree(planted, ignore_errors=True)
        shutil.rmtree(marks, ignore_errors=True)


def _crosshost(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from orchestrator.cli import main; main()", *args], capture_output=True, text=True,
        cwd=home, timeout=180, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(home)},
    )  # fmt: skip


def test_a_match_block_in_the_users_ssh_config_leaves_hosts_working_and_match_exec_is_refused(
    sshd_hosts: Any, tmp_path: Path
) -> None:
    """The user's default ~/.ssh/config with a ``Match user nobody`` block: ``hosts`` reaches local and
    every sshd host (it crashed with KeyError: 'host'). Every spelling of ``Match exec`` is refused
    with its file and line, and its command never runs."""
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    (ssh / "config").write_text("Host *\n    ServerAliveInterval 5\n\nMatch user nobody\n    Port 1\n")
    done = _crosshost("hosts", "-i", str(sshd_hosts.inventory_path), home=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    for name in ("box-a", "box-b"):
        assert name in done.stdout
    mark = tmp_path / "match-exec-ran"
    for line in (f'Match exec "touch {mark}"', f'match=exec "touch {mark}"', f"Match host * !EXEC 'touch {mark}'",
                 f"MATCH\tExec=touch\\ {mark}"):
        (ssh / "config").write_text(f"Host *\n    ServerAliveInterval 5\n{line}\n    Port 1\n")
        refused = _crosshost("hosts", "-i", str(sshd_hosts.inventory_path), home=tmp_path)
        assert refused.returncode == 2, (line, refused.stdout + refused.stderr)
        assert f"ssh_config {ssh / 'config'}:3: 'Match exec' runs a command" in refused.stderr, (line, refused.stderr)
        assert len(refused.stderr.strip().splitlines()) == 1 and not mark.exists(), line


KEY_ENV = "CROSSHOST_IT_TRUST_KEY"
KEY = "sk-trust-0123456789abcdef0123"

#: The predicate of an attempt that hunts for model proxies: every loopback listener /proc/net/tcp
#: shows (the controller's proxies, the sshd hosts' reverse forwards, the provider itself) gets the
#: built-in agent's request, an exec agent's and the runner's turns request, with guessed credentials.
HUNTER = """\
import json, sys, urllib.request, urllib.error
ports = set()
for line in open("/proc/net/tcp").read().splitlines()[1:]:
    local, state = line.split()[1], line.split()[3]
    if state == "0A" and local.startswith("0100007F"):
        ports.add(int(local.split(":")[1], 16))
paid = []
body = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "free tokens"}]}).encode()
for port in sorted(ports):
    for path, headers in (("/v1/chat/completions", {"X-Crosshost-Attempt": "answer.0"}),
                          ("/v1/chat/completions", {"X-Crosshost-Attempt": "answer.0", "Authorization": "Bearer crosshost-guess"}),
                          ("/attempt/answer.0/v1/chat/completions", {"Authorization": "Bearer crosshost-guess"}),
                          ("/crosshost/turns", {}), ("/crosshost/turns", {"deep": "1"})):
        data = json.dumps({"attempt": "answer.0"}).encode() if path == "/crosshost/turns" else body
        if headers.pop("deep", None):
            data = b"[" * 100000  # nested past any parser's recursion: a 400 or 401, never a traceback
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=data, method="POST",
                                     headers={"Content-Type": "application/json", **headers})
        try:
            with urllib.request.urlopen(req, timeout=3) as resp:
                paid.append("%d%s %d" % (port, path, resp.status))
        except Exception:
            pass  # refused, not HTTP (sshd), timed out: nothing paid
print("scanned %d listeners; answered 200: %s" % (len(ports), paid))
sys.exit(1 if paid else 0)
"""


def _live_suite(root: Path, base_url: str, predicate: str) -> Path:
    suite = root / "live"
    (suite / "tasks" / "answer" / "repo").mkdir(parents=True)
    (suite / "suite.toml").write_text(
        'name = "live"\nrepeat = 1\nnetwork = "open"\n'
        f'[agent]\nkind = "openai"\nmodel = "m1"\nbase_url = "{base_url}"\napi_key_env = "{KEY_ENV}"\n'
        "max_requests = 50\nhold_model = false\n[budget]\nmax_steps = 4\ntimeout_s = 60\n")
    (suite / "contract.json").write_text(json.dumps({"contract_id": "c", "tools": []}))
    (suite / "tools.json").write_text(json.dumps({"allow": [], "deny": []}))
    (suite / "tasks" / "answer" / "task.toml").write_text("")
    (suite / "tasks" / "answer" / "prompt.md").write_text("Say done.\n")
    (suite / "tasks" / "answer" / "repo" / "run_tests.sh").write_text(predicate)
    return suite


# serial: it posts to every loopback listener on the machine, the other workers' scripted providers too
@pytest.mark.serial
def test_a_predicate_that_posts_to_every_loopback_listener_spends_nothing(
    sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """With the host's network open to it, an attempt finds every proxy (its own host's, and on an sshd
    host the other hosts' forwards) and asks each for a completion: without its attempt's placeholder
    every request is a 401, recorded, and the provider sees the agents' own requests only."""
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeProvider(script=[{"content": "done", "finish": "stop"}], key=KEY) as provider:
        suite = _live_suite(tmp_path, provider.base_url, "python3 hunt.py\n")
        (suite / "tasks" / "answer" / "repo" / "hunt.py").write_text(HUNTER)
        out = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs"),
                     with_analysis=False)  # fmt: skip
        paid = [r for r in provider.requests if r.headers.get("authorization") == f"Bearer {KEY}"]
    rows = _rows(out)
    for name in HOSTS:
        row = rows[(name, "answer")]
        assert row["verdict"] == "pass", (name, row["why"])  # it found listeners and none answered 200
        calls = [json.loads(line) for line in
                 (out.run_dir.path / "hosts" / name / "model_calls.jsonl").read_text().splitlines()]
        assert any(c["status"] == 401 for c in calls), (name, calls)  # the refusals are recorded
    assert len(paid) == len(HOSTS), [r.path for r in paid]  # one request per attempt, the agent's own
    assert "Traceback" not in capfd.readouterr().err


#: An exec agent that, before its own request, asks its host's proxy in its neighbour's name.
ATTACKER_EXEC = """\
import json, os, urllib.request, urllib.error
base = os.environ["OPENAI_BASE_URL"]
key = os.environ["OPENAI_API_KEY"]
root = base.split("/attempt/")[0]
victim = base.replace("/attempt/attacker.0/", "/attempt/victim.0/")
body = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "injected"}]}).encode()
said = []
for url, data in [(victim + "/chat/completions", body)] * 5 + [
        (root + "/crosshost/turns", json.dumps({"attempt": "victim.0"}).encode()),
        (root + "/crosshost/attempt", json.dumps({"attempt": "victim.0", "root": "/tmp/x"}).encode())]:
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            said.append(resp.status)
    except urllib.error.HTTPError as exc:
        said.append(exc.code)
print(json.dumps(said))
"""

#: An exec agent that asks its model once and writes the answer's word.
VICTIM_EXEC = """\
import json, os, urllib.request
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", method="POST",
                             data=json.dumps({"model": "m1", "messages": [{"role": "user", "content": "go"}]}).encode(),
                             headers={"Content-Type": "application/json",
                                      "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
with urllib.request.urlopen(req, timeout=30) as resp:
    answer = json.loads(resp.read())
open("answer.txt", "w").write(answer["choices"][0]["message"]["content"] + "\\n")
"""


def test_an_attempt_posting_under_another_attempts_id_changes_neither_its_trace_nor_the_held_record(
    sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeProvider(script=[{"content": "42", "finish": "stop"}], key=KEY) as provider:
        suite = tmp_path / "impostor"
        (suite / "agent").mkdir(parents=True)
        (suite / "agent" / "attacker.py").write_text(ATTACKER_EXEC)
        (suite / "agent" / "victim.py").write_text(VICTIM_EXEC)
        (suite / "suite.toml").write_text(
            'name = "impostor"\nrepeat = 1\n'
            f'[agent]\nkind = "exec"\ncommand = ["python3", "{{suite}}/agent/attacker.py"]\napi = "openai"\n'
            f'model = "m1"\nbase_url = "{provider.base_url}"\napi_key_env = "{KEY_ENV}"\nmax_requests = 50\n'
            "[budget]\nmax_steps = 6\ntimeout_s = 60\n")  # fmt: skip
        (suite / "contract.json").write_text(json.dumps({"contract_id": "c", "tools": []}))
        (suite / "tools.json").write_text(json.dumps({"allow": [], "deny": []}))
        for task, script in (("attacker", "attacker.py"), ("victim", "victim.py")):
            (suite / "tasks" / task / "repo").mkdir(parents=True)
            (suite / "tasks" / task / "task.toml").write_text(
                f'[agent]\ncommand = ["python3", "{{suite}}/agent/{script}"]\n')
            (suite / "tasks" / task / "prompt.md").write_text("go\n")
        (suite / "tasks" / "victim" / "repo" / "run_tests.sh").write_text('test "$(cat answer.txt)" = 42\n')
        out = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs"),
                     with_analysis=False)  # fmt: skip
    rows = _rows(out)
    hold = json.loads((out.run_dir.path / "model_hold.json").read_text())
    assert hold["recorded"] == {"victim.0": 1}, hold  # the reference's record: the victim's one request
    for name in HOSTS:
        assert _finish(out, name, "attacker")["final"] == json.dumps([401] * 7), name
        victim = _finish(out, name, "victim")
        assert victim["model"]["requests"] == 1, (name, victim["model"])
        assert rows[(name, "victim")]["verdict"] == "pass", (name, rows[(name, "victim")]["why"])


def test_a_redirecting_provider_never_receives_the_key_at_the_new_origin(
    sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suite's provider answers every request with a 302 to another origin: on every host the
    attempt is an error that names the redirect, and the other origin receives nothing."""
    monkeypatch.setenv(KEY_ENV, KEY)
    with redirecting_provider() as (url, seen):
        suite = _live_suite(tmp_path, url, "exit 0\n")
        out = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs"),
                     with_analysis=False)  # fmt: skip
    rows = _rows(out)
    for name in HOSTS:
        row = rows[(name, "answer")]
        assert row["verdict"] == "error" and "redirect" in row["why"], (name, row["why"])
    assert seen == []
