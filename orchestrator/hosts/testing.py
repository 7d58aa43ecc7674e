"""FakeHost: a Host whose commands are answered by a function, for unit tests.

``handler(argv) -> ExecResult | (exit_code, stdout, stderr)``; files "on the host" live in a dict,
so put/get round-trip without touching disk paths outside the test's tmp_path.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from orchestrator.errors import HostError, TransferError
from orchestrator.hosts.transport.base import ExecResult, Host

Handler = Callable[[list[str]], "ExecResult | tuple[int, str, str]"]


class FakeHost(Host):
    kind = "fake"
    reaches_controller_loopback = True  # it stands for a host the controller reaches directly

    def __init__(self, name: str, handler: Handler | None = None, *, fail: HostError | None = None) -> None:
        self.name = name
        self.handler = handler
        self.fail = fail  # raised by every operation: a host that is down
        self.files: dict[str, bytes] = {}
        self.calls: list[list[str]] = []
        self.closed = False

    def _check(self) -> None:
        if self.fail is not None:
            raise self.fail

    def exec(self, argv: list[str], timeout: float) -> ExecResult:
        self._check()
        self.calls.append(list(argv))
        if self.handler is None:
            return ExecResult(tuple(argv), 0, "", "")
        answer = self.handler(list(argv))
        if isinstance(answer, ExecResult):
            return answer
        code, out, err = answer
        return ExecResult(tuple(argv), code, out, err)

    def put(self, local: Path, remote: str) -> None:
        self._check()
        self.files[remote] = Path(local).read_bytes()

    def get(
        self, remote: str, local: Path, *, max_bytes: int | None = None, cancel: threading.Event | None = None
    ) -> None:
        self._check()
        if remote not in self.files:
            raise TransferError(self.name, f"{remote}: no such file")
        Path(local).write_bytes(self.files[remote])

    def close(self) -> None:
        self.closed = True
