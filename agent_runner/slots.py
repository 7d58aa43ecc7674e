"""A run's attempts in slots: up to ``--slots`` at once, their results recorded in the attempts' order.
Standard library only, Python 3.9.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from .sandbox import kill_every_started

if TYPE_CHECKING:
    from concurrent.futures import Future

    from .runner import AttemptResult, Runner
    from .suite import Task


def run_in_slots(runner: Runner, attempts: List[Tuple[Task, int]], slots: int,
                 record: Callable[[AttemptResult], None]) -> None:
    """Run ``attempts`` up to ``slots`` at once; ``record`` sees the results in the order of ``attempts``
    (so results.jsonl is the file one slot writes). Each attempt already has its own workspace, HOME,
    TMPDIR and budget. On SIGTERM (``_Terminated`` in this, the main thread) no attempt starts any more
    and the running ones are stopped: every process group this runner started is killed until the
    workers are done, and each worker removes its own workspace on the way out."""
    cancel = threading.Event()

    def one(index: int) -> Optional[AttemptResult]:
        if cancel.is_set():
            return None
        task, attempt = attempts[index]
        return runner.run_attempt(task, attempt)

    pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="slot")
    futures: Dict["Future[Optional[AttemptResult]]", int] = {}
    try:
        futures = {pool.submit(one, i): i for i in range(len(attempts))}
        ready: Dict[int, AttemptResult] = {}
        next_index = 0
        for future in as_completed(futures):
            result = future.result()
            if result is not None:
                ready[futures[future]] = result
            while next_index in ready:
                record(ready.pop(next_index))
                next_index += 1
    except BaseException:
        cancel.set()
        for future in futures:
            future.cancel()
        while not all(f.done() for f in futures):
            kill_every_started()  # each by its own handle, never a pid read from /proc
            time.sleep(0.05)
        raise
    finally:
        pool.shutdown(wait=True)
