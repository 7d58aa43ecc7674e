"""What the runner's start no longer pays for says what the plain version it replaces said: the
secret-name globs matched without ``fnmatch``, the fingerprint's platform facts without ``platform``,
the isolation probe with shell builtins only, a shipped suite's field names, a run's command line
without ``argparse``; a run loads without collector passes; and a run imports neither ``argparse``,
``concurrent.futures``, ``platform``, ``secrets`` nor, without ``--trace-files``, the tracer."""

from __future__ import annotations

import fnmatch
import gc
import itertools
import json
import os
import platform
import random
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_runner import __main__ as entry
from agent_runner import fingerprint, isolation_probe, redact, sandbox, strays, suite
from orchestrator.hosts.runner_zipapp import runner_zipapp_bytes
from tests.support.runner import clean_env, passable_to_attempts, predicate_suite


def test_the_secret_name_globs_match_what_fnmatch_matched() -> None:
    patterns = [*redact.SECRET_ENV_PATTERNS, *redact.SECRET_ENV_FAMILIES, "*", "A*A", "*A*B*", "AB*BA", "**X"]
    assert not any(c in p for p in patterns for c in "?[]")  # the only wildcard the globs know
    pieces = ["", "A", "B", "X", "_", "API", "KEY", "_KEY", "TOKEN", "PAT", "AUTH", "AUTHOR", "PRIVATE",
              "PASSWORD", "PWD", "SECRET", "OPENAI", "BA", "AB", "OPENAI_", "_PAT", "KEY_BASE"]
    rng = random.Random(7)
    names = {"".join(p) for p in itertools.product(pieces[:9], repeat=3)}
    names |= {"".join(rng.choice(pieces) for _ in range(rng.randint(0, 5))) for _ in range(3000)}
    for name in names:
        for pattern in patterns:
            assert redact._glob(name, pattern) == fnmatch.fnmatchcase(name, pattern), (name, pattern)
        assert redact.is_secret_env_key.__wrapped__(name) == _plain_is_secret_env_key(name), name


def _plain_is_secret_env_key(name: str) -> bool:
    """``is_secret_env_key`` as it was, through ``fnmatch``."""
    upper = name.upper()
    if any(fnmatch.fnmatchcase(upper, p) for p in redact.SECRET_ENV_PATTERNS):
        return True
    if redact._PASSWORD_WORD.search(upper):
        return True
    upper = redact._HARMLESS_WORDS.sub("", upper)
    return any(fnmatch.fnmatchcase(upper, p) for p in redact.SECRET_ENV_FAMILIES)


def test_the_platform_facts_are_what_the_platform_module_says() -> None:
    assert fingerprint.platform_facts() == (
        platform.platform(), platform.machine(), f"{platform.python_implementation()} {platform.python_version()}")


@pytest.mark.parametrize("parts", [
    ("Linux", "6.1.0-18-amd64", "x86_64", "with", "glibc2.36"),
    ("Linux", "5.15.0 (custom) #1", "aarch64", "with", "glibc2.35"),
    ("Linux", "4.19.0-unknown:x/y;z\"q\\", "armv7l", "with", "glibc2.28"),
    ("Linux", "", "", "with", "glibc2.17"),
])
def test_the_platform_string_is_formatted_as_the_platform_module_formats_it(parts: tuple[str, ...]) -> None:
    system, release, machine, word, libc = parts
    assert fingerprint._filename_safe(*parts) == platform._platform(system, release, machine, "", word, libc)  # type: ignore[attr-defined]


def _main_in_a_process(tmp_path: Path, *extra: str, before: str = "", report: str = "sorted(sys.modules)") -> Any:
    """A run of a two-task suite by ``main`` (as the zipapp calls it) in a process of its own, after
    the statements ``before``: the value of the expression ``report`` once it returned 0."""
    passable_to_attempts(tmp_path)
    suite = predicate_suite(tmp_path, "exit 0\n", tasks=2)
    code = (
        "import gc, sys, json\n"
        f"{before}"
        "from agent_runner.__main__ import main\n"
        f"rc = main(['run', '--suite', {str(suite)!r}, '--out', {str(tmp_path / 'out')!r}, "
        f"'--workspace-root', {str(tmp_path / 'ws')!r}, '--host', 'h', *{list(extra)!r}])\n"
        f"print(json.dumps({{'rc': rc, 'report': {report}}}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["rc"] == 0, done.stderr
    return got["report"]


def _run_in_a_process(tmp_path: Path, *extra: str) -> set[str]:
    """The modules a run in a process of its own imported."""
    return set(_main_in_a_process(tmp_path, *extra))


def test_the_tracer_imported_when_a_run_wants_it_still_keeps_the_evidence(tmp_path: Path) -> None:
    assert "agent_runner.filetrace" in _run_in_a_process(tmp_path, "--trace-files")
    evidence = json.loads((tmp_path / "out" / "files" / "t-0.0.json").read_text())
    assert evidence["traced"] is True, evidence


def test_a_run_imports_neither_argparse_nor_concurrent_futures_nor_platform_nor_secrets_nor_the_tracer(
    tmp_path: Path,
) -> None:
    """A run of a suite as a host starts it (its import list, after the run, from the same process);
    as root at ``pidns+uid``, where attempt directories are removed beside the run (``Removals``)."""
    modules = _run_in_a_process(tmp_path)
    assert not {"argparse", "concurrent.futures", "logging", "platform", "secrets", "agent_runner.filetrace"} & modules
    if os.geteuid() == 0:
        isolation = json.loads((tmp_path / "out" / "fingerprint.json").read_text())["isolation"]
        assert isolation.endswith("pidns+uid"), isolation


@pytest.mark.parametrize("entry", ["zipapp", "module"])
def test_a_run_started_as_a_program_imports_without_collector_passes_and_runs_its_attempts_with_them(
    tmp_path: Path, entry: str
) -> None:
    """The cyclic collector is off while a runner started as a program (the zipapp, as a host runs it,
    or ``-m``) loads the runner, and on, with what it loaded frozen, for its attempts: every pass once
    the collector module has run (the entry pauses it next; compiling it, before, may pass) comes
    after the freeze, and there are such passes."""
    passable_to_attempts(tmp_path)
    suite = predicate_suite(tmp_path, "exit 0\n", tasks=12)
    pyz = tmp_path / "runner.pyz"
    pyz.write_bytes(runner_zipapp_bytes())
    start = (f"runpy.run_path({str(pyz)!r}, run_name='__main__')" if entry == "zipapp"
             else "runpy.run_module('agent_runner', run_name='__main__', alter_sys=True)")
    code = (
        "import gc, json, runpy, sys\n"
        "passes = []  # (objects frozen by then, whether what pauses the collector had been run)\n"
        "gc.callbacks.append(lambda phase, info: passes.append((gc.get_freeze_count(), "
        "hasattr(sys.modules.get('agent_runner.collector'), 'settle'))) if phase == 'start' else None)\n"
        f"sys.argv = [{str(pyz)!r}, 'run', '--suite', {str(suite)!r}, '--out', {str(tmp_path / 'out')!r}, "
        f"'--workspace-root', {str(tmp_path / 'ws')!r}, '--host', 'h']\n"
        "import os\n"
        "os._exit = lambda code: sys.exit(code)  # the zipapp ends the process itself: report first\n"
        "try:\n"
        f"    {start}\n"
        "except SystemExit as exc:\n"
        "    rc = exc.code\n"
        "print(json.dumps({'rc': rc, 'passes': passes, 'on': gc.isenabled()}))\n"
    )
    env = {k: v for k, v in clean_env().items() if k != "PYTHONPATH"} if entry == "zipapp" else clean_env()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["rc"] == 0, done.stderr
    assert got["on"] is True
    frozen_at_pass = [frozen for frozen, loaded in got["passes"] if loaded]
    assert frozen_at_pass, "no collector pass while 12 attempts ran"
    assert min(frozen_at_pass) > 0, f"passes before the runner froze what it loaded: {frozen_at_pass}"


def test_main_called_by_a_program_of_its_own_leaves_its_collector_as_it_was(tmp_path: Path) -> None:
    """Only the runner's entry points pause the collector: a ``main()`` called by another program
    (a test's, in a process of its own: a root run forks its zygotes' server) freezes nothing."""
    got = _main_in_a_process(tmp_path, before="frozen = gc.get_freeze_count()\n",
                             report="[gc.isenabled(), gc.get_freeze_count() - frozen]")
    assert got == [True, 0]


def test_a_run_command_line_is_read_as_argparse_reads_it() -> None:
    """``_quick_run_args`` against argparse, on 1,500 seeded random command lines: where it reads a line, it
    reads what argparse reads (argparse fails the test where it refuses it); it reads every line the
    controller writes (the options of ``HostJob._run``), which is what spares a run argparse."""
    rng = random.Random(11)
    flags = [option[0] for option in entry._RUN_OPTIONS]
    values = ["s", "", "3", "0", "-1", " 2", "+4", "3_0", "x y", "a,b", "-", "1e3", "\u0663", "run", "--suite"]
    strays = ["--sui", "--suite=s", "-h", "--help", "--bogus", "--", "-s", "fingerprint"]
    read = 0
    for _ in range(1500):
        argv = ["run"] if rng.random() < 0.97 else [rng.choice(["version", "check", "mcp"])]
        for _ in range(rng.randint(0, 9)):
            if rng.random() < 0.9:
                flag = rng.choice(flags)
                argv.append(flag)
                if entry._RUN_FLAGS[flag][1] != "flag" or rng.random() < 0.05:
                    argv.append(rng.choice(values) if rng.random() < 0.5 else rng.choice(["3", "a/b", "h"]))
            else:
                argv.append(rng.choice(strays + values))
        if rng.random() < 0.8:
            at = rng.randrange(1, len(argv) + 1)
            argv[at:at] = ["--suite", "/s", "--out", "/o"] if rng.random() < 0.5 else ["--out", "/o", "--suite", "/s"]
        quick = entry._quick_run_args(argv)
        if quick is None:
            continue
        read += 1
        assert vars(quick) == vars(entry._parser().parse_args(argv)), argv
    assert read > 200, read  # a fifth of the lines: the others have something only argparse reads
    controller = ["run", "--suite", "/b/suite", "--out", "/w/out", "--host", "box-a", "--run-id", "r-1",
                  "--workspace-root", "/w/work", "--env-allow", "PATH,LANG", "--trace-stream", "--reaped", "/w/r",
                  "--tasks", "a,b", "--repeat", "3", "--first-attempt", "2", "--trace-files", "--slots", "2",
                  "--attempts-on-disk"]  # fmt: skip
    assert vars(entry._quick_run_args(controller) or {}) == vars(entry._parser().parse_args(controller))
    assert entry._quick_run_args(["run", "--suite", "/s", "--out", "/o", "--env-allow", ""]) is not None


def _plain_probe_script(level: str, net: bool, proc: str) -> str:
    """The probe as it was: ``id`` and two ``wc`` started by the shell at every run."""
    check = f'set -- {proc}/[0-9]*; test "$#" -le 3' + (' && test "$(id -u)" != 0' if level == sandbox.PIDNS_UID else "")
    if net:
        check += f' && test "$(wc -l < {proc}/net/tcp)" -le 1 && test "$(wc -l < {proc}/net/unix)" -le 1'
    return check


def test_the_probe_with_shell_builtins_passes_and_fails_where_the_plain_one_did(tmp_path: Path) -> None:
    """Both checks run against a made-up /proc (its processes, the effective uid, the sockets: the
    plain one lists the TCP table, the probe reads its count, as the kernel keeps both; ``tw`` is the
    machine's on older kernels, and a namespace made for the probe has no socket that could close); the
    plain one's ``id`` says the same uid as the made-up status."""
    cases = itertools.product((2, 3, 4), ((0, 0), (0, 1990999999), (1990999999, 0), (5, 5)),
                              ((0, 0), (1, 0), (2, 0)), (1, 3), (sandbox.PIDNS_UID, sandbox.PIDNS),
                              (False, True))  # fmt: skip
    outcomes = set()
    for n, (pids, (ruid, euid), (inuse, tw), unix, level, net) in enumerate(cases):
        tw_elsewhere = 7  # TIME_WAIT sockets of other namespaces, counted here by an older kernel
        proc, bin_dir = tmp_path / f"proc{n}", tmp_path / f"bin{n}"
        for pid in range(1, pids + 1):
            (proc / str(pid)).mkdir(parents=True)
        (proc / "self").mkdir()
        (proc / "self" / "status").write_text(f"Name:\tsh\nUid:\t{ruid}\t{euid}\t{euid}\t{euid}\nGid:\t0\t0\t0\t0\n")
        (proc / "net").mkdir()
        (proc / "net" / "tcp").write_text("".join(f"line {i}\n" for i in range(1 + inuse + tw)))  # a header
        (proc / "net" / "sockstat").write_text(
            f"sockets: used {inuse + unix - 1}\nTCP: inuse {inuse} orphan 0 tw {tw + tw_elsewhere} alloc 7 mem 1\n"
            "UDP: inuse 0 mem 0\n")
        (proc / "net" / "unix").write_text("".join(f"line {i}\n" for i in range(unix)))
        bin_dir.mkdir()
        (bin_dir / "id").write_text(f"#!/bin/sh\necho {euid}\n")
        (bin_dir / "id").chmod(0o755)
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
        said = [subprocess.run(["sh", "-c", script(level, net, str(proc))], env=env, check=False).returncode == 0
                for script in (isolation_probe.probe_script, _plain_probe_script)]
        assert said[0] == said[1], (pids, ruid, euid, inuse, tw, unix, level, net)
        outcomes.add(said[0])
    assert outcomes == {True, False}


@pytest.mark.root
@pytest.mark.parametrize("listening", [False, True])
def test_the_probe_sees_a_tcp_socket_in_its_network_namespace(listening: bool) -> None:
    """On the kernel, not a made-up /proc: in a network namespace of its own (and PID namespace, with
    a fresh /proc) the probe passes, and fails once a TCP socket listens there."""
    listen = "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(); time.sleep(10)"
    listener = f"{shlex.quote(sys.executable)} -c {shlex.quote(listen)} & sleep 1; " if listening else ""
    script = listener + isolation_probe.probe_script(sandbox.PIDNS, True) + "; r=$?; kill %1 2>/dev/null; exit $r"
    done = subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount-proc", "sh", "-c", script],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (done.returncode == 0) == (not listening), done.stderr


def _inotify_open(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
    except OSError:
        return False


def test_the_last_runs_stray_watch_stays_open_until_the_next_run_or_the_exit(tmp_path: Path) -> None:
    """Closing an inotify descriptor waits for the kernel: the run's is left to the process's exit."""
    first = strays.StrayWatch(None, roots=[str(tmp_path)])
    first.mark()
    assert first._changes is not None
    fd = first._changes.fd
    strays.keep_until_exit(first)
    del first
    gc.collect()
    assert _inotify_open(fd)
    strays.keep_until_exit(None)  # the next run keeps its own: this one is closed then
    gc.collect()
    assert not _inotify_open(fd)


def test_detect_soon_finds_what_detect_finds_and_raises_what_it_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def fresh() -> None:
        monkeypatch.setattr(isolation_probe, "_detected", None)
        monkeypatch.setattr(isolation_probe, "_net_works", {})
        monkeypatch.setattr(isolation_probe, "_detecting", None)
        monkeypatch.setattr(isolation_probe, "_detect_failed", [])

    fresh()
    plain = isolation_probe.detect(network=True)
    plain_net = isolation_probe.detect_network(plain)
    fresh()
    isolation_probe.detect_soon()
    assert isolation_probe._detecting is not None
    assert (isolation_probe.detect(), isolation_probe.detect_network(isolation_probe.detect())) == (plain, plain_net)
    fresh()

    def broken(level: str, net: bool = False) -> bool:
        raise RuntimeError("the probe broke")

    monkeypatch.setattr(isolation_probe, "_works", broken)
    monkeypatch.setattr(isolation_probe.sys, "platform", "linux")
    isolation_probe.detect_soon()
    with pytest.raises(RuntimeError, match="the probe broke"):
        isolation_probe.detect()


def test_a_shipped_suites_field_names_are_what_they_were() -> None:
    """``suite.json``'s path is made once per read, not once per field it names."""
    root = Path("/srv/b u/suite")
    where = suite._json_where(root)
    for task_id in (None, "t-1", "x.y"):
        for part in ("name", "budget.max_steps", "script[0].tool_calls"):
            prefix = f"tasks[{task_id}]." if task_id is not None else ""
            assert where(task_id, part) == f"{root / 'suite.json'}: {prefix}{part}"
