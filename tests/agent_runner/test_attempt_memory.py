"""A root runner's attempts live in a tmpfs only its run sees (``agent_runner.attempt_memory``): a process
outside the run cannot find an attempt's files at the path the attempt works in, nothing of the tmpfs
is left when the run ends, and ``--attempts-on-disk`` keeps them on the workspace root's file system."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_runner.attempt_memory import mount_over
from agent_runner.fingerprint import filesystem_of
from tests.support.runner import (
    ATTEMPTS_ROOT_MOUNT_SH,
    REPO,
    clean_env,
    passable_to_attempts,
    predicate_suite,
    records,
)

pytestmark = pytest.mark.root

#: the predicate: say where it works and on what, then wait for the test to look from outside the run
PREDICATE = (
    "echo secret > left-here\n"
    + ATTEMPTS_ROOT_MOUNT_SH
    + 'printf "%s %s\\n" "$PWD" "${fs:-none}" > "$SEEN/said.tmp" && mv "$SEEN/said.tmp" "$SEEN/said"\n'
    + 'i=0; while ! test -e "$SEEN/looked" && test $i -lt 100; do sleep 0.05; i=$((i+1)); done\n'
)


def _mounts_at(path: Path) -> list[str]:
    """The mounts at ``path`` in this (the host's) mount namespace."""
    with open("/proc/self/mountinfo") as fh:
        return [line for line in fh if line.split()[4] == str(path)]


def _in_a_process(code: str, root: Path) -> str:
    """What ``code`` prints, run in a Python of its own with ``root`` as its argument (a mount namespace
    it moves to is its own, never the test's)."""
    return subprocess.run([sys.executable, "-c", code, str(root)], env=clean_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=30, check=True).stdout


def _run_and_look(tmp_path: Path, *extra: str) -> tuple[str, str, bool]:
    """Run a one-task suite through the runner's CLI; while its predicate waits, look from outside the
    run for the file it wrote. (its directory, the file system there, whether the file was seen)."""
    passable_to_attempts(tmp_path)
    seen = tmp_path / "seen"
    seen.mkdir()
    seen.chmod(0o777)
    suite = predicate_suite(tmp_path, PREDICATE.replace("$SEEN", str(seen)), tasks=1)
    ws, out = tmp_path / "ws" / "work", tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_runner", "run", "--suite", str(suite), "--out", str(out),
         "--workspace-root", str(ws), "--host", "h", *extra],
        env=clean_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (seen / "said").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        where, fs = (seen / "said").read_text().split()
        visible = (Path(where) / "left-here").exists()
        (seen / "looked").touch()
        _out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    [row] = records(out / "results.jsonl")
    assert row["verdict"] == "pass", row
    # nothing of the run is left: no attempt directory, no mount
    assert list(ws.iterdir()) == []
    assert _mounts_at(ws) == []
    # the host's fingerprint says what its attempts worked on
    assert json.loads((out / "fingerprint.json").read_text())["cwd_fs"] == (
        "tmpfs" if fs == "tmpfs" else filesystem_of(str(ws)))
    return where, fs, visible


def test_an_attempts_files_are_in_a_tmpfs_no_process_outside_the_run_sees(tmp_path: Path) -> None:
    where, fs, visible = _run_and_look(tmp_path)
    assert where.startswith(str(tmp_path / "ws" / "work") + "/")
    assert fs == "tmpfs"
    assert not visible, "a process outside the run found the attempt's file"


def test_attempts_on_disk_keeps_them_on_the_workspace_roots_file_system(tmp_path: Path) -> None:
    where, fs, visible = _run_and_look(tmp_path, "--attempts-on-disk")
    assert where.startswith(str(tmp_path / "ws" / "work") + "/")
    assert fs == "none"
    assert visible


def test_a_workspace_root_that_holds_anything_is_never_hidden(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "kept").write_text("x")
    assert mount_over(str(root)) is False  # it says no before it changes this process's namespace
    assert _mounts_at(root) == []
    assert (root / "kept").read_text() == "x"


def test_the_mount_is_the_runs_alone_and_goes_with_its_last_process(tmp_path: Path) -> None:
    root = tmp_path / "new" / "root"
    code = (
        "import json, os, sys\n"
        "from agent_runner.attempt_memory import mount_over\n"
        "ok = mount_over(sys.argv[1])\n"
        "open(os.path.join(sys.argv[1], 'f'), 'w').write('x')\n"
        "st = os.stat(sys.argv[1])\n"
        "print(json.dumps([ok, oct(st.st_mode & 0o7777), st.st_uid]))\n"
    )
    assert json.loads(_in_a_process(code, root)) == [True, "0o711", 0]
    assert list(root.iterdir()) == []  # the file went with the tmpfs, the tmpfs with the process
    assert _mounts_at(root) == []
    assert oct(os.stat(root).st_mode & 0o777) == "0o711"


def test_a_process_with_threads_is_refused(tmp_path: Path) -> None:
    """The namespace would be the calling thread's alone: another thread's children would miss the tmpfs."""
    root = tmp_path / "root"
    code = (
        "import sys, threading\n"
        "from agent_runner.attempt_memory import mount_over\n"
        "done = threading.Event()\n"
        "threading.Thread(target=done.wait).start()\n"
        "print(mount_over(sys.argv[1])); done.set()\n"
    )
    assert _in_a_process(code, root).split() == ["False"]
    assert _mounts_at(root) == []


def test_a_refused_mount_leaves_a_root_other_uids_can_pass_whatever_the_umask(tmp_path: Path) -> None:
    """Where the kernel refuses the mount (a container without CAP_SYS_ADMIN), the root it made is
    still 711 under umask 027: the attempts' own uids pass through it to their directories."""
    root = tmp_path / "root"
    code = (
        "import os, sys\n"
        "from agent_runner import attempt_memory, privs\n"
        "class Refusing:\n"
        "    def unshare(self, flags): return 0\n"
        "    def mount(self, *args): return -1\n"
        "privs.libc = Refusing\n"
        "os.umask(0o027)\n"
        "print(attempt_memory.mount_over(sys.argv[1]))\n"
    )
    assert _in_a_process(code, root).split() == ["False"]
    assert oct(os.stat(root).st_mode & 0o777) == "0o711"


#: run in a mount namespace whose "/" is shared (as on a host booted by systemd): a child mounts over
#: argv[1], then this namespace (the host's, here) reads its own mounts there; argv[2] says how the
#: child mounts: "runner" (attempt_memory.mount_over) or "unshared" (a new namespace and a tmpfs,
#: nothing more: what the mount would do without making "/" a slave first)
SHARED_HOST = r"""
import os, subprocess, sys
root, how = sys.argv[1], sys.argv[2]
with open("/proc/self/mountinfo") as fh:
    slash = [line.split(" - ")[0].split()[6:] for line in fh if line.split()[4] == "/"][0]
assert any(tag.startswith("shared:") for tag in slash), slash
child = (
    "import os, sys\n"
    "from agent_runner import attempt_memory, privs\n"
    "if sys.argv[2] == 'runner':\n"
    "    ok = attempt_memory.mount_over(sys.argv[1])\n"
    "else:\n"
    "    libc = privs.libc()\n"
    "    ok = libc.unshare(privs._CLONE_NEWNS) == 0 and libc.mount(b'tmpfs', os.fsencode(sys.argv[1]), b'tmpfs', 0, None) == 0\n"
    "print(ok, flush=True)\n"
    "sys.stdin.readline()\n"
)
os.makedirs(root, exist_ok=True)
proc = subprocess.Popen([sys.executable, "-c", child, root, how], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
mounted = proc.stdout.readline().strip()
with open("/proc/self/mountinfo") as fh:
    seen = sum(1 for line in fh if line.split()[4] == root)
proc.communicate("\n")
print(mounted, seen)
"""


def test_under_a_shared_root_the_mount_never_reaches_the_hosts_namespace(tmp_path: Path) -> None:
    """On a host whose "/" is shared (systemd's default), a mount made in a new namespace propagates
    back to the host's; the runner's "/" is made a slave first, so its tmpfs stays its own. The same
    mount without that step is seen by the host: the set-up can tell."""
    root = tmp_path / "root"

    def host_sees(how: str) -> list[str]:
        argv = ["unshare", "--mount", "--propagation", "shared", sys.executable, "-c", SHARED_HOST, str(root), how]
        return subprocess.run(argv, env=clean_env(), cwd=REPO, capture_output=True, text=True, timeout=30,
                              check=True).stdout.split()

    assert host_sees("runner") == ["True", "0"]
    assert host_sees("unshared") == ["True", "1"]
    assert _mounts_at(root) == []
