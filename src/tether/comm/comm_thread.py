"""One daemon thread that runs submitted jobs in order: the reducer's communication thread, and
the parameter server's reply line to each worker (:mod:`tether.methods.reply_lines`)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future


class CommThread:
    """One daemon thread running submitted jobs in order. A daemon, unlike a
    ``ThreadPoolExecutor`` worker, never holds the process at exit when a peer died and a job
    waits for it: the training thread's error (naming the rank) ends the process."""

    def __init__(self, name: str = "tether-comm") -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], None], Future] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> Future:
        future: Future = Future()
        self._jobs.put((job, future))
        return future

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop after the jobs already submitted; a thread still alive at interpreter exit is
        frozen in whatever it was doing, so a clean run ends it here."""
        self._jobs.put(None)
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, future = item
            try:
                job()
            except BaseException as error:  # handed to the waiting thread, which re-raises it
                future.set_exception(error)
            else:
                future.set_result(None)
