"""Run a function in a fresh gloo process group: the one spawn helper for tests and benchmarks.

Every multi-process test goes through :func:`run_spawned`: gloo on
127.0.0.1 with a free port, a short timeout, one thread per process, the child's traceback re-raised
in the parent, the group destroyed in ``finally``. A child that dies without reporting or a group
that outlives its deadline is an error, never a hang.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import queue as queue_module
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from tether.launch.env import prepare_local_environment
from tether.launch.local import free_port
from tether.launch.teardown import before_init_process_group, shut_down_process_group


class SpawnedError(RuntimeError):
    """A spawned rank raised, died or timed out; the message carries the child's traceback."""


def _plain(value: Any) -> Any:
    """Tensors become numpy arrays: torch would otherwise pass them through shared memory that
    vanishes when the child exits."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().copy()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    return value


def _child(rank, world_size, port, fn, args, results, timeout_s) -> None:
    torch.set_num_threads(1)
    try:
        before_init_process_group()
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        results.put((rank, True, _plain(fn(rank, world_size, *args))))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    finally:
        shut_down_process_group()


def run_spawned(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 60.0
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; return their results.

    ``fn`` must be importable (module level). Collective operations inside time out after
    ``timeout_s`` seconds, and the whole group is killed after twice that.
    """
    prepare_local_environment()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_child, args=(r, world_size, port, fn, args, results, timeout_s))
        for r in range(world_size)
    ]
    for proc in procs:
        proc.start()
    collected: dict[int, Any] = {}
    grace = 5.0  # seconds a finished group gets to exit; a failed one is killed at once
    deadline = time.monotonic() + 2 * timeout_s + 30  # start-up (imports) included
    try:
        while len(collected) < world_size:
            try:
                rank, ok, payload = results.get(timeout=0.2)
            except queue_module.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                dead = [r for r in dead if r not in collected]
                if dead:
                    grace = 0.0
                    raise SpawnedError(
                        f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode}"
                    ) from None
                if time.monotonic() > deadline:
                    grace = 0.0
                    raise SpawnedError(f"spawned group timed out after {timeout_s:.0f} s") from None
                continue
            if not ok:
                grace = 0.0
                raise SpawnedError(f"rank {rank} failed:\n{payload}")
            collected[rank] = payload
    finally:
        for proc in procs:
            proc.join(timeout=grace)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return [collected[r] for r in range(world_size)]
