"""A worker's process group from before it exists to after it is gone, so that the process exits
cleanly.

The failure this prevents: a gloo backend that is still alive when the interpreter finalises
keeps its worker threads (``pt_gloo_runloop``) running there, and those threads release each
finished collective's tensors a moment after ``wait()`` has returned on the main thread.
Releasing a tensor that has a Python object takes the GIL; a thread that asks for the GIL while
the interpreter finalises is terminated, which C++ turns into ``std::terminate``: the worker dies
with SIGABRT ("terminate called without an active exception") after a successful run. Seen about
once in fifteen multi-node test runs on 2 cores, where one descheduled gloo thread is enough to
land the release in the finalisation (core dump: ``~AsyncAllreduceWork`` on a gloo thread, the
main thread in ``Py_FinalizeEx``).

``dist.destroy_process_group()`` drops torch's registry references to the group, not these:

* ``torch.distributed.nn.functional`` binds ``group.WORLD`` as a default argument of its
  functions when it is first imported. torch.optim's first step imports it (through
  torch._dynamo), after the group exists, so the defaults hold the group for good. Imported
  before the group exists (:func:`before_init_process_group`), they bind ``None``.
* A :class:`~tether.comm.transport.TorchTransport` keeps the group's gloo backend for its
  point-to-point calls, and the objects holding transports (trainer, method, reducer) can sit in
  reference cycles that only the garbage collector frees: :func:`shut_down_process_group`
  collects them, so the backend is destroyed while Python is fully alive (torch destroys it with
  the GIL released; its threads finish what they hold and are joined).
"""

from __future__ import annotations

import gc

import torch.distributed as dist


def before_init_process_group() -> None:
    """Import, before the default group exists, the modules that would otherwise capture it."""
    import torch.distributed.nn.functional  # noqa: F401  (4 ms)


def shut_down_process_group() -> None:
    """Destroy the default process group (if any) and free every backend before exit.

    Call it after a clean run, where nothing of the caller's still references a transport or
    process group (the trainer is gone), or the backend survives the collection. Not after an
    error in a launched worker: its connections would close before the launcher has its error,
    and a peer failing on the closed connection could be reported as the cause."""
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()
