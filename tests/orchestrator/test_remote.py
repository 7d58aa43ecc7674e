"""remote.kill_script signals the run's own runner group, never a process an agent named in `pid`."""

from __future__ import annotations

import base64
import io
import json
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.hosts import remote


def _start_run(ws: Path) -> subprocess.Popen[bytes]:
    """What replay starts on a host: run_script in the workspace, a stand-in runner that waits."""
    (ws / "out").mkdir()
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "run", "--out", f"{ws}/out"]
    script = remote.run_script(str(ws), ["PATH"], {}, argv, 60)
    proc = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    for _ in range(100):
        if (ws / "pid").is_file() and (ws / "pid").read_text().strip():
            break
        time.sleep(0.05)
    return proc


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_kill_script_kills_the_runs_own_runner(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    proc = _start_run(ws)
    try:
        runner = int((ws / "pid").read_text())
        subprocess.run(["sh", "-c", remote.kill_script(str(ws))], timeout=30, check=True)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while _alive(runner) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(runner)
    finally:
        proc.kill()


def test_kill_script_kills_a_runner_whose_exec_was_still_making_its_workspace(tmp_path: Path) -> None:
    """Ctrl-C while a host's run exec is still making the workspace (nothing pinned: the run's own exec
    makes it): the kill, sent first, still finds and kills the runner that exec starts a moment later."""
    ws = tmp_path / "ws"
    kill = subprocess.Popen(["sh", "-c", remote.kill_script(str(ws))])
    time.sleep(0.3)
    ws.mkdir()
    proc = _start_run(ws)
    try:
        runner = int((ws / "pid").read_text())
        assert kill.wait(timeout=30) == 0
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while _alive(runner) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(runner)
    finally:
        proc.kill()


def test_kill_script_gives_up_soon_on_a_workspace_never_made(tmp_path: Path) -> None:
    started = time.monotonic()
    subprocess.run(["sh", "-c", remote.kill_script(str(tmp_path / "never"))], timeout=30, check=True)
    assert time.monotonic() - started < 4


def test_kill_script_spares_a_foreign_process_group_named_in_the_pid_file(tmp_path: Path) -> None:
    """An agent can write any pid into the workspace's `pid`: another run's runner, the user's shell."""
    ws = tmp_path / "ws"
    ws.mkdir()
    other_ws = tmp_path / "other-run"
    other_ws.mkdir()
    others = [
        subprocess.Popen(["sleep", "30"], start_new_session=True),  # any process group of the user
        _start_run(other_ws),  # another run's runner (same launcher, another workspace)
    ]
    other_runner = int((other_ws / "pid").read_text())
    try:
        for pid in (others[0].pid, other_runner):
            (ws / "pid").write_text(f"{pid}\n")
            done = subprocess.run(["sh", "-c", remote.kill_script(str(ws))], timeout=30)
            assert done.returncode == 0
            time.sleep(0.2)
            assert _alive(pid), pid
    finally:
        for p in others:
            p.kill()
        subprocess.run(["sh", "-c", remote.kill_script(str(other_ws))], timeout=30)


@pytest.mark.parametrize("forged", ["1", "-1", "0", "$(touch x)", "1 2", ""])
def test_kill_script_never_signals_a_forged_pid(tmp_path: Path, forged: str) -> None:
    """The runner's workspace holds `pid`; an agent could overwrite it. `kill -- -1` would kill every
    process of the user, so only a plain number above 1 is ever signalled."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "pid").write_text(forged + "\n")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    log = tmp_path / "kill.log"
    (fake_bin / "kill").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (fake_bin / "kill").chmod(0o755)
    # `kill` is a shell builtin; run the script with the builtin disabled via a function shim.
    script = f'kill() {{ {fake_bin}/kill "$@"; }}; ' + remote.kill_script(str(ws))
    done = subprocess.run(["sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    assert not log.exists(), log.read_text()
    assert not (tmp_path / "x").exists()


def test_kill_script_signals_a_real_process_group(tmp_path: Path) -> None:
    # The run's own launcher (timeout ... --out <ws>/out), as run_script starts it; a bare process
    # named in the pid file is spared (above).
    ws = tmp_path / "ws"
    ws.mkdir()
    proc = subprocess.Popen(
        ["timeout", "-s", "KILL", "60", "sh", "-c", "sleep 30", "run", "--out", f"{ws}/out"],
        start_new_session=True,
    )
    try:
        (ws / "pid").write_text(f"{proc.pid}\n")
        subprocess.run(["sh", "-c", remote.kill_script(str(ws))], timeout=30, check=True)
        assert proc.wait(timeout=10) == -9
    finally:
        proc.kill()


@pytest.mark.parametrize("pinned", [{"TZ": "Pinned/Zone"}, {}])
def test_the_run_script_removes_the_pins_file_after_the_runner_and_packs_out(tmp_path: Path, pinned: dict[str, str]) -> None:
    """A pinned value reaches the runner from in/pins.env, which is gone once the run is over; with
    nothing pinned there is none to remove. Either way out/ comes back packed and the runner's exit is
    the script's."""
    ws = tmp_path / "ws"
    for sub in ("out", remote.PRIVATE_DIR):
        (ws / sub).mkdir(parents=True)
    pins = Path(remote.pins_path(str(ws)))
    if pinned:
        pins.write_text(remote.pins_text(pinned))
    argv = [sys.executable, "-c", "import os, sys; open(sys.argv[2] + '/tz', 'w').write(os.environ.get('TZ', '-')); "
            "sys.exit(3)", "--out", f"{ws}/out"]
    script = remote.run_script(str(ws), ["PATH", "TZ"], list(pinned), argv, 60)
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 3, done.stderr
    assert (ws / "out" / "tz").read_text() == pinned.get("TZ", "-")
    assert not pins.exists()
    _, out_tar = remote.split_out_tar(done.stdout)
    assert out_tar.size == str((ws / "out.tar").stat().st_size)
    assert out_tar.inline == (ws / "out.tar").read_bytes()


def _run_and_pack(tmp_path: Path, runner_says: str, **kwargs: int) -> tuple[subprocess.CompletedProcess[str], Path]:
    ws = tmp_path / "ws"
    (ws / "out").mkdir(parents=True)
    argv = [sys.executable, "-c", "import sys; open(sys.argv[2] + '/trace.jsonl', 'wb').write(bytes(range(256)) * 40); "
            f"print({runner_says!r}, end='')", "--out", f"{ws}/out"]
    script = remote.run_script(str(ws), ["PATH"], [], argv, 60, **kwargs)
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return done, ws / "out.tar"


@pytest.mark.parametrize("runner_says", ["digest line\n", "no newline at the end", "", f"{remote.INLINE_MARKER}\n"])
def test_a_small_archive_comes_home_in_the_runs_own_output_and_the_runners_lines_stay_its_own(
    tmp_path: Path, runner_says: str
) -> None:
    """No transfer session for a small out.tar: its bytes (binary, every byte value) are in the run's
    output, and what the runner printed is given back as it was, even a line that reads like the
    marker before the archive."""
    done, tar = _run_and_pack(tmp_path, runner_says)
    stdout, out_tar = remote.split_out_tar(done.stdout)
    assert out_tar.inline == tar.read_bytes() and out_tar.size == str(len(out_tar.inline))
    assert stdout.rstrip("\n") == runner_says.rstrip("\n")


def test_an_archive_over_the_inline_size_is_left_to_be_fetched(tmp_path: Path) -> None:
    done, tar = _run_and_pack(tmp_path, "line\n", inline_max=1000)
    stdout, out_tar = remote.split_out_tar(done.stdout)
    assert (stdout, out_tar) == ("line", remote.OutTar(str(tar.stat().st_size)))


@pytest.mark.parametrize("mangle", [
    lambda b64: b64[:-30] + "\n",  # cut short: decodes to fewer bytes than the size printed
    lambda b64: "!=" + b64,        # not base64
])
def test_an_inline_archive_that_does_not_decode_to_its_size_is_fetched_instead(
    tmp_path: Path, mangle: Callable[[str], str]
) -> None:
    """The host's output is its word like the fetched file is: an inline archive that does not decode
    to the size printed is dropped (then fetched, and checked as every archive is)."""
    done, tar = _run_and_pack(tmp_path, "")
    head, sep, rest = done.stdout.partition(f"\n{remote.INLINE_MARKER}\n")
    b64, marker_sep, last = rest.rpartition("\n\n")
    assert remote.split_out_tar(head + sep + b64 + marker_sep + last)[1].inline == tar.read_bytes()
    assert remote.split_out_tar(head + sep + mangle(b64) + marker_sep + last)[1] == remote.OutTar(str(tar.stat().st_size))


def test_a_runner_that_stopped_before_making_work_still_gets_the_fallback_fingerprint_there(tmp_path: Path) -> None:
    """The run's own exec leaves work/ to the runner: one that stopped before it made work/ (and wrote
    no fingerprint) still has the host described, from work/ made then with the runner's mode."""
    from orchestrator.hosts.fingerprint import fingerprint_script
    from orchestrator.hosts.inventory import HostConfig

    ws = tmp_path / "ws"
    (ws / "out").mkdir(parents=True)
    cfg = HostConfig(name="h", transport="local", env_allowlist=["PATH"])
    describe = fingerprint_script(cfg, "unused", str(ws), argv=lambda _args: ["sh", "-c", 'printf \'{"cwd": "%s"}\' "$PWD"'])
    script = remote.run_script(str(ws), ["PATH"], [], [sys.executable, "-c", "raise SystemExit(1)"], 60, fingerprint=describe)
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 1, done.stderr
    assert json.loads((ws / "out" / "fingerprint.json").read_text()) == {"cwd": str(ws / "work")}
    assert stat.S_IMODE((ws / "work").stat().st_mode) == 0o711


def test_a_host_without_base64_sends_no_archive_in_its_output(tmp_path: Path) -> None:
    """Where the host has no ``base64`` the archive is left to be fetched, as an oversized one is."""
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "timeout", "env", "tar", "wc", "rm", "mv"):
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    ws = tmp_path / "ws"
    (ws / "out").mkdir(parents=True)
    argv = [sys.executable, "-c", "import sys; open(sys.argv[2] + '/f', 'w').write('x')", "--out", f"{ws}/out"]
    script = remote.run_script(str(ws), ["PATH"], [], argv, 60)
    done = subprocess.run([str(bin_dir / "sh"), "-c", script], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(bin_dir)})
    assert done.returncode == 0, done.stderr
    assert remote.INLINE_MARKER not in done.stdout
    assert remote.split_out_tar(done.stdout)[1] == remote.OutTar(str((ws / "out.tar").stat().st_size))


@pytest.mark.parametrize(("said", "encoded"), [
    ("3", "YWI="),                                  # strict base64 of the right length, but of 2 bytes
    ("3", base64.b64encode(b"x" * 300).decode()),  # far more than the size printed: not even decoded
    ("none", "YWJj"),                               # no size at all
])
def test_an_inline_archive_is_taken_only_at_exactly_the_size_printed(said: str, encoded: str) -> None:
    text = f"runner line\n{remote.INLINE_MARKER}\n{encoded}\n\n{remote.OUT_TAR_MARKER} {said} inline\n"
    assert remote.split_out_tar(text) == ("runner line", remote.OutTar(said))


def test_the_text_of_a_base64_that_failed_is_not_left_in_the_runners_output() -> None:
    """``base64`` stopped part of the way (no ``inline`` said): its text is no runner line."""
    text = f"digest line\n{remote.INLINE_MARKER}\nYWJjZGVm\nYWJj\n\n{remote.OUT_TAR_MARKER} 9\n"
    assert remote.split_out_tar(text) == ("digest line", remote.OutTar("9"))
    assert remote.split_out_tar(f"digest line\n\n{remote.OUT_TAR_MARKER} 9\n") == ("digest line", remote.OutTar("9"))


@pytest.mark.parametrize("removal_works", [True, False])
def test_the_run_removes_its_workspace_once_the_archive_is_out_and_says_so_only_when_it_did(
    tmp_path: Path, removal_works: bool
) -> None:
    """The archive goes out in the run's own output, then the same exec removes the workspace: said on
    the marker line only when that removal exited 0. Nothing the removal prints reaches the output
    (it would land in the archive's text); the runner's lines and the archive are as without it."""
    ws = tmp_path / "ws"
    (ws / "out").mkdir(parents=True)
    argv = [sys.executable, "-c", "import sys; open(sys.argv[2] + '/f', 'wb').write(bytes(range(256))); print('runner line')",
            "--out", f"{ws}/out"]
    removal = remote.remove_script(str(ws)) if removal_works else "echo a removal that fails; echo why >&2; exit 1"
    script = remote.run_script(str(ws), ["PATH"], [], argv, 60, remove=removal)
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    stdout, out_tar = remote.split_out_tar(done.stdout)
    assert stdout.rstrip("\n") == "runner line" and out_tar.inline is not None and out_tar.size == str(len(out_tar.inline))
    with tarfile.open(fileobj=io.BytesIO(out_tar.inline)) as tar:
        member = tar.extractfile("./f")
        assert member is not None and member.read() == bytes(range(256))
    assert out_tar.removed is removal_works
    assert ws.exists() is not removal_works
    assert "why" not in done.stderr and "fails" not in done.stdout


def test_an_archive_left_to_be_fetched_is_never_removed_by_the_run(tmp_path: Path) -> None:
    """Over the inline size the archive is fetched from the workspace: the run leaves it there."""
    ws = tmp_path / "ws"
    (ws / "out").mkdir(parents=True)
    argv = [sys.executable, "-c", "import sys; open(sys.argv[2] + '/f', 'w').write('x' * 5000)", "--out", f"{ws}/out"]
    script = remote.run_script(str(ws), ["PATH"], [], argv, 60, inline_max=1000, remove=remote.remove_script(str(ws)))
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    out_tar = remote.split_out_tar(done.stdout)[1]
    assert out_tar == remote.OutTar(str((ws / "out.tar").stat().st_size)) and not out_tar.removed


@pytest.mark.parametrize(("last", "removed"), [
    ("inline removed", True),
    ("inline", False),
    ("removed", None),          # removed without the archive in the output: no word of this script
    ("inline removed more", None),
])
def test_the_marker_line_says_removed_only_after_inline(last: str, removed: bool | None) -> None:
    encoded = base64.b64encode(b"abc").decode()
    out_tar = remote.split_out_tar(f"line\n{remote.INLINE_MARKER}\n{encoded}\n\n{remote.OUT_TAR_MARKER} 3 {last}\n")[1]
    if removed is None:
        assert out_tar == remote.OutTar(None)
    else:
        assert out_tar == remote.OutTar("3", b"abc", removed)
