"""A calibration measured once per host and group shape, cached, and the same on every rank.

Every rank must call :func:`load_or_calibrate` together (it is collective). Rank 0 measures or
reads the cache and its result reaches every rank, so every rank holds the same calibration and
``auto`` makes the same choice everywhere (a different choice on two ranks would deadlock their
schedules). Results are cached per backend, world size, node size and host in the directory the
caller names (the launcher's cache directory, for the commands), and apart for ranks whose main
threads were pinned; what the caller knows and this layer does not (where caches live, how the
ranks are placed and pinned) comes in as arguments.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import torch

from tether.comm.calibration.measure import calibrate
from tether.comm.calibration.model import Calibration
from tether.comm.transport import Transport
from tether.observe.files import atomic_write_text


def cache_path(
    cache_dir: Path, backend: str, world_size: int, ranks_per_node: int, pinned: bool = False
) -> Path:
    """Where a calibration is cached under ``cache_dir``: per host, backend, group shape, and
    whether the ranks' main threads were pinned (``tether bench comm --pin``), so that a pinned
    recalibration never drives the choices of unpinned training."""
    host = socket.gethostname()
    shape = f"{host}-{backend}-p{world_size}-g{ranks_per_node}"
    return cache_dir / "calibration" / f"{shape}{'-pinned' if pinned else ''}.json"


def load_or_calibrate(
    transport: Transport,
    cache_dir: Path | None,
    ranks_per_node: int | None = None,
    *,
    pinned: bool = False,
    refresh: bool = False,
    backend: str | None = None,
) -> Calibration:
    """The calibration of this host/backend/group shape cached under ``cache_dir``, measured
    once if there is none (or ``refresh``); with ``cache_dir`` None, measured for this caller
    alone and not kept. ``ranks_per_node`` None (or 0): the whole group is one node. ``pinned``:
    the ranks' main threads are pinned to cores (timed apart). Collective: rank 0 decides and
    its result reaches every rank."""
    world = transport.world_size
    per_node = ranks_per_node or world
    backend = backend if backend is not None else _backend_name()
    path = None if cache_dir is None else cache_path(cache_dir, backend, world, per_node, pinned)
    cached: Calibration | None = None
    why = "asked to measure again" if path is not None else "no cache directory: for this run only"
    if transport.rank == 0 and path is not None and not refresh:
        why = "none cached for this host and group shape"
        if path.exists():
            try:
                cached = Calibration.from_json(path.read_text())
            except (ValueError, TypeError, KeyError, AttributeError, OSError):
                # (valid JSON of another shape fails as an attribute lookup)
                why = "the cached one is unreadable or from an older Tether"
    have = torch.tensor([1 if cached is not None else 0], dtype=torch.int64)
    if world > 1:
        transport.broadcast(have, 0)
    if int(have):
        return _share(transport, cached)
    # Tens of seconds before the first step of a training run: say what it is, once (rank 0).
    if transport.rank == 0:
        _say(
            f"calibrating the collectives ({backend}, {world} rank{'s' * (world > 1)},"
            f" {per_node} per node; {why}): tens of seconds{', once' * (path is not None)}"
        )
    start = time.perf_counter()
    result = calibrate(transport, per_node, backend)
    if transport.rank == 0:
        where = "not cached"
        if path is not None:
            atomic_write_text(path, result.to_json())
            where = f"cached in {path}"
        _say(f"calibration done in {time.perf_counter() - start:.1f} s, {where}")
    return result


def _say(message: str) -> None:
    print(f"tether: {message}", file=sys.stderr, flush=True)


def _share(transport: Transport, calibration: Calibration | None) -> Calibration:
    """Rank 0's calibration on every rank: the JSON text as bytes, its length sent first."""
    if transport.world_size == 1:
        assert calibration is not None
        return calibration
    data = calibration.to_json().encode() if calibration is not None else b""
    length = torch.tensor([len(data)], dtype=torch.int64)
    transport.broadcast(length, 0)
    buf = torch.zeros(int(length), dtype=torch.uint8)
    if transport.rank == 0:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    transport.broadcast(buf, 0)
    return Calibration.from_json(bytes(buf.tolist()).decode())


def _backend_name() -> str:
    import torch.distributed as dist

    return str(dist.get_backend()) if dist.is_initialized() else "mpi"
