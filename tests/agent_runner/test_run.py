"""`run` end to end: traces, results, budgets, the pristine predicate, no process for refused calls,
disposable workspaces, and the refusal to run next to a visible secret."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from agent_runner.redact import is_secret_env_key
from tests.support.runner import (
    REPO,
    TRIAGE,
    clean_env,
    passable_to_attempts,
    records,
    run_runner,
    write_suite,
)


def test_triage_suite_writes_one_trace_per_task_and_attempt(tmp_path: Path) -> None:
    out, ws = tmp_path / "out", tmp_path / "ws"
    done = run_runner("run", "--suite", str(TRIAGE), "--out", str(out), "--host", "local", "--run-id", "r1",
                      "--workspace-root", str(ws))
    assert done.returncode == 0, done.stderr
    task_ids = sorted(p.name for p in (TRIAGE / "tasks").iterdir())
    assert len(task_ids) >= 10
    rows = records(out / "results.jsonl")
    assert sorted((r["task"], r["attempt"]) for r in rows) == [(t, a) for t in task_ids for a in (0, 1)]
    for row in rows:
        assert set(row) >= {"run_id", "task", "env", "env_sha", "attempt", "exit_code", "passed", "wall_ms",
                            "verdict", "reason", "fingerprint"}
        assert row["env"] == "local" and row["run_id"] == "r1" and len(row["env_sha"]) == 16
        trace = records(out / "traces" / f"{row['task']}.{row['attempt']}.jsonl")
        header, finish = trace[0], trace[-1]
        assert header["type"] == "header" and header["schema"] == "crosshost.trace/2"
        assert header["task"] == row["task"] and header["fingerprint"] == row["fingerprint"]
        assert set(header["pins"]) >= {"prompt_sha", "tools_sha", "predicate_sha", "contract_sha", "runner_source_sha",
                                       "budget"}
        assert finish["type"] == "finish" and finish["verdict"] == row["verdict"]
        assert all(t["type"] == "turn" for t in trace[1:-1])
        assert [t["step"] for t in trace[1:-1]] == list(range(1, len(trace) - 1))
    verdicts = {r["task"]: r["verdict"] for r in rows if r["attempt"] == 0}
    # The demo's interesting cases behave as designed on a host without /opt/crosshost-demo.
    assert verdicts["restart-unhealthy-only"] == "pass"
    assert verdicts["healthy-no-writes"] == "pass"
    assert verdicts["leaky-workdir"] == "fail"
    assert verdicts["seed-leaked-label"] == "fail"
    assert verdicts["label-honest-bug"] == "fail"
    assert json.loads((out / "fingerprint.json").read_text())["fingerprint"] == rows[0]["fingerprint"]
    assert list(ws.iterdir()) == []
    assert "restart-unhealthy-only.0 pass" in done.stderr  # one progress line per attempt


def test_step_budget_of_4_against_an_erroring_tool_ends_after_exactly_4_calls(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_runner("run", "--suite", str(TRIAGE), "--out", str(out), "--tasks", "metrics-retry-budget",
                      "--repeat", "1", "--workspace-root", str(tmp_path / "ws"))
    assert done.returncode == 0, done.stderr
    trace = records(out / "traces" / "metrics-retry-budget.0.jsonl")
    turns = [r for r in trace if r["type"] == "turn"]
    assert len(turns) == 4
    assert all(t["tool"] == "query_metrics" and t["error"] for t in turns)
    assert trace[-1]["reason"] == "budget_steps"
    assert trace[-1]["verdict"] == "fail"
    assert trace[0]["pins"]["budget"]["max_steps"] == 4


def test_command_agent_gets_abort_and_budget_steps_without_cooperating(tmp_path: Path) -> None:
    """The runner enforces the budget: an agent that would loop forever is stopped at max_steps."""
    agent = ("import json,sys\nsys.stdin.readline()\n"
             "while True:\n"
             "    print(json.dumps({'type':'tool_call','name':'flaky','args':{}}), flush=True)\n"
             "    m = json.loads(sys.stdin.readline())\n"
             "    if m['type'] == 'abort':\n"
             "        sys.exit(0)\n")
    suite = write_suite(tmp_path / "s", {"loop": {"toml": '[agent]\nkind = "command"\ncommand = ["python3", '
                                                          '"{suite}/agent/a.py"]\n[budget]\nmax_steps = 3\n'
                                                          '[fixtures]\nflaky = "error: down"\n'}},
                        agent_files={"a.py": agent})
    done = run_runner("run", "--suite", str(suite), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    trace = records(tmp_path / "out" / "traces" / "loop.0.jsonl")
    assert [r["type"] for r in trace] == ["header", "turn", "turn", "turn", "finish"]
    assert trace[-1]["reason"] == "budget_steps"


def test_a_usage_message_with_a_bad_count_is_the_agents_protocol_error_not_the_runners(tmp_path: Path) -> None:
    agent = ("import json,sys\nsys.stdin.readline()\n"
             "print(json.dumps({'type':'usage','prompt_tokens':'many'}), flush=True)\n"
             "print(json.dumps({'type':'final','content':'done'}), flush=True)\n")
    suite = write_suite(tmp_path / "s", {"t": {"toml": '[agent]\nkind = "command"\ncommand = ["python3", '
                                                       '"{suite}/agent/a.py"]\n'}},
                        agent_files={"a.py": agent})
    done = run_runner("run", "--suite", str(suite), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr  # not the runner's failure (3)
    finish = records(tmp_path / "out" / "traces" / "t.0.jsonl")[-1]
    assert (finish["reason"], finish["verdict"]) == ("agent_error", "fail")
    assert "prompt_tokens is not a non-negative integer: 'many'" in finish["final"]


def test_observation_bytes_budget_stops_the_attempt(tmp_path: Path) -> None:
    script = [{"tool_calls": [{"name": "lookup", "args": {"q": str(i)}}]} for i in range(5)]
    toml = '[budget]\nmax_bytes = 250\n[fixtures]\nlookup = "' + "x" * 100 + '"\n'
    suite = write_suite(tmp_path / "s", {"t": {"script": script, "toml": toml}})
    assert run_runner("run", "--suite", str(suite), "--out", str(tmp_path / "out")).returncode == 0
    trace = records(tmp_path / "out" / "traces" / "t.0.jsonl")
    assert [r["type"] for r in trace] == ["header", "turn", "turn", "turn", "finish"]  # 3rd obs: 300 > 250
    assert trace[-1]["reason"] == "budget_bytes" and trace[-1]["verdict"] == "fail"


def test_unknown_tool_and_refused_shell_get_an_error_and_start_no_process(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    script = [
        {"tool_calls": [{"name": "touch_marker", "args": {"argv": ["touch", str(marker)]}}]},
        {"tool_calls": [{"name": "shell", "args": {"argv": ["rm", "-f", str(marker)]}}]},
        {"tool_calls": [{"name": "shell", "args": {"argv": ["sh", "-c", f"touch {marker}"]}}]},
        {"tool_calls": [{"name": "lookup", "args": {"q": "x", "secret_path": "p"}}]},
        {"content": "done", "finish": "stop"},
    ]
    suite = write_suite(tmp_path / "s", {"t": {"script": script, "toml": '[fixtures]\nlookup = "found"\n'}})
    done = run_runner("run", "--suite", str(suite), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    turns = [r for r in records(tmp_path / "out" / "traces" / "t.0.jsonl") if r["type"] == "turn"]
    assert "unknown tool 'touch_marker'" in turns[0]["error"]
    assert "denied" in turns[1]["error"]
    assert "not allowed" in turns[2]["error"]
    assert "forbidden" in turns[3]["error"]
    assert not marker.exists()
    # and the same shell tool does start a process when tools.json allows it, so the marker would appear
    allowed = [{"tool_calls": [{"name": "shell", "args": {"argv": ["touch", str(marker)]}}]}]
    suite2 = write_suite(tmp_path / "s2", {"t": {"script": allowed}})
    assert run_runner("run", "--suite", str(suite2), "--out", str(tmp_path / "out2")).returncode == 0
    assert marker.exists()


def test_an_agent_that_rewrites_its_pass_test_still_fails(tmp_path: Path) -> None:
    script = [{"tool_calls": [{"name": "write_file", "args": {"path": "run_tests.sh",
                                                              "content": "exit 0\n"}}]},
              {"tool_calls": [{"name": "shell", "args": {"argv": ["sh", "run_tests.sh"]}}]},
              {"content": "green", "finish": "stop"}]
    repo = {"run_tests.sh": "test -f fixed.txt\n"}
    suite = write_suite(tmp_path / "s", {"cheat": {"script": script, "repo": repo},
                                         "honest": {"repo": repo, "script": [
                                             {"tool_calls": [{"name": "write_file",
                                                              "args": {"path": "fixed.txt", "content": "y"}}]}]}})
    done = run_runner("run", "--suite", str(suite), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    cheat = records(tmp_path / "out" / "traces" / "cheat.0.jsonl")
    assert "exit 0" in (tmp_path / "out" / "traces" / "cheat.0.obs.jsonl").read_text()  # its own run "passed"
    assert cheat[-1]["predicate_exit"] == 1 and cheat[-1]["verdict"] == "fail"
    honest = records(tmp_path / "out" / "traces" / "honest.0.jsonl")
    assert honest[-1]["predicate_exit"] == 0 and honest[-1]["verdict"] == "pass"


@pytest.mark.parametrize("own_uid", [True, False], ids=["own-uid", "runner-uid"])
def test_the_predicate_runs_the_same_pristine_file_whatever_the_agent_did_to_its_copy(
        tmp_path: Path, own_uid: bool) -> None:
    """The workspace's copy of run_tests.sh is kept only when it is the pristine file (one link, the same
    bytes), and then made what a fresh write makes: the predicate sees the same owner, group, mode and
    link count, and the same bytes, whether the agent left it alone or changed its mode (set-id bits
    too), linked it from another name, replaced it by a FIFO, or changed and restored its text."""
    look = "stat -c '%u %g %a %h %s' run_tests.sh; sha256sum < run_tests.sh; exit 0\n"

    def shell(*argv: str) -> dict[str, object]:
        return {"tool_calls": [{"name": "shell", "args": {"argv": list(argv)}}]}

    def write(text: str) -> dict[str, object]:
        return {"tool_calls": [{"name": "write_file", "args": {"path": "run_tests.sh", "content": text}}]}

    stop = {"content": "done", "finish": "stop"}
    scripts = {"untouched": [stop], "modes": [shell("chmod", "6777", "run_tests.sh"), stop],
               "unreadable": [shell("chmod", "000", "run_tests.sh"), stop],
               "linked": [shell("ln", "run_tests.sh", "other"), stop],
               "fifo": [shell("rm", "run_tests.sh"), shell("mkfifo", "run_tests.sh"), stop],
               "restored": [write("exit 0\n"), write(look), stop]}
    suite = write_suite(tmp_path / "s", {name: {"script": script, "repo": {"run_tests.sh": look}}
                                         for name, script in scripts.items()},
                        tools={"allow": ["chmod", "ln", "rm", "mkfifo"], "deny": []})
    if own_uid:  # the attempts' uid reaches the workspace: pidns+uid as root, its copy is that uid's (not
        # asserted: another pytest session starting meanwhile closes /tmp/pytest-of-root again)
        passable_to_attempts(tmp_path)
    done = run_runner("run", "--suite", str(suite), "--out", str(tmp_path / "out"),
                      "--workspace-root", str(tmp_path / "ws"))
    assert done.returncode == 0, done.stderr
    seen = {name: records(tmp_path / "out" / "traces" / f"{name}.0.jsonl")[-1]["predicate_output"]
            for name in scripts}
    assert seen["untouched"].splitlines()[0].split()[2:] == ["755", "1", str(len(look))], seen
    assert all(out == seen["untouched"] for out in seen.values()), seen


def test_the_predicate_output_is_kept_for_a_pass_as_for_a_fail_and_capped(tmp_path: Path) -> None:
    from agent_runner.runner import PREDICATE_OUTPUT_CAP

    script = [{"content": "done", "finish": "stop"}]
    noisy = "i=0; while [ $i -lt 400 ]; do echo line $i of the build log; i=$((i+1)); done\n"
    suite = write_suite(tmp_path / "s", {
        "passes": {"script": script, "repo": {"run_tests.sh": "echo checking\necho 'ok: 3 checks passed'\n"}},
        "fails": {"script": script, "repo": {"run_tests.sh": "echo 'FAIL: 1 of 3'\nexit 1\n"}},
        "noisy": {"script": script, "repo": {"run_tests.sh": noisy + "echo 'ok: the end'\n"}},
        "none": {"script": script},
    })  # fmt: skip
    done = run_runner("run", "--suite", str(suite), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    finish = {t: records(tmp_path / "out" / "traces" / f"{t}.0.jsonl")[-1] for t in ("passes", "fails", "noisy", "none")}
    assert finish["passes"]["verdict"] == "pass"
    assert finish["passes"]["predicate_output"] == "checking\nok: 3 checks passed"
    assert finish["fails"]["verdict"] == "fail" and finish["fails"]["predicate_output"] == "FAIL: 1 of 3"
    assert finish["fails"]["why"] == "predicate run_tests.sh exited 1 (FAIL: 1 of 3)"
    noisy_out = finish["noisy"]["predicate_output"]
    assert noisy_out.startswith("…") and noisy_out.endswith("line 399 of the build log\nok: the end")
    assert len(noisy_out.encode()) <= PREDICATE_OUTPUT_CAP + len("…".encode())
    assert "predicate_output" not in finish["none"]  # no predicate, nothing claimed


CRASH_AGENT = "import sys\nsys.stdin.readline()\nraise SystemExit('boom: the agent crashed')\n"
def hang_agent(mark: str) -> str:
    """An agent that hangs with a child, ``sleep 307.<mark>``, that must die with it; the mark is the
    test's own, so a run beside it (another test worker, another checkout) is not taken for it."""
    return ("import json, subprocess, sys, time\nsys.stdin.readline()\n"
            f"subprocess.Popen(['sleep', '307.{mark}'])\n"
            "open('left-behind.txt', 'w').write('x')\n"
            "time.sleep(300)\n")


def test_workspace_root_is_empty_after_crash_and_timeout(tmp_path: Path) -> None:
    ws, mark = tmp_path / "ws", str(secrets.randbelow(10**9))
    suite = write_suite(tmp_path / "s", {
        "crash": {"toml": '[agent]\nkind = "command"\ncommand = ["python3", "{suite}/agent/crash.py"]\n'},
        "hang": {"toml": '[agent]\nkind = "command"\ncommand = ["python3", "{suite}/agent/hang.py"]\n'
                         '[budget]\ntimeout_s = 1.5\n', "repo": {"run_tests.sh": "exit 0\n"}},
        "ok": {"script": [{"content": "nothing to do", "finish": "stop"}], "repo": {"a/b.txt": "x"}},
    }, agent_files={"crash.py": CRASH_AGENT, "hang.py": hang_agent(mark)})
    done = run_runner("run", "--suite", str(suite), "--out", str(tmp_path / "out"), "--workspace-root", str(ws),
                      "--repeat", "2")
    assert done.returncode == 0, done.stderr
    assert ws.is_dir() and list(ws.iterdir()) == []
    rows = {(r["task"], r["attempt"]): r for r in records(tmp_path / "out" / "results.jsonl")}
    assert rows[("crash", 0)]["reason"] == "agent_error" and rows[("crash", 0)]["verdict"] == "fail"
    assert "boom" in records(tmp_path / "out" / "traces" / "crash.0.jsonl")[-1]["final"]
    assert rows[("hang", 1)]["reason"] == "timeout" and rows[("hang", 1)]["verdict"] == "fail"
    assert rows[("ok", 0)]["verdict"] == "pass"
    assert _sleepers(mark) == "", "the agent's child outlived the attempt"


@pytest.mark.parametrize("where", [[], ["--attempts-on-disk"]], ids=["in-memory", "on-disk"])
def test_workspace_root_is_empty_when_the_runner_is_terminated(tmp_path: Path, where: list[str]) -> None:
    ws, mark = tmp_path / "ws", str(secrets.randbelow(10**9))
    suite = write_suite(tmp_path / "s", {
        "hang": {"toml": '[agent]\nkind = "command"\ncommand = ["python3", "{suite}/agent/hang.py"]\n'
                         '[budget]\ntimeout_s = 60\n'}}, agent_files={"hang.py": hang_agent(mark)})
    proc = subprocess.Popen([sys.executable, "-m", "agent_runner", "run", "--suite", str(suite), "--out",
                             str(tmp_path / "out"), "--workspace-root", str(ws), *where], env=clean_env(),
                            cwd=REPO, stderr=subprocess.PIPE, text=True)
    # the attempts' directories as the runner sees them (a root runner's are in a tmpfs of its own)
    seen = Path(f"/proc/{proc.pid}/root{ws}")
    for _ in range(100):
        if seen.is_dir() and any(seen.iterdir()) and any(seen.glob("*/work/left-behind.txt")):
            break
        subprocess.run(["sleep", "0.1"])
    assert any(seen.iterdir()), "the attempt never started"
    proc.terminate()
    assert proc.wait(timeout=20) == 143
    assert list(ws.iterdir()) == []
    assert _sleepers(mark) == ""


def _sleepers(mark: str) -> str:
    return subprocess.run(["pgrep", "-xf", f"sleep 307.{mark}"], capture_output=True, text=True).stdout.strip()


def test_visible_secret_refuses_to_start_and_env_i_run_writes_no_secret(tmp_path: Path) -> None:
    secret = "s3cr3t-value-4711"
    dirty = dict(os.environ, FOO_TOKEN=secret, PYTHONPATH=str(REPO))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "agent_runner", "run", "--suite", str(TRIAGE), "--out",
                           str(out)], capture_output=True, text=True, env=dirty, cwd=REPO, timeout=60)
    assert done.returncode == 2
    assert "FOO_TOKEN" in done.stderr and secret not in done.stderr
    assert not (out / "results.jsonl").exists()

    fingerprint = subprocess.run([sys.executable, "-m", "agent_runner", "fingerprint"], capture_output=True,
                                 text=True, env=dirty, cwd=REPO, timeout=60)
    assert fingerprint.returncode == 0
    data = json.loads(fingerprint.stdout)
    assert {"kind": "secret_env_key", "detail": "FOO_TOKEN"}.items() <= next(
        f for f in data["findings"] if f["kind"] == "secret_env_key").items()
    assert "FOO_TOKEN" in data["env_keys"] and secret not in fingerprint.stdout

    # Through env -i with an allowlist, from the same dirty shell, it starts and writes no secret.
    allow = [f"{k}={dirty[k]}" for k in ("PATH", "LANG", "PYTHONPATH") if k in dirty]
    done = subprocess.run(["env", "-i", *allow, sys.executable, "-m", "agent_runner", "run", "--suite",
                           str(TRIAGE), "--out", str(out), "--repeat", "1"], capture_output=True, text=True,
                          env=dirty, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    written = [p for p in out.rglob("*") if p.is_file()]
    assert len(written) > 10
    assert all(secret not in p.read_text() and "FOO_TOKEN" not in p.read_text() for p in written)


def test_secret_looking_values_are_redacted_before_they_are_written(tmp_path: Path) -> None:
    key = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0"
    script = [{"tool_calls": [{"name": "lookup", "args": {"q": f"use {key}", "api_key": "hunter2-plain"}}]},
              {"content": f"my token is ghp_{'x' * 36}", "finish": "stop"}]
    suite = write_suite(tmp_path / "s", {"t": {"script": script, "toml": f'[fixtures]\nlookup = "{key}"\n'}})
    assert run_runner("run", "--suite", str(suite), "--out", str(tmp_path / "out")).returncode == 0
    for path in (tmp_path / "out").rglob("*.jsonl"):
        text = path.read_text()
        assert key not in text and "hunter2-plain" not in text and "ghp_x" not in text
    turn = records(tmp_path / "out" / "traces" / "t.0.jsonl")[1]
    assert turn["args"] == {"q": "use [REDACTED]", "api_key": "[REDACTED]"}


def test_openai_kind_is_refused_before_any_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_runner import agents
    from agent_runner.errors import InputError
    from agent_runner.runner import RunOptions, run_suite

    agents._load_plugins()
    monkeypatch.delitem(agents._REGISTRY, "openai", raising=False)  # as before the openai issue landed
    for key in [k for k in os.environ if is_secret_env_key(k)]:
        monkeypatch.delenv(key)
    # A complete [agent] of kind "openai" (suite.py validates its keys), refused by the registry alone.
    openai_agent_toml = '[agent]\nkind = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\napi_key_env = "K"\n'
    suite = write_suite(tmp_path / "s", {"a": {"script": []}, "b": {"toml": openai_agent_toml}})
    with pytest.raises(InputError, match="openai' is not available"):
        run_suite(RunOptions(suite=str(suite), out=str(tmp_path / "out")))
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_same_host_same_fingerprint_and_env_sha_across_runs_with_per_run_workspaces(tmp_path: Path) -> None:
    """The controller puts workspaces under .../runs/<run_id>/work: that must not move the fingerprint."""
    rows = []
    for run_id in ("run-a", "run-b"):
        out = tmp_path / run_id / "out"
        done = run_runner("run", "--suite", str(TRIAGE), "--out", str(out), "--run-id", run_id, "--tasks",
                          "healthy-no-writes", "--repeat", "1", "--workspace-root", str(tmp_path / run_id / "work"))
        assert done.returncode == 0, done.stderr
        assert json.loads((out / "fingerprint.json").read_text())["cwd"] == str(tmp_path / run_id / "work")
        rows.append(records(out / "results.jsonl")[0])
    assert rows[0]["fingerprint"] == rows[1]["fingerprint"]
    assert rows[0]["env_sha"] == rows[1]["env_sha"]


def test_a_secret_printed_by_the_predicate_is_redacted_on_stderr_too(tmp_path: Path) -> None:
    """The runner's stderr reaches the controller (progress, and the manifest's error line)."""
    token = "ghp_" + "Q" * 36
    script = [{"content": "done", "finish": "stop"}]
    suite = write_suite(tmp_path / "s", {"t": {"script": script, "repo": {"run_tests.sh": f"echo {token}\nexit 1\n"}}})
    done = run_runner("run", "--suite", str(suite), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "t.0 fail" in done.stderr
    assert token not in done.stderr
    assert token not in (tmp_path / "out" / "results.jsonl").read_text()
    assert token not in (tmp_path / "out" / "traces" / "t.0.jsonl").read_text()  # its kept output too
