"""The cleanup's process scan (remote._SURVIVORS_PY) finds the same processes as its plain version,
which read every process's cmdline, cwd and environ before asking whether it belongs to this host."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.hosts import remote

#: the scan as it was before it asked "this host's?" first (the reference for the one now used)
PLAIN_SCAN = r"""
def scan():
    found = []
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in spared]
    except OSError:
        return found
    for p in pids:
        d = "/proc/" + p
        try:
            with open(d + "/cmdline", "rb") as fh:
                cmd = fh.read()
        except OSError:
            continue
        try:
            cwd = os.readlink(d + "/cwd")
        except OSError:
            cwd = ""
        hit = cwd == ws or cwd.startswith(ws + "/") or inside in cmd
        if not hit:
            try:
                with open(d + "/environ", "rb") as fh:
                    hit = inside in fh.read()
            except OSError:
                pass
        if hit and this_host(p):
            found.append(int(p))
    return found
"""


def _listing(script: str, ws: Path, *, within: tuple[str, ...] = (), cwd: Path | None = None) -> set[int]:
    """The pids ``script``'s scan finds (nothing killed: the script stops before its kill loop);
    ``within``: the command the scan runs under (a mount namespace of its own, a shell)."""
    head = script.split("left = scan()")[0]
    proc = subprocess.run([*within, sys.executable, "-I", "-B", "-c", head + "\nprint(' '.join(map(str, scan())))", str(ws)],
                          capture_output=True, text=True, timeout=60, cwd=cwd)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return {int(x) for x in proc.stdout.split()}


def _plain(ws: Path) -> set[int]:
    return _listing(remote._SURVIVORS_PY.split("def scan():")[0] + PLAIN_SCAN + "\nleft = scan()", ws)


def test_the_scan_finds_what_the_plain_scan_finds(tmp_path: Path) -> None:
    ws = tmp_path / "runs" / "r1-box"
    (ws / "work" / "t").mkdir(parents=True)
    sleep = ["sleep", "300"]
    started = {
        "cwd": subprocess.Popen(sleep, cwd=ws),
        "cwd below": subprocess.Popen(sleep, cwd=ws / "work" / "t"),
        "named": subprocess.Popen(["sh", "-c", f"sleep 300; : {ws}/work"], cwd=tmp_path),
        "environ": subprocess.Popen(sleep, cwd=tmp_path, env={**os.environ, "WHERE": f"{ws}/work"}),
        # a word a scan once spared its own shell by: copied, it spares nothing
        "copies a marker": subprocess.Popen(["sh", "-c", "sleep 300; : crosshost-clean-0123456789abcdef"], cwd=ws),
        "elsewhere": subprocess.Popen(sleep, cwd=tmp_path),
    }
    try:
        time.sleep(0.3)  # the shells' cwd and command lines are in /proc
        want = {p.pid for name, p in started.items() if name != "elsewhere"}
        for where in (ws, tmp_path / "gone"):  # the workspace there, and gone (told by ancestry then)
            found, plain = _listing(remote._SURVIVORS_PY, where), _plain(where)
            assert found == plain
            mine = {p.pid for p in started.values()}
            if where == ws:
                assert found & mine == want
    finally:
        for p in started.values():
            p.kill()
            p.wait()


@pytest.mark.root
def test_with_the_workspace_gone_a_process_two_mount_namespaces_below_is_this_hosts(tmp_path: Path) -> None:
    """An attempt's mount namespace is made from its runner's, which is made from the host's (the
    attempts' directories in memory): once the workspace is gone, the scan still tells such a process
    is this host's, by its ancestry through both namespaces."""
    ws = tmp_path / "runs" / "r1-box"  # gone: never made
    inner = f"sleep 300; : {ws}/work"
    runner = subprocess.Popen(
        ["unshare", "--mount", "sh", "-c", f"unshare --mount sh -c {remote.q(inner)} & wait"], start_new_session=True
    )
    try:
        own = os.readlink("/proc/self/ns/mnt")
        attempt = _named_below(f"{ws}/work".encode(), exclude={own, os.readlink(f"/proc/{runner.pid}/ns/mnt")})
        assert attempt is not None  # the inner shell: two namespaces below ours
        assert attempt in _listing(remote._SURVIVORS_PY, ws)
    finally:
        os.killpg(runner.pid, 9)  # both shells and the sleep
        runner.wait()


def _named_below(named: bytes, exclude: set[str]) -> int | None:
    """The pid of a process whose command line holds ``named`` and whose mount namespace is none of
    ``exclude`` (waited for up to 10 s: the namespaces are made by processes starting meanwhile)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if named in Path(f"/proc/{pid}/cmdline").read_bytes() and os.readlink(f"/proc/{pid}/ns/mnt") not in exclude:
                    return int(pid)
            except OSError:
                continue
        time.sleep(0.05)
    return None


@pytest.mark.root
def test_with_the_workspace_gone_a_process_not_below_the_scans_namespace_is_left_alone(tmp_path: Path) -> None:
    """Another host's process on a machine shared by namespaces (its own, not made from this host's)
    is never this host's, even when it names this host's workspace path."""
    ws = tmp_path / "runs" / "r1-box"  # gone: never made
    other = subprocess.Popen(["unshare", "--mount", "sh", "-c", f"sleep 300; : {ws}/work"], start_new_session=True)
    try:
        found = _named_below(f"{ws}/work".encode(), exclude={os.readlink("/proc/self/ns/mnt")})
        assert found == other.pid
        assert found in _listing(remote._SURVIVORS_PY, ws)  # from the machine's namespace: below it
        assert found not in _listing(remote._SURVIVORS_PY, ws, within=("unshare", "--mount"))
    finally:
        os.killpg(other.pid, 9)
        other.wait()


def test_the_scan_spares_the_processes_above_it_and_no_other_that_looks_like_them(tmp_path: Path) -> None:
    """The shells the scan runs under name the workspace and sit in it (the run's own shell, when the
    run's exec removes its workspace): spared, by pid. A process with the same command line and
    directory that is not above the scan is found."""
    ws = tmp_path / "runs" / "r1-box"
    ws.mkdir(parents=True)
    twin = subprocess.Popen(["sh", "-c", f": {remote.q(f'{ws}/out')}; sleep 300"], cwd=ws)
    try:
        time.sleep(0.2)
        head = remote._SURVIVORS_PY.split("left = scan()")[0]
        said = subprocess.run(
            ["sh", "-c", f': {remote.q(f"{ws}/out")}; {remote.q(sys.executable)} -I -B -c "$0" "$1"; echo "shell $$"',
             head + "\nprint(' '.join(map(str, scan())))", str(ws)],
            capture_output=True, text=True, timeout=60, cwd=ws,
        )  # fmt: skip
        found_line, shell_line = said.stdout.strip().splitlines()
        found = {int(x) for x in found_line.split()}
        assert twin.pid in found
        assert int(shell_line.split()[1]) not in found  # the scan's own shell: in the workspace, naming it
    finally:
        twin.kill()
        twin.wait()


@pytest.mark.parametrize("mark", ["file", "link", "none"])
def test_where_the_runner_left_its_mark_the_removal_does_not_scan(tmp_path: Path, mark: str) -> None:
    """``remote.REAPED``, a file the runner makes when no process of its attempts is left, spares the
    removal its scan: a process that names the workspace is then not looked for (at ``pidns+uid`` no
    attempt's can be there). A link of that name, or none, and the scan runs and kills it."""
    ws = tmp_path / "runs" / "r1-box"
    (ws / "out").mkdir(parents=True)
    if mark == "file":
        (ws / remote.REAPED).touch()
    elif mark == "link":
        (tmp_path / "elsewhere").touch()
        (ws / remote.REAPED).symlink_to(tmp_path / "elsewhere")
    named = subprocess.Popen(["sh", "-c", f": {remote.q(f'{ws}/out')}; sleep 300"])
    try:
        time.sleep(0.2)
        done = subprocess.run(["sh", "-c", remote.remove_script(str(ws), sys.executable)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert not ws.exists()
        time.sleep(0.1)
        assert (named.poll() is None) == (mark == "file")
    finally:
        named.kill()
        named.wait()


@pytest.mark.root
def test_a_process_the_removal_cannot_kill_leaves_the_workspace_not_reported_removed(tmp_path: Path) -> None:
    """Something of the run that outlasts every kill: the init of a PID namespace, in the workspace,
    with the removal run inside that namespace (where the kernel drops a SIGKILL to its own init).
    The removal kills for its tries, then says which are still alive and exits non-zero: the
    workspace is not reported removed (``workspace_removed`` is its exit)."""
    ws = tmp_path / "runs" / "r1-box"
    (ws / "out").mkdir(parents=True)
    init = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c",
                             f"cd {remote.q(str(ws / 'out'))} && exec sleep 300"])  # fmt: skip
    try:
        inside = _child_of(init.pid)  # the namespace's init, as this namespace numbers it
        done = subprocess.run(["nsenter", "--target", str(inside), "--pid", "--mount", "sh", "-c",
                               remote.remove_script(str(ws), sys.executable)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode != 0, (done.stdout, done.stderr)
        assert "processes of the run still alive: 1" in done.stderr, done.stderr
        assert os.path.exists(f"/proc/{inside}")  # it outlasted the removal
    finally:
        init.kill()  # --kill-child: the namespace's init dies with it
        init.wait()


def _child_of(pid: int, timeout_s: float = 10.0) -> int:
    """The one child of ``pid`` once it has one (``unshare --fork``'s, the new namespace's init)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if children and os.readlink(f"/proc/{children[0]}/cwd").endswith("/out"):
                return int(children[0])
        time.sleep(0.02)
    raise AssertionError(f"no child of {pid} in the workspace within {timeout_s} s")
