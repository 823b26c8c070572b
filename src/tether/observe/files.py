"""Atomic file writes: a reader (or a resumed run) never sees a half-written file.

Write to a temporary file in the same directory, flush it to disk, then ``os.replace`` it over the
target: rename within one file system is atomic on POSIX. The file gets the mode any new file of
the user's would (0666 less the umask), not ``mkstemp``'s private 0600: teammates sharing a
cluster directory read each other's runs.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, cast


def umask() -> int:
    """The process's file-creation mask, read without changing it where Linux allows (setting
    it to read it back is not thread-safe)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


SYNC_EVERY_BYTES = 64 << 20  # a reporting save's bytes go to the disk this often


class ReportingWriter:
    """A binary file that calls ``progress`` after each write that goes through: a long save
    says it is at work (a parameter server's workers, waiting for its reply, hear that it is
    busy) for as long as its bytes keep reaching the file, and falls silent when they stop (a
    hung disk is not taken for progress). ``progress`` limits its own rate.

    Every ``sync_every`` bytes it also syncs them to the disk (``fsync``) and reports, a larger
    write going in pieces of that size: a write lands in the page cache at once, and the save's final sync would otherwise take the whole
    file to the disk in one silent call (minutes on a slow network file system, long enough to
    lose the waiting workers). So its progress is the disk's, and the last sync is short."""

    def __init__(
        self, handle: IO[bytes], progress: Callable[[], None], sync_every: int | None = None
    ) -> None:
        self.handle = handle
        self.progress = progress
        self.sync_every = sync_every or SYNC_EVERY_BYTES
        self._unsynced = 0

    def write(self, data: Any) -> int:
        # in pieces: torch.save writes a model whose parameters share one flat storage (a
        # parameter server's) in a single call, which would otherwise be one silent sync
        view = memoryview(data).cast("B")
        for start in range(0, max(len(view), 1), self.sync_every):
            piece = view[start : start + self.sync_every]
            self._unsynced += self.handle.write(piece)
            if self._unsynced >= self.sync_every:
                self.handle.flush()
                os.fsync(self.handle.fileno())
                self._unsynced = 0
            self.progress()
        return len(view)

    def flush(self) -> None:
        self.handle.flush()

    def __getattr__(self, name: str) -> Any:  # tell, seek, fileno...: the file's own
        return getattr(self.handle, name)


def atomic_write(
    path: Path,
    write: Callable[[IO[bytes]], object],
    progress: Callable[[], None] | None = None,
) -> None:
    """``write(handle)`` to ``path``, atomically; ``progress``: called as its writes go through
    (:class:`ReportingWriter`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "wb") as handle:
            write(
                handle if progress is None else cast(IO[bytes], ReportingWriter(handle, progress))
            )
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda handle: handle.write(text.encode()))


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n")


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite float as None (JSON's null): JSON has no NaN, and
    strict readers (JavaScript's JSON.parse, jq) refuse the bare ``NaN`` Python writes for a
    diverged run's loss."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value
