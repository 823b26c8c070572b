"""Named tensors in shared memory on one node, for the Hogwild methods (Recht et al., NIPS 2011).

A tensor backed by a file in ``/dev/shm`` (a RAM file system on Linux) and mapped with
``torch.from_file(..., shared=True)`` is the same physical memory in every process that maps the
same name: a write by one process is seen by all the others at once, with no copy and no message.
That is what Hogwild needs, and all it needs: the processes then update the tensor in place without
any lock.

The name is the only thing processes must agree on, so it carries a random token chosen by the
creator (see :class:`SharedFiles`); once every process has mapped the files the creator unlinks
the names, and the memory lives on exactly as long as the last mapping.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import torch

from tether.errors import TetherError

SHM_DIR = Path("/dev/shm")


def shm_dir() -> Path:
    """``/dev/shm`` where it exists (Linux); elsewhere the temporary directory, which the page
    cache keeps in memory for files this small and this busy."""
    return SHM_DIR if SHM_DIR.is_dir() else Path(tempfile.gettempdir())


def create_shared(path: Path, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Create the file ``path`` (it must not exist) sized for ``numel`` zeros and map it."""
    # O_EXCL: two runs can never silently share (and corrupt) one buffer, whatever the name.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, numel * dtype.itemsize)
    finally:
        os.close(fd)
    return map_shared(path, numel, dtype)


def map_shared(path: Path, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Map an existing shared file as a flat tensor of ``numel`` elements of ``dtype``."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise TetherError(f"shared memory {path} does not exist: its creator has gone") from None
    if size != numel * dtype.itemsize:
        raise TetherError(
            f"shared memory {path} holds {size} bytes, expected {numel} x {dtype} "
            "(processes built with different models?)"
        )
    # shared=True maps the file MAP_SHARED: writes go to the one copy every process sees.
    return torch.from_file(str(path), shared=True, size=numel, dtype=dtype)


def unlink_shared(path: Path) -> None:
    """Remove the name; processes that mapped the file keep their memory until they unmap it."""
    path.unlink(missing_ok=True)


class SharedFiles:
    """A set of named shared tensors of one run: ``<dir>/tether-<run id>-<token>-<name>``.

    The creator makes them with :meth:`create` and later :meth:`unlink`s them; the other
    processes, given the same ``run_id`` and ``token``, :meth:`attach` to them.
    """

    def __init__(self, run_id: str | None, token: int, directory: Path | None = None) -> None:
        tag = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id or "run")[:64]
        self.prefix = f"tether-{tag}-{token:016x}"
        self.directory = directory if directory is not None else shm_dir()
        self.created: list[Path] = []

    def path(self, name: str) -> Path:
        return self.directory / f"{self.prefix}-{name}"

    def create(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        path = self.path(name)
        tensor = create_shared(path, numel, dtype)
        self.created.append(path)
        return tensor

    def attach(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return map_shared(self.path(name), numel, dtype)

    def unlink(self) -> None:
        """Remove every name this object created (idempotent)."""
        for path in self.created:
            unlink_shared(path)
        self.created.clear()
