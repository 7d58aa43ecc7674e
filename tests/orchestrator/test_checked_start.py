"""The runner's checked start runs the bytes it checked: a ``runner.pyz`` renamed over the bundle's
after the digest (by a process of the runner's own uid, as at ``pidns`` and ``none``, where the bundle
is that uid's) is never run, and the zipapp is opened by its path once."""

from __future__ import annotations

import ctypes
import io
import json
import os
import select
import shutil
import struct
import subprocess
import threading
import zipfile
from pathlib import Path

import pytest

from orchestrator.hosts.bundle import (
    BUNDLE_REFUSED_EXIT,
    Bundle,
    build_bundle,
    checked_runner_argv,
    ensure_bundle,
)
from orchestrator.hosts.transport.local import LocalHost
from tests.support.runner import REPO, TRIAGE, clean_env, passable_to_attempts, records

SYSTEM_PYTHON = "/usr/bin/python3"
_IN_OPEN, _IN_CLOSE_NOWRITE = 0x20, 0x10
_EVENT = struct.Struct("iIII")


def _planted_zipapp(marker: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("__main__.py", f"open({str(marker)!r}, 'w').write('planted')\nprint('planted')\n")
    return buf.getvalue()


class _Swapper(threading.Thread):
    """Watches the bundle directory (inotify): when ``runner.pyz`` is first closed after a read (the
    start's digest has it), renames a planted zipapp over it, as an attempt of the runner's uid can
    (not root: the directory made writable, then read-only again); counts every open of ``runner.pyz``."""

    def __init__(self, bundle: Path, planted: bytes) -> None:
        super().__init__(daemon=True)
        self.bundle, self.planted, self.opens, self.swapped = bundle, planted, 0, False
        self.done = threading.Event()  # set when the start is over: the thread reads what is left, then ends
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_CLOEXEC)
        assert self.fd >= 0 and libc.inotify_add_watch(self.fd, str(bundle).encode(), _IN_OPEN | _IN_CLOSE_NOWRITE) >= 0

    def stop(self) -> None:
        """The start is over: read what is left of the events, end the thread, close the watch."""
        self.done.set()
        self.join(5)
        os.close(self.fd)

    def run(self) -> None:
        while True:
            # a blocking read would outlive the close of its descriptor: a short wait, then look again
            if not select.select([self.fd], [], [], 0.05)[0]:
                if self.done.is_set():
                    return
                continue
            data = os.read(self.fd, 65536)
            while data:
                _wd, mask, _cookie, size = _EVENT.unpack_from(data)
                name = data[_EVENT.size:_EVENT.size + size].rstrip(b"\0")
                data = data[_EVENT.size + size:]
                if name != b"runner.pyz":
                    continue
                if mask & _IN_OPEN:
                    self.opens += 1
                if mask & _IN_CLOSE_NOWRITE and not self.swapped:
                    # made beside the bundle and renamed in: the start's digest, walking the bundle
                    # while this runs, never sees a file of the attack's but runner.pyz (whose stat it
                    # has from its read), nor, as root, the bundle writable for a moment
                    staged = self.bundle.parent / f".planted-{self.bundle.name}"
                    staged.write_bytes(self.planted)
                    writable = os.geteuid() != 0  # root renames into a read-only directory as it is
                    if writable:
                        self.bundle.chmod(0o755)
                    os.rename(staged, self.bundle / "runner.pyz")
                    if writable:
                        self.bundle.chmod(0o555)
                    self.swapped = True


def _swap_armed(tmp_path: Path, root: Path) -> tuple[Bundle, _Swapper, Path]:
    """The triage suite's bundle on this host under ``root``, with a large shared file (the digest goes
    on for a while after it read runner.pyz: the swap's window), and a started ``_Swapper`` that plants
    a zipapp writing the returned marker file when it runs."""
    suite = tmp_path / "suite"
    shutil.copytree(TRIAGE, suite)
    (suite / "data.bin").write_bytes(bytes(48 << 20))
    bundle = build_bundle(suite, tmp_path / "cache")
    assert ensure_bundle(LocalHost(), bundle, str(root), python=SYSTEM_PYTHON)
    marker = tmp_path / "planted-ran"
    swapper = _Swapper(Path(bundle.remote_dir(str(root))), _planted_zipapp(marker))
    swapper.start()
    return bundle, swapper, marker


def test_a_zipapp_renamed_over_the_bundles_after_its_digest_is_never_run(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    bundle, swapper, marker = _swap_armed(tmp_path, root)
    done = subprocess.run(checked_runner_argv(bundle, str(root), SYSTEM_PYTHON, ["version"]),
                          env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120)
    swapper.stop()
    assert not swapper.is_alive()
    assert swapper.swapped  # the attack happened
    assert not marker.exists() and "planted" not in done.stdout, done.stdout
    # the bytes it checked ran (or, had the swap shown in the digest, nothing ran)
    assert done.returncode in (0, BUNDLE_REFUSED_EXIT), done.stderr
    if done.returncode == 0:
        assert json.loads(done.stdout)["version"]
    assert swapper.opens == 1  # read once: no later import reopens it by its path


@pytest.mark.root
def test_a_root_runner_without_a_compiled_copy_runs_its_zygotes_and_attempts_from_the_sealed_zipapp(
    tmp_path: Path,
) -> None:
    """A root runner whose bundle lies below a directory others may write keeps no compiled copy: the
    runner, the slots' zygotes (which import the same sealed bytes through the descriptor they are
    given) and the attempts run as from the source tree."""
    passable_to_attempts(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone may rename what is in it: no compiled copy below
    root = shared / "ws"
    bundle = build_bundle(TRIAGE, tmp_path / "cache")
    ensure_bundle(LocalHost(), bundle, str(root), python=SYSTEM_PYTHON)
    verdicts = {}
    for name in ("sealed", "tree"):
        out = tmp_path / name
        args = ["run", "--suite", bundle.remote_suite(str(root)), "--out", str(out), "--workspace-root",
                str(root / "runs"), "--host", "h", "--run-id", name, "--slots", "2"]
        argv = (checked_runner_argv(bundle, str(root), SYSTEM_PYTHON, args) if name == "sealed"
                else [SYSTEM_PYTHON, "-I", "-S", "-c", "import sys; sys.path[:0] = [sys.argv.pop(1)]; "
                      "from agent_runner.__main__ import main; sys.exit(main())", str(REPO), *args])
        done = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert json.loads((out / "fingerprint.json").read_text())["isolation"] == "netns+pidns+uid"
        verdicts[name] = {r["task"]: r["verdict"] for r in records(out / "results.jsonl")}
    assert not list((root / "bundles").glob("*.pyc-*"))  # it ran from the sealed zipapp
    assert verdicts["sealed"] == verdicts["tree"] and len(verdicts["tree"]) > 10


@pytest.mark.root
def test_a_zipapp_renamed_over_the_bundles_reaches_no_zygote_of_a_run_in_slots(tmp_path: Path) -> None:
    """The swap of the first test, on a whole run in two slots from a bundle below a directory others
    may write (no compiled copy): the runner and every zygote it starts import the bytes the start
    checked, through its descriptor; the planted zipapp is never opened, let alone run."""
    passable_to_attempts(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    root = shared / "ws"
    bundle, swapper, marker = _swap_armed(tmp_path, root)
    out = tmp_path / "out"
    args = ["run", "--suite", bundle.remote_suite(str(root)), "--out", str(out), "--workspace-root",
            str(root / "runs"), "--host", "h", "--run-id", "r", "--slots", "2"]
    try:
        done = subprocess.run(checked_runner_argv(bundle, str(root), SYSTEM_PYTHON, args), env=clean_env(),
                              capture_output=True, text=True, timeout=300)
    finally:
        swapper.stop()
    assert swapper.swapped  # the attack happened, before any zygote started
    assert not marker.exists() and "planted" not in done.stdout
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert json.loads((out / "fingerprint.json").read_text())["isolation"] == "netns+pidns+uid"
    assert len({r["task"] for r in records(out / "results.jsonl")}) > 10
    assert not list((root / "bundles").glob("*.pyc-*"))  # from the sealed zipapp, zygotes included
    assert swapper.opens == 1  # read once by the start: no zygote reopened it by its path


def test_a_start_from_the_bundle_marks_it_used_and_a_refused_start_does_not(tmp_path: Path) -> None:
    """The host keeps its most recently used bundles: the runner's checked start is what says a run
    used one (its mtime set to now), so a bundle found on the host outlives older ones; a bundle that
    fails its check is not marked (it is removed and pushed again)."""
    bundle = build_bundle(TRIAGE, tmp_path / "cache")
    root = tmp_path / "ws"
    assert ensure_bundle(LocalHost(), bundle, str(root), python=SYSTEM_PYTHON)
    published = Path(bundle.remote_dir(str(root)))
    os.utime(published, (1_000_000, 1_000_000))
    argv = checked_runner_argv(bundle, str(root), SYSTEM_PYTHON, ["version"])
    done = subprocess.run(argv, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert published.stat().st_mtime > 1_000_000 + 86_400
    published.chmod(0o755)
    (published / "added").write_text("x")  # no longer what was pushed
    os.utime(published, (1_000_000, 1_000_000))
    refused = subprocess.run(argv, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120)
    assert refused.returncode == BUNDLE_REFUSED_EXIT, refused.stderr
    assert published.stat().st_mtime < 1_000_000 + 86_400
