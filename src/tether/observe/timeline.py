"""A per-rank timeline of compute and communication, written as a Chrome trace.

``tether train --timeline`` records, on every rank, what each step spent its time on (data
loading, forward and backward, the exposed wait for communication, the optimizer step,
evaluation, checkpoints) and, from the communication code, each collective. Each rank writes
``DIR/timeline/rank{R}.json``; :func:`merge_timeline` joins them into ``DIR/timeline.json`` in the
Trace Event Format that Perfetto (https://ui.perfetto.dev) and ``chrome://tracing`` open.
``docs/timeline.md`` explains how to read it.

Why these choices:

* **A process-wide recorder reached through** :func:`get_timeline`. Communication code deep in
  the stack records spans without a recorder being threaded through every call. Until
  :func:`install_timeline` is called the recorder is a disabled one whose ``span`` returns a shared
  do-nothing context manager, so instrumented code costs a function call when tracing is off.
* **Wall-clock anchored times.** Spans are measured with ``time.perf_counter`` (monotonic, fine
  grained) and converted to microseconds since the Unix epoch using one anchor pair taken at
  install. Ranks on one machine then share a time axis, and rank files from other machines can be
  merged too (aligned as well as their clocks are, typically to a millisecond under NTP).
* **pid = rank, tid = track.** The trace viewers draw one process per pid and one row per tid, so
  each rank gets a group with one row per track (``main``: the training loop; ``comm``: the
  collectives that run beside it).
* **Events are kept as tuples and converted when written**, so recording a span is an append
  under a lock; the number kept is capped so a very long run cannot exhaust memory (the count of
  dropped events is written into the file).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import Any

from tether.observe.files import atomic_write_text

TIMELINE_DIR = "timeline"  # DIR/timeline/rank{R}.json, one per rank
TIMELINE_FILE = "timeline.json"  # the merged trace
CATEGORIES = ("step", "data", "compute", "comm", "comm.op", "eval", "checkpoint")
# Rows in a fixed order whatever recorded first; other tracks follow in order of first use.
_KNOWN_TRACKS = {"main": 1, "comm": 2}
DEFAULT_MAX_EVENTS = 2_000_000  # about 230 MB of JSON: beyond what a viewer opens comfortably

# (name, cat, start_s, end_s, track, args): perf_counter seconds, converted when written.
_Event = tuple[str, str, float, float, str, dict[str, Any]]


def _clock_anchor() -> tuple[float, float]:
    """A (perf_counter s, Unix µs) pair read as close together as possible: the tightest of a few
    tries brackets the wall-clock read to well under a microsecond on an idle machine."""
    best: tuple[float, float, float] | None = None
    for _ in range(5):
        before = time.perf_counter()
        wall_ns = time.time_ns()
        after = time.perf_counter()
        if best is None or after - before < best[0]:
            best = (after - before, (before + after) / 2, wall_ns / 1e3)
    assert best is not None
    return best[1], best[2]


class _NoSpan:
    """The context manager of a disabled recorder: one shared instance, nothing recorded."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_SPAN = _NoSpan()


class _Span:
    """A span being measured; recorded when the ``with`` block ends, also by an exception."""

    __slots__ = ("_args", "_cat", "_name", "_start", "_timeline", "_track")

    def __init__(
        self, timeline: Timeline, name: str, cat: str, track: str, args: dict[str, Any]
    ) -> None:
        self._timeline = timeline
        self._name = name
        self._cat = cat
        self._track = track
        self._args = args
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        end = time.perf_counter()
        args = self._args
        if exc_type is not None:
            # A span cut short by an error is the most interesting one in a partial trace.
            args = {**args, "error": exc_type.__name__}
        self._timeline._add((self._name, self._cat, self._start, end, self._track, args))


class Timeline:
    """Records complete events ("ph": "X") for one rank; safe to use from several threads.

    ``span`` measures a ``with`` block; ``record`` takes an interval measured elsewhere
    (``time.perf_counter`` seconds), for code that already times itself.
    """

    enabled = True

    def __init__(self, rank: int, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        self.rank = rank
        self.max_events = max_events
        self.dropped = 0
        self._events: list[_Event] = []
        self._lock = threading.Lock()
        self._anchor_perf_s, self._anchor_unix_us = _clock_anchor()

    def span(
        self, name: str, cat: str, track: str = "main", **args: Any
    ) -> AbstractContextManager[None]:
        """Context manager recording the block as one event on ``track``; ``args`` (JSON values)
        are shown when the event is selected in the viewer."""
        return _Span(self, name, cat, track, args)

    def record(
        self, name: str, cat: str, start_s: float, end_s: float, track: str = "main", **args: Any
    ) -> None:
        """Record an interval from ``start_s`` to ``end_s`` (``time.perf_counter`` seconds)."""
        self._add((name, cat, start_s, max(end_s, start_s), track, args))

    def _add(self, event: _Event) -> None:
        with self._lock:
            if len(self._events) < self.max_events:
                self._events.append(event)
            else:
                self.dropped += 1

    def to_unix_us(self, perf_s: float) -> float:
        """A ``time.perf_counter`` reading as microseconds since the Unix epoch."""
        return self._anchor_unix_us + (perf_s - self._anchor_perf_s) * 1e6

    def trace(self) -> dict[str, Any]:
        """This rank's events as a Trace Event Format object (metadata events first)."""
        with self._lock:
            events = list(self._events)
            dropped = self.dropped
        tids = dict(_KNOWN_TRACKS)
        body = []
        for name, cat, start, end, track, args in events:
            tid = tids.setdefault(track, len(tids) + 1)
            # Both ends go through one conversion and dur is their exact difference, so a span
            # that ends when the next begins shows it (floats near 2e15 µs are 0.25 µs apart):
            # viewers drop spans that seem to overlap their neighbours instead of nesting.
            ts = round(self.to_unix_us(start), 3)
            event: dict[str, Any] = {
                "name": name,
                "cat": cat,
                "ph": "X",
                "ts": ts,
                "dur": round(self.to_unix_us(end), 3) - ts,
                "pid": self.rank,
                "tid": tid,
            }
            if args:
                event["args"] = args
            body.append(event)
        used = {event["tid"] for event in body}
        meta: list[dict[str, Any]] = [
            _meta("process_name", self.rank, 0, name=f"rank {self.rank}"),
            _meta("process_sort_index", self.rank, 0, sort_index=self.rank),
        ]
        for track, tid in tids.items():
            if tid in used:
                meta.append(_meta("thread_name", self.rank, tid, name=track))
                meta.append(_meta("thread_sort_index", self.rank, tid, sort_index=tid))
        return {
            "traceEvents": meta + body,
            "displayTimeUnit": "ms",
            "otherData": {"ranks": [self.rank], "dropped_events": dropped},
        }


class _DisabledTimeline(Timeline):
    """The default recorder: records nothing, allocates nothing per span."""

    enabled = False

    def __init__(self) -> None:
        super().__init__(rank=-1, max_events=0)

    def span(
        self, name: str, cat: str, track: str = "main", **args: Any
    ) -> AbstractContextManager[None]:
        return _NO_SPAN

    def record(
        self, name: str, cat: str, start_s: float, end_s: float, track: str = "main", **args: Any
    ) -> None:
        return None


_DISABLED = _DisabledTimeline()
_active: Timeline = _DISABLED


def get_timeline() -> Timeline:
    """The process's recorder: the one :func:`install_timeline` activated, else a disabled one."""
    return _active


def install_timeline(rank: int, max_events: int = DEFAULT_MAX_EVENTS) -> Timeline:
    """Start recording for ``rank`` in this process (replacing any earlier recorder)."""
    global _active
    _active = Timeline(rank, max_events)
    return _active


def uninstall_timeline() -> None:
    """Back to the disabled recorder (after the rank file is written, and between tests)."""
    global _active
    _active = _DISABLED


def rank_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / TIMELINE_DIR / f"rank{rank}.json"


def write_rank_file(run_dir: Path, rank: int, timeline: Timeline | None = None) -> Path:
    """Write ``timeline`` (default: the active recorder) to ``DIR/timeline/rank{R}.json``.

    Atomic, so a merge that runs while a rank is still writing never reads half a file.
    """
    timeline = timeline if timeline is not None else get_timeline()
    path = rank_file(run_dir, rank)
    atomic_write_text(path, json.dumps(timeline.trace(), separators=(",", ":")))
    return path


def merge_timeline(run_dir: Path) -> Path:
    """Merge every ``DIR/timeline/rank*.json`` into ``DIR/timeline.json`` and return its path.

    Works on rank files from any machine: their times are wall-clock anchored. Events are sorted
    by time, longest first at equal start, so enclosing spans precede the spans they contain
    (what the legacy Chrome viewer needs to nest them). Raises FileNotFoundError when there is no
    rank file.
    """
    run_dir = Path(run_dir)
    paths = sorted((run_dir / TIMELINE_DIR).glob("rank*.json"))
    if not paths:
        raise FileNotFoundError(f"no rank files in {run_dir / TIMELINE_DIR}")
    meta: list[dict[str, Any]] = []
    body: list[dict[str, Any]] = []
    ranks: list[int] = []
    dropped = 0
    for path in paths:
        trace = json.loads(path.read_text())
        for event in trace["traceEvents"]:
            (meta if event.get("ph") == "M" else body).append(event)
        other = trace.get("otherData", {})
        ranks.extend(other.get("ranks", []))
        dropped += int(other.get("dropped_events", 0))
    meta.sort(key=lambda e: (e["pid"], e["tid"], e["name"]))
    body.sort(key=lambda e: (e["ts"], -e.get("dur", 0.0), e["pid"], e["tid"]))
    merged = {
        "traceEvents": meta + body,
        "displayTimeUnit": "ms",
        "otherData": {"ranks": sorted(ranks), "dropped_events": dropped},
    }
    out = run_dir / TIMELINE_FILE
    atomic_write_text(out, json.dumps(merged, separators=(",", ":")))
    return out


def merge_if_stale(run_dir: Path) -> Path | None:
    """Merge unless ``timeline.json`` is already newer than every rank file (rank 0 merged after a
    clean run); None when there is nothing to merge. For the launcher, after success or failure."""
    run_dir = Path(run_dir)
    paths = list((run_dir / TIMELINE_DIR).glob("rank*.json"))
    if not paths:
        return None
    out = run_dir / TIMELINE_FILE
    if out.exists() and out.stat().st_mtime_ns >= max(p.stat().st_mtime_ns for p in paths):
        return out
    return merge_timeline(run_dir)


def merge_after_run(run_dir: Path) -> Path | None:
    """:func:`merge_if_stale` for launchers, after success or failure (a partial trace shows
    where a failed run stood). A trace that cannot be merged is reported on stderr and never
    allowed to hide the run's own outcome."""
    try:
        return merge_if_stale(run_dir)
    except (OSError, ValueError, KeyError) as exc:
        print(f"tether: warning: could not merge the timeline: {exc}", file=sys.stderr)
        return None


def clear_rank_file(run_dir: Path, rank: int) -> None:
    """Remove this rank's file (and, on rank 0, the merged trace) left by an earlier attempt in
    the same run directory, so a resumed run that fails early cannot merge a stale trace. Each
    rank removes only its own file: no rank can race another's fresh write."""
    rank_file(run_dir, rank).unlink(missing_ok=True)
    if rank == 0:
        (Path(run_dir) / TIMELINE_FILE).unlink(missing_ok=True)


def _meta(kind: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}


def main(argv: list[str] | None = None) -> int:
    """``python -m tether.observe.timeline DIR``: merge the rank files of a run by hand (runs
    under torchrun on several machines: copy every machine's ``DIR/timeline/`` together first)."""
    parser = argparse.ArgumentParser(
        prog="python -m tether.observe.timeline",
        description="Merge DIR/timeline/rank*.json into DIR/timeline.json (a Chrome trace).",
    )
    parser.add_argument("run_dir", type=Path, metavar="DIR", help="the run directory")
    args = parser.parse_args(argv)
    try:
        out = merge_timeline(args.run_dir)
    except (OSError, ValueError, KeyError) as exc:
        print(f"tether: error: cannot merge the timeline: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
