"""A parameter-server worker that outlives its run, with no supervisor to end it.

The asynchronous methods carry on without a hung worker: the server gives it up after
``--timeout`` of silence and finishes with the others. Under ``tether launch`` (and
``tether.fit``) the worker's supervisor then kills it. Under ``torchrun`` or ``mpiexec`` nobody
does, and the launcher waits for its process for ever: the run has ended, but the job has not.

So a worker with no supervisor watches its liveness connection to the server (the server never
writes on it; see :mod:`tether.methods.ps_server`): the server closes it once its serving is
over. If the worker's own loop has not said goodbye ``GRACE_S`` after that (a healthy worker
reads its stop and leaves within it), its loop is hung and the process exits on its own, saying
so. It exits with status 0: the run it belonged to carried on without it, as the method
promises, and a failing status would make ``torchrun`` stop the server while it still writes
the run's results. A worker stopped by a signal (SIGSTOP) runs no thread and is not covered.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

from tether.observe.joined import JOINED_MARK_ENV

GRACE_S = 5.0  # as the supervisor gives a worker that outlives the server (tether.launch)
POLL_S = 0.5


def supervised() -> bool:
    """Whether a supervisor of ours runs this process: it names a joined mark for every process
    of a method that tolerates a lost worker (:mod:`tether.observe.joined`)."""
    return bool(os.environ.get(JOINED_MARK_ENV))


class ServerEndWatch:
    """A daemon thread that ends this worker's process once the server has closed its
    connections and the worker's loop has not finished ``grace_s`` later; :meth:`stop` (the
    worker's goodbye) ends the watch."""

    def __init__(
        self,
        server_closed: Callable[[], bool],
        rank: int,
        grace_s: float = GRACE_S,
        leave: Callable[[int], None] = os._exit,
    ) -> None:
        self._server_closed = server_closed
        self._rank = rank
        self._grace_s = grace_s
        self._leave = leave
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="server-end-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """The worker is leaving on its own: end the watch (before its connections close)."""
        self._stopped.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stopped.wait(POLL_S):
            if self._server_closed():
                break
        else:
            return
        if self._stopped.wait(self._grace_s) or not threading.main_thread().is_alive():
            return  # said goodbye; or the process is already exiting (with its own status)
        sys.stderr.write(
            f"tether: worker rank {self._rank}: the parameter server has closed its connections "
            f"(its serving is over; it had given this worker up as silent) and this worker's "
            f"loop is still not done {self._grace_s:g} s later: it is hung, and the process "
            "exits so that its launcher does not wait for it\n"
        )
        sys.stderr.flush()
        self._leave(0)
