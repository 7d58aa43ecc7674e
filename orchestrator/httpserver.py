"""The controller's HTTP servers on loopback (the model proxy, ``crosshost view --serve``), hardened
against what reaches them: an attempt, a host's forward, a web page in the user's browser.

- a bounded number of handler threads: a connection past ``max_threads`` is closed at once;
- a listen backlog of ``request_queue_size``: hundreds of connections opened in the same instant wait
  there for the accept loop (the standard library's 5 resets them);
- a read timeout per connection: a client that sends its request slowly (or never) holds a thread
  for ``READ_TIMEOUT_S`` at most;
- a handler's failure is counted, never a traceback on the user's terminal;
- optionally, only requests whose ``Host`` header names the server's own address (a page of another
  origin that rebinds its name to 127.0.0.1 is refused).
"""

from __future__ import annotations

import queue
import threading
from http.server import ThreadingHTTPServer
from typing import Any

#: how long a connection may take to send each part of its request: a handler class's ``timeout``
READ_TIMEOUT_S = 30.0
#: handler threads at once (``crosshost view --serve``: one browser)
MAX_THREADS = 64
#: the model proxy's: one proxy serves one host, and every attempt of its slots may hold a stream open
#: for minutes; 512 is twice the streams ``make bench`` shows relayed whole at once, and past it a
#: flood from an attempt costs the controller ~60 KiB of memory a connection at most
PROXY_MAX_THREADS = 512
#: how long a handler thread waits for the next connection before it ends (starting a thread per
#: connection cost the proxy ~0.1-0.3 ms a request under load)
IDLE_S = 2.0


class BoundedServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` with a bound on its threads and no traceback on the terminal."""

    daemon_threads = True
    request_queue_size = 1024  # the kernel caps it at net.core.somaxconn

    def __init__(self, address: tuple[str, int], handler: Any, *, max_threads: int | None = None) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(MAX_THREADS if max_threads is None else max_threads)
        self._jobs: queue.SimpleQueue[tuple[Any, Any] | None] = queue.SimpleQueue()
        self._idle = 0  # threads waiting for a connection, less those handed one already
        self._idle_lock = threading.Lock()
        self.turned_away = 0  # connections closed because every thread was busy
        self.failures = 0  # handlers that raised

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.turned_away += 1
            self.shutdown_request(request)
            return
        with self._idle_lock:
            if self._idle:  # a thread that served a connection waits for the next: no thread started
                self._idle -= 1
                self._jobs.put((request, client_address))
                return
        try:
            threading.Thread(target=self._work, args=((request, client_address),), daemon=True).start()
        except BaseException:
            self._slots.release()
            raise

    def _work(self, job: tuple[Any, Any] | None) -> None:
        """Serve ``job``, then the next connection handed over within ``IDLE_S``, until none comes."""
        while job is not None:
            self.process_request_thread(*job)
            with self._idle_lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=IDLE_S)
            except queue.Empty:
                with self._idle_lock:
                    try:  # handed over while the wait ran out: the giver counted it against this thread
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        self._idle -= 1
                        return

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def server_close(self) -> None:
        super().server_close()
        with self._idle_lock:  # the waiting threads end now, not IDLE_S later
            for _ in range(self._idle):
                self._jobs.put(None)
            self._idle = 0

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.failures += 1  # what went wrong is the handler's to record; the terminal is the user's

    def host_allowed(self, value: str | None) -> bool:
        """Whether a request's ``Host`` header names this server (its address or ``localhost``)."""
        host, port = str(self.server_address[0]), int(self.server_address[1])
        return value in {f"{host}:{port}", f"localhost:{port}"}
