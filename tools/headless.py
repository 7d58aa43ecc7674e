"""A real headless Chromium, driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``).

Used by the browser tests, ``make bench`` and the README screenshots. Standard library only: the
protocol's messages are JSON, each ended by a NUL byte, on the child's fds 3 (to Chromium) and 4
(from it), so no port is opened and no websocket client is needed.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
_FLAGS = (
    "--headless",
    "--no-sandbox",  # root in a container: the setuid sandbox is unavailable
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)


class BrowserError(RuntimeError):
    pass


def find_chromium() -> str | None:
    """The Chromium on PATH, if any (Debian's package installs ``/usr/bin/chromium``)."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _child_fds(to_child: int, from_child: int) -> Callable[[], None]:
    """A preexec function putting the pipe ends on fds 3 and 4, where Chromium expects them."""

    def setup() -> None:
        # move both out of the way first: one of them may already be 3 or 4
        high_in = fcntl.fcntl(to_child, fcntl.F_DUPFD, 10)
        high_out = fcntl.fcntl(from_child, fcntl.F_DUPFD, 10)
        os.dup2(high_in, 3)
        os.dup2(high_out, 4)
        os.close(high_in)
        os.close(high_out)

    return setup


class Browser:
    """One Chromium process with a throwaway profile; ``page()`` opens a tab."""

    def __init__(
        self, executable: str | None = None, *, timeout: float = 30.0, width: int = 1280, height: int = 900
    ):
        exe = executable or find_chromium()
        if exe is None:
            raise BrowserError("no chromium on PATH (apt-get install chromium; `make setup` does it)")
        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="crosshost-chromium-")
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [
                    exe,
                    *_FLAGS,
                    f"--user-data-dir={self._profile}",
                    f"--window-size={width},{height}",
                    "about:blank",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._stderr,
                pass_fds=(3, 4),
                preexec_fn=_child_fds(to_r, from_w),  # noqa: PLW1509 (single-threaded caller)
            )
        finally:
            os.close(to_r)
            os.close(from_w)
        self._out = to_w
        self._in = from_r
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    # --- the protocol ---------------------------------------------------------------------------

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"chromium did not answer within {self.timeout:.0f} s{self._said()}")
            ready, _, _ = select.select([self._in], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise BrowserError(f"chromium closed the DevTools pipe{self._said()}")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        message: dict[str, Any] = json.loads(raw)
        return message

    def _said(self) -> str:
        self._stderr.seek(0)
        tail = self._stderr.read()[-600:].decode("utf-8", "replace").strip()
        return f" (its stderr: {tail})" if tail else ""

    def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        """Send one command and wait for its answer; events that arrive meanwhile go to ``events``."""
        self._next_id += 1
        ident = self._next_id
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == ident:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            if "method" in reply:
                self.events.append(reply)

    def pump(self, seconds: float) -> None:
        """Collect the events that arrive within ``seconds`` (console messages after a load)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self._in], [], [], max(0.0, deadline - time.monotonic()))
            if ready:
                chunk = os.read(self._in, 1 << 20)
                if not chunk:
                    return
                self._buffer += chunk
            while b"\0" in self._buffer:
                raw, _, self._buffer = self._buffer.partition(b"\0")
                self.events.append(json.loads(raw))

    def page(self) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        return Page(self, session)

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                with contextlib.suppress(BrowserError, OSError):
                    self.send("Browser.close")
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
        finally:
            for fd in (self._out, self._in):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._stderr.close()
            shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Page:
    """One tab: navigate, evaluate JavaScript, wait for a condition, read console errors, screenshot."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.send(method, params, self.session)

    def goto(self, url: str) -> None:
        self.send("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete'")

    def evaluate(self, expression: str) -> Any:
        reply = self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in reply:
            details = reply["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise BrowserError(f"{expression[:80]!r} threw: {text}")
        return reply.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float | None = None) -> Any:
        deadline = time.monotonic() + (timeout or self.browser.timeout)
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out waiting for {expression!r}")
            time.sleep(0.05)

    def _mine(self) -> list[dict[str, Any]]:
        return [e for e in self.browser.events if e.get("sessionId") == self.session]

    def console_errors(self) -> list[str]:
        """Uncaught exceptions, console.error calls and error log entries (failed loads among them)."""
        self.browser.pump(0.2)
        out: list[str] = []
        for event in self._mine():
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                out.append(
                    details.get("exception", {}).get("description") or details.get("text", "exception")
                )
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(
                    " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                )
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.append(params["entry"].get("text", "log error"))
        return out

    def requests(self) -> list[str]:
        """Every URL the page asked for since it was opened."""
        self.browser.pump(0.1)
        return [
            e["params"]["request"]["url"]
            for e in self._mine()
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def screenshot(
        self, path: Path, *, width: int = 1280, max_height: int = 4000, selector: str | None = None
    ) -> None:
        """A PNG of the whole page (up to ``max_height``), or of the element ``selector`` only."""
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
        )
        if selector is None:
            height = min(max_height, int(self.evaluate("document.documentElement.scrollHeight")))
            clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
        else:
            box = self.evaluate(
                f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                " return [r.left + scrollX, r.top + scrollY, r.width, r.height]; })()"
            )
            clip = {"x": box[0], "y": box[1], "width": box[2], "height": min(max_height, box[3]), "scale": 1}
        shot = self.send(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
        )
        path.write_bytes(base64.b64decode(shot["data"]))


def main(argv: list[str] | None = None) -> int:
    """``python tools/headless.py URL OUT.png [--selector CSS] [--max-height N]``: a screenshot of a page
    once it is loaded (for report.html: once its script has run)."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("url")
    p.add_argument("out", type=Path)
    p.add_argument("--selector")
    p.add_argument("--max-height", type=int, default=4000)
    p.add_argument("--width", type=int, default=1280)
    args = p.parse_args(argv)
    with Browser() as browser:
        page = browser.page()
        page.goto(args.url)
        page.wait_for("!document.getElementById('crosshost-data') || document.body.dataset.ready === '1'")
        errors = page.console_errors()
        page.screenshot(args.out, width=args.width, max_height=args.max_height, selector=args.selector)
    for error in errors:
        print(f"console error: {error}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
