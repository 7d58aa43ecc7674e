"""``crosshost view``: where a run's report.html is, or the run directory served on 127.0.0.1."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import posixpath
import urllib.parse
from collections.abc import Callable, Iterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

from orchestrator.errors import InputError
from orchestrator.exit_policy import OK
from orchestrator.httpserver import READ_TIMEOUT_S, BoundedServer

REPORT = "report.html"


def ensure_report(run_dir: Path) -> Path:
    """The run's ``report.html``; a run written before the page existed gets it now (nothing else rewritten)."""
    from orchestrator.analysis import analyse_run
    from orchestrator.report.html import render_html
    from orchestrator.store.rundir import RunDir, write_bytes_atomic

    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such directory; give a run directory (runs/<run_id>/)")
    path = run_dir / REPORT
    if not path.is_file():
        RunDir(run_dir).read_manifest()  # not a run directory at all: its one-line InputError
        write_bytes_atomic(path, render_html(analyse_run(run_dir), run_dir).encode())
    return path


class _RunDirHandler(http.server.SimpleHTTPRequestHandler):
    """Files of one directory only: ``..`` is dropped by the base class, and a symlink that leads
    out of the directory is a 404 like a missing file. A request whose ``Host`` is not the server's
    own address is refused (a page elsewhere that rebinds its name to 127.0.0.1 reads nothing)."""

    timeout = READ_TIMEOUT_S

    def __init__(self, *args: object, directory: str, **kwargs: object) -> None:
        self._root = os.path.realpath(directory)
        super().__init__(*args, directory=directory, **kwargs)  # type: ignore[arg-type]

    def send_head(self) -> Any:
        server = self.server
        if isinstance(server, BoundedServer) and not server.host_allowed(self.headers.get("Host")):
            self.send_error(HTTPStatus.MISDIRECTED_REQUEST, "Host not served here")
            return None
        real = os.path.realpath(self.translate_path(self.path))
        if real != self._root and not real.startswith(self._root + os.sep):
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        return super().send_head()

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass  # the terminal shows the address and nothing else


@contextlib.contextmanager
def serving(run_dir: Path, host: str = "127.0.0.1") -> Iterator[tuple[BoundedServer, str]]:
    """A server for ``run_dir`` on a free port of ``host``, and the report's URL; closed on exit."""
    handler = functools.partial(_RunDirHandler, directory=str(run_dir))
    server = BoundedServer((host, 0), handler)
    port = server.server_address[1]
    try:
        yield server, f"http://{host}:{port}/{urllib.parse.quote(posixpath.basename(REPORT))}"
    finally:
        server.server_close()


def serve(run_dir: Path, announce: Callable[[str], None]) -> int:
    """Serve ``run_dir`` on 127.0.0.1 until Ctrl-C (the way to stop it, so exit 0)."""
    ensure_report(run_dir)
    with serving(run_dir) as (server, url):
        announce(url)
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
    return OK
