"""File-access evidence: which paths a predicate touched outside its own directories (strace's log)."""

from __future__ import annotations

import shutil
from pathlib import Path

from agent_runner.filetrace import touched_paths, traced_argv

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
