"""File-access evidence: which paths a predicate touched outside its own directories (strace's log)."""

from __future__ import annotations

import shutil
from pathlib import Path

from agent_runner import filetrace
from agent_runner.filetrace import touched_paths, traced_argv
from agent_runner.records import EvidenceCut

LOG = """\
4100  execve("/usr/bin/sh", ["sh", "run_tests.sh"], 0x7ffc /* 6 vars */) = 0
4100  openat(AT_FDCWD, "/etc/ld.so.cache", O_RDONLY|O_CLOEXEC) = 3
4100  newfstatat(AT_FDCWD, "/opt/crosshost-demo/feature.flag", 0x7ffd, 0) = -1 ENOENT (No such file or directory)
4100  openat(AT_FDCWD, "/ws/a.0.x/work/run_tests.sh", O_RDONLY) = 3
4100  openat(AT_FDCWD, "/ws/a.0.x/tmp/cache", O_RDONLY) = 3
4100  openat(AT_FDCWD, "relative.txt", O_RDONLY) = 3
4100  openat(AT_FDCWD, "/proc/self/status", O_RDONLY) = 3
4101  execve("/usr/bin/wc", ["wc", "-m"], 0x55 /* 6 vars */) = 0
4100  openat(AT_FDCWD, "/tmp/crosshost-demo/wheels", O_RDONLY|O_NONBLOCK|O_CLOEXEC|O_DIRECTORY) = 3
4100  +++ exited with 1 +++
"""


def test_paths_outside_the_attempt_are_kept_with_their_calls():
    found = touched_paths(LOG, ["/ws/a.0.x", "/ws/a.0.x/work"])
    assert found == {
        "/usr/bin/sh": ["execve"],
        "/etc/ld.so.cache": ["openat"],
        "/opt/crosshost-demo/feature.flag": ["newfstatat"],
        "/usr/bin/wc": ["execve"],
        "/tmp/crosshost-demo/wheels": ["openat"],
    }  # the attempt's own files, relative names and /proc are noise


def test_a_real_strace_sees_a_file_the_predicate_looks_for(tmp_path: Path):
    strace = shutil.which("strace")
    assert strace is not None, "strace is installed by make setup"
    script = tmp_path / "work" / "run_tests.sh"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n[ -e /opt/crosshost-test-absent/flag ] && exit 1\nexit 0\n")
    log = tmp_path / "strace.log"
    import subprocess

    subprocess.run(traced_argv(strace, log, ["sh", str(script)]), check=True, cwd=tmp_path / "work")
    found = touched_paths(log.read_text(), [str(tmp_path)])
    assert "/opt/crosshost-test-absent/flag" in found and str(script) not in found


def test_the_parents_of_the_attempts_own_directories_are_not_evidence():
    log = (
        '1  newfstatat(AT_FDCWD, "/srv/ws", 0x1, 0) = 0\n'
        '1  newfstatat(AT_FDCWD, "/srv/ws/bundles/abc/suite/agent/a.py", 0x1, 0) = 0\n'
        '1  newfstatat(AT_FDCWD, "/srv/wsx", 0x1, 0) = -1 ENOENT (No such file or directory)\n'
    )
    # /srv/ws lies on the way to the suite (its parents differ where the workspace roots do); /srv/wsx does not
    assert touched_paths(log, ["/srv/ws/bundles/abc/suite"]) == {"/srv/wsx": ["newfstatat"]}


def test_a_tracer_keeps_each_sides_processes_apart_and_reads_them_in_order(tmp_path: Path):
    strace = shutil.which("strace")
    assert strace is not None, "strace is installed by make setup"
    import subprocess

    from agent_runner.filetrace import Tracer

    tracer = Tracer(strace, tmp_path)
    agent, predicate = tracer.wrap("agent"), tracer.wrap("predicate")
    for argv in (agent(["sh", "-c", "[ -e /opt/crosshost-test-agent-1 ]; exit 0"]),
                 agent(["sh", "-c", "cat /opt/crosshost-test-agent-2 2>/dev/null; exit 0"]),
                 predicate(["sh", "-c", "[ -e /opt/crosshost-test-predicate ]; exit 0"])):  # fmt: skip
        subprocess.run(argv, check=True)
    agent(["never-started"])  # handed out, never run: no log, and no error while another one exists
    seen = tracer.paths("agent", [str(tmp_path)])
    assert [p for p in seen if p.startswith("/opt/")] == ["/opt/crosshost-test-agent-1", "/opt/crosshost-test-agent-2"]
    assert [p for p in tracer.paths("predicate", [str(tmp_path)]) if p.startswith("/opt/")] == [
        "/opt/crosshost-test-predicate"
    ]


def test_a_side_whose_strace_wrote_no_log_at_all_is_an_error_not_an_empty_trace(tmp_path: Path):
    import pytest

    from agent_runner.filetrace import Tracer

    tracer = Tracer("/usr/bin/strace", tmp_path)
    tracer.wrap("agent")(["sh"])
    with pytest.raises(OSError):
        tracer.paths("agent", [])
    assert tracer.paths("predicate", []) == {}  # nothing of it ran: nothing touched


def test_a_secret_looking_path_is_withheld():
    from agent_runner.filetrace import shown_path

    assert shown_path("/usr/local/bin:/usr/bin") == "/usr/local/bin:/usr/bin"
    assert shown_path("/opt/ghp_" + "a" * 36 + "/bin:/usr/bin") is None


def test_a_directory_named_with_a_trailing_slash_is_one_path():
    log = (
        '1  openat(AT_FDCWD, "/tmp/cache/", O_RDONLY|O_DIRECTORY) = 3\n'
        '1  chdir("/tmp/cache") = 0\n'
    )
    assert touched_paths(log, []) == {"/tmp/cache": ["openat", "chdir"]}


def test_a_path_whose_name_looks_like_a_credential_is_not_kept():
    token = "ghp_" + "b" * 36
    log = f'1  openat(AT_FDCWD, "/opt/cache/{token}/state", O_RDONLY) = 3\n1  openat(AT_FDCWD, "/opt/x", O_RDONLY) = 3\n'
    assert touched_paths(log, []) == {"/opt/x": ["openat"]}


def test_past_the_cap_library_paths_are_dropped_first_and_the_cut_says_how_many_and_where() -> None:
    """An agent's interpreter and libraries read thousands of paths when it starts; a lookup of one
    host's /opt made after them is kept, and what was dropped is counted by directory."""
    lines = [f'1 openat(AT_FDCWD, "/usr/lib/python3.11/m{i}.py", O_RDONLY) = 3' for i in range(900)]
    lines += [f'1 stat("/venv/lib/python3.11/site-packages/litellm/p{i}.json", {{}}) = 0' for i in range(400)]
    lines += ['1 access("/opt/flags/feature.flag", F_OK) = -1 ENOENT (No such file)']
    cut = EvidenceCut()
    found = filetrace.touched_paths("\n".join(lines), [], cut)
    assert len(found) == filetrace.MAX_PATHS and found["/opt/flags/feature.flag"] == ["access"]
    assert cut == EvidenceCut(dropped=301, under={"/venv/lib": 301})  # the last touched of them
    assert list(found)[0] == "/opt/flags/feature.flag"  # the others first, each in the order touched
    assert filetrace.library_path("/usr/lib/python3.11/os.py") and not filetrace.library_path("/opt/x/lib.flag")
    small = EvidenceCut()
    assert len(filetrace.touched_paths("\n".join(lines[:10]), [], small)) == 10 and small == EvidenceCut()
