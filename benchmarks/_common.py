"""What every benchmark script shares: the machine's description, the `tether` command, the
foreign-load monitor, and writing a result file that keeps its hand-written notes."""

from __future__ import annotations

import datetime
import io
import math
import os
import platform
import re
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from tether.observe.files import atomic_write

RESULTS = Path(__file__).parent / "results"
NOTES_MARKER = "<!-- hand-written notes below this line are kept when the benchmark re-runs -->"


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "host": platform.node(),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        info["gpu"] = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return info


def machine_slug(info: dict[str, str]) -> str:
    """The result files' machine suffix: the GPU where there is one (GPU results are named by
    it), else the CPU model and core count."""
    named = info.get("gpu", f"{info['cpu']} {info['cores']}cores")
    return re.sub(r"[^a-z0-9]+", "-", named.lower()).strip("-")


def tether_command() -> list[str]:
    """The installed `tether` script next to this Python, else `python -m tether`."""
    script = Path(sys.executable).with_name("tether")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tether"]


def write_part_result(
    title: str, stem: str, lines: list[str], figure: Any, info: dict[str, str], started: float
) -> None:
    """A benchmark part's result: ``results/STEM_MACHINE.md`` (title, machine, date, command,
    duration, then ``lines``) and its figure as ``results/STEM_MACHINE.png``; prints the lines."""
    slug = machine_slug(info)
    png = RESULTS / f"{stem}_{slug}.png"
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    atomic_write(png, lambda handle: handle.write(buffer.getvalue()))
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    header = [
        f"# {title}",
        "",
        f"- machine: {info['cpu']}, {info['cores']} cores, "
        + (f"{info['gpu']}, " if "gpu" in info else "")
        + f"torch {info['torch']}",
        *([f"- runs: {info['runs']}"] if "runs" in info else []),  # a table over several machines
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- command: `{command}`",
        f"- took {(time.perf_counter() - started) / 60:.0f} min; figure: `{png.name}`",
        "",
        *lines,
        "",
    ]
    out = RESULTS / f"{stem}_{slug}.md"
    write_result(out, header)
    print("\n".join(lines))
    print(f"wrote {out} and {png}")


def write_result(path: Path, lines: list[str]) -> None:
    """Write a result file; anything below :data:`NOTES_MARKER` in the old file is kept."""
    kept = ""
    if path.exists():
        old = path.read_text()
        if NOTES_MARKER in old:
            kept = old.split(NOTES_MARKER, 1)[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n" + NOTES_MARKER + (kept if kept else "\n"))


def process_tree(root: int, procs: dict[int, tuple[int, int, str, int]]) -> set[int]:
    """``root`` and its descendants, from a :meth:`ForeignLoad.snapshot` of ``/proc``."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_) in procs.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo.extend(children.get(pid, []))
    return tree


class ForeignLoad:
    """CPU used by processes outside this benchmark's process tree, sampled from ``/proc``.

    Other work on a shared machine (a test suite, another benchmark) slows the methods that run
    while it does; this records how many cores it kept busy, over time, so that a result file can
    say which of its numbers were measured on a busy machine. Linux only; elsewhere it reports
    nothing.
    """

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []  # (time, foreign cores since last sample)
        self.names: dict[str, float] = {}  # command name -> foreign CPU seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    @staticmethod
    def snapshot() -> dict[int, tuple[int, int, str, int]]:
        """pid -> (parent pid, CPU ticks used, command name, start time)."""
        procs: dict[int, tuple[int, int, str, int]] = {}
        try:
            entries = os.listdir("/proc")
        except OSError:
            return procs
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            procs[int(entry)] = (
                int(fields[1]),
                int(fields[11]) + int(fields[12]),
                name,
                int(fields[19]),
            )
        return procs

    def _foreign(self, procs: dict[int, tuple[int, int, str, int]]) -> set[int]:
        return set(procs) - process_tree(os.getpid(), procs)

    def _run(self) -> None:
        prev, last = self.snapshot(), time.perf_counter()
        while not self._stop.wait(self.interval_s):
            now_procs, now = self.snapshot(), time.perf_counter()
            ticks = 0
            for pid in self._foreign(now_procs):
                _, cpu, name, started = now_procs[pid]
                before = prev.get(pid)
                # A pid seen before with the same start time is the same process (kernel
                # threads rename themselves); otherwise it is new and all its CPU counts.
                delta = cpu - (before[1] if before and before[3] == started else 0)
                if delta > 0:
                    ticks += delta
                    self.names[name] = self.names.get(name, 0.0) + delta / self._tick
            self.samples.append((now, ticks / self._tick / max(now - last, 1e-9)))
            prev, last = now_procs, now

    def __enter__(self) -> ForeignLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def cores(self, start: float = -math.inf, end: float = math.inf) -> float:
        """Mean foreign cores busy between two ``time.perf_counter()`` values."""
        inside = [c for t, c in self.samples if start < t <= end]
        return sum(inside) / len(inside) if inside else 0.0

    def top(self, n: int = 3) -> str:
        busy = sorted(self.names.items(), key=lambda kv: -kv[1])[:n]
        return ", ".join(f"{name} {sec:.0f} s" for name, sec in busy if sec >= 1) or "none"
