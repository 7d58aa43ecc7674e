"""LocalHost: the controller's own machine, through subprocesses."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from orchestrator.errors import TransferError
from orchestrator.hosts.transport.base import ExecResult, Host, copy_capped, refuse_irregular

#: what a local runner's first process inherits of the controller's environment: what a login would
#: set (an SSH host's runner starts from sshd's). Keys, tokens and CROSSHOST_* never reach it.
HOST_ENV_KEYS = ("HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")

#: the PATH a login gives (Debian's login.defs and sshd: ENV_SUPATH for root, ENV_PATH otherwise), never
#: the controller shell's: an activated venv or pyenv shims would decide which python3 or jq a local
#: host's attempts run, and the reference would depend on how crosshost was started
LOGIN_PATH_ROOT = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LOGIN_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"


def login_path() -> str:
    return LOGIN_PATH_ROOT if os.geteuid() == 0 else LOGIN_PATH


def host_env() -> dict[str, str]:
    return {**{k: os.environ[k] for k in HOST_ENV_KEYS if k in os.environ}, "PATH": login_path()}


class LocalHost(Host):
    kind = "local"
    reaches_controller_loopback = True  # it is the controller

    def __init__(self, name: str = "local") -> None:
        self.name = name

    def exec(self, argv: list[str], timeout: float) -> ExecResult:
        started = time.monotonic()
        try:
            # The process group is killed on timeout so a runner's children die with it.
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                env=host_env(),
            )
        except OSError as exc:
            return ExecResult(tuple(argv), 127, "", f"{argv[0]}: {exc.strerror}", time.monotonic() - started)
        timed_out = False
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            out, err = proc.communicate()
        return ExecResult(
            tuple(argv),
            proc.returncode if not timed_out else 137,
            out.decode("utf-8", "replace"),
            err.decode("utf-8", "replace"),
            time.monotonic() - started,
            timed_out,
        )

    def put(self, local: Path, remote: str) -> None:
        try:
            shutil.copyfile(local, remote)
        except OSError as exc:
            raise TransferError(self.name, f"copy {local} -> {remote}: {exc.strerror or exc}") from exc

    def get(
        self, remote: str, local: Path, *, max_bytes: int | None = None, cancel: threading.Event | None = None
    ) -> None:
        try:
            refuse_irregular(self.name, remote, os.lstat(remote).st_mode)
            fd = os.open(remote, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as src:
                refuse_irregular(self.name, remote, os.fstat(src.fileno()).st_mode)  # swapped since lstat
                copy_capped(self.name, remote, src.read, Path(local), max_bytes=max_bytes, cancel=cancel)
        except OSError as exc:
            raise TransferError(self.name, f"copy {remote} -> {local}: {exc.strerror or exc}") from exc

    def close(self) -> None:
        pass


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
