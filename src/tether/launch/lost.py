"""Records of worker processes lost during a run that carried on without them.

The supervisor (:mod:`tether.launch.supervise`) writes one ``RUN/lost/rank-R.json`` per lost
worker: how the process ended, when, and its exception and traceback if it raised. After the run,
the launcher adds these facts to the server's ``lost_workers`` in ``summary.json`` (the server
only sees a closed connection) and keeps the tracebacks in ``RUN/failures.log``. A resumed run
keeps the records of the attempts before it (:func:`set_aside_earlier`): ``summary.json``'s
``lost_before_resume`` lists them, since those losses shaped the checkpoint it went on from.

Standard library only: the supervisor imports it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from tether.observe.files import atomic_write_json

LOST_DIR = "lost"
EARLIER = "before-resume-"  # prefix of an earlier attempt's record, kept by a resumed run
# Written by the server's supervisor when the server exits 0: workers still running after that
# are of no more use to the run.
SERVER_FINISHED = ".server-finished"
# In the launcher's marks directory: a supervisor's account of why its rank ended, for the
# failure's report to say first (a server it killed for hanging once its workers were gone, a
# rank killed by a SIGTERM the launcher did not send).
CAUSE_MARK = "cause-rank-"
# Set by the server's supervisor to the directory where its workers' supervisors record each
# lost worker as it is lost, and say so (tether launch --method): a server in a user's own loop
# does not list those again when it ends, one line per loss.
LOSSES_SAID_ENV = "TETHER_LOSSES_SAID"


def said_by_their_supervisors(ranks: list[int], within_s: float = 1.0) -> set[int]:
    """Those of the lost worker ``ranks`` whose supervisors recorded and reported the loss (see
    above), waiting up to ``within_s`` for records on their way (a worker lost just before the
    run ended: its supervisor writes as its process ends, the server may be faster)."""
    lost_dir = os.environ.get(LOSSES_SAID_ENV)
    if not lost_dir or not ranks:
        return set()
    deadline = time.monotonic() + within_s
    while True:
        said = {rank for rank in ranks if (Path(lost_dir) / f"rank-{rank}.json").exists()}
        if len(said) == len(ranks) or time.monotonic() >= deadline:
            return said
        time.sleep(0.05)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def lost_record(rank: int, returncode: int, error: dict[str, str]) -> dict[str, Any]:
    now = time.time()
    how = describe_exit(returncode)
    message = error.get("message", "").strip().splitlines()
    return {
        "rank": rank,
        "returncode": returncode,
        "exit": how,
        # The worker's own exception explains more than its exit status.
        "reason": message[0] if message else how,
        "time": now,
        "time_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
        "traceback": error.get("traceback", ""),
    }


def write_lost_record(lost_dir: Path, record: dict[str, Any]) -> Path:
    path = lost_dir / f"rank-{record['rank']}.json"
    atomic_write_json(path, record)
    return path


def _read_records(run_dir: Path, pattern: str) -> list[dict[str, Any]]:
    """The records in ``lost/`` named by ``pattern``, each with the path it was read from
    (``record``, relative to the run directory); a torn or foreign file is skipped."""
    records = []
    for path in sorted((run_dir / LOST_DIR).glob(pattern)):
        try:
            records.append({**json.loads(path.read_text()), "record": f"{LOST_DIR}/{path.name}"})
        except (OSError, ValueError, TypeError):
            continue
    return records


def read_lost_records(run_dir: Path) -> list[dict[str, Any]]:
    """This attempt's records, by rank."""
    return sorted(_read_records(run_dir, "rank-*.json"), key=lambda r: int(r.get("rank", -1)))


def set_aside_earlier(run_dir: Path, resume: bool) -> None:
    """Before a launch: a new run starts with an empty ``lost/``; a resumed one keeps only the
    records of the attempts before it, renamed ``before-resume-<time>-rank-R.json`` so that this
    attempt's supervisors do not overwrite them and :func:`read_lost_records` does not take them
    for this attempt's. Everything else goes: the earlier server's ``.server-finished`` mark
    would tell this attempt's supervisors that the server is done and theirs to kill."""
    lost = run_dir / LOST_DIR
    if not resume or not lost.is_dir():
        shutil.rmtree(lost, ignore_errors=True)
        return
    for path in sorted(lost.glob("rank-*.json")):
        path.rename(lost / f"{EARLIER}{time.time_ns()}-{path.name}")  # atomic: nothing lost
    for path in lost.iterdir():
        if not path.name.startswith(EARLIER):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def read_earlier_records(run_dir: Path) -> list[dict[str, Any]]:
    """The records set aside by :func:`set_aside_earlier`, in the order they were lost."""
    records = _read_records(run_dir, f"{EARLIER}*.json")
    return sorted(records, key=lambda r: (float(r.get("time", 0)), int(r.get("rank", -1))))


def given_up_by_server(lost_dir: Path, rank: int) -> bool:
    """Whether the finished server's ``summary.json`` (beside ``lost_dir``, in the run directory)
    names ``rank`` among the workers it gave up on: such a worker is hung or stopped, and
    nothing waits for it any more, so it need not be given the grace a finishing worker gets."""
    try:
        summary = json.loads((lost_dir.parent / "summary.json").read_text())
        lost = summary.get("lost_workers") or []
        return any(int(entry.get("rank", -1)) == rank for entry in lost)
    except (OSError, ValueError, TypeError, AttributeError):
        return False


def merge_into_summary(summary: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """Add how and when each lost process ended to the server's ``lost_workers``."""
    entries = {int(e["rank"]): dict(e) for e in summary.get("lost_workers") or []}
    for record in records:
        rank = int(record["rank"])
        entry = entries.setdefault(rank, {"rank": rank})
        if "reason" in entry:
            entry["server_reason"] = entry["reason"]  # what the server saw
        # The process's own end explains more than the closed connection the server saw, except
        # for a worker the server gave up on as hung and that was killed only afterwards.
        keep_server = record.get("overstayed") and "server_reason" in entry
        entry.update(
            reason=entry["server_reason"] if keep_server else record["reason"],
            exit=record["exit"] if not record.get("overstayed") else record["reason"],
            lost_at=record["time_iso"],
            record=record["record"],
        )
    summary["lost_workers"] = [entries[rank] for rank in sorted(entries)]


def add_earlier_to_summary(summary: dict[str, Any], earlier: list[dict[str, Any]]) -> None:
    """``lost_before_resume``: the workers lost in the attempts before a resume, how and when.
    A loss the summary already lists (a finished run resumed with nothing left to do keeps its
    summary) stays where it is, its ``record`` pointed at the renamed file."""
    keys = ("rank", "reason", "exit", "time_iso", "record")
    listed = {(e.get("rank"), e.get("lost_at")): e for e in summary.get("lost_workers") or []}
    before = []
    for record in earlier:
        entry = listed.get((record.get("rank"), record.get("time_iso")))
        if entry is not None:
            entry["record"] = record["record"]
            continue
        before.append(
            {
                ("lost_at" if key == "time_iso" else key): record[key]
                for key in keys
                if key in record
            }
        )
    if before:
        summary["lost_before_resume"] = before


def failures_text(records: list[dict[str, Any]]) -> str:
    return "".join(
        f"== worker rank {r['rank']} (lost at {r.get('time_iso', '?')}"
        f"{', before the resume' if _earlier(r) else ''}) ==\n"
        f"{r.get('traceback') or r.get('reason', '')}\n"
        for r in records
    )


def _earlier(record: dict[str, Any]) -> bool:
    return str(record.get("record", "")).startswith(f"{LOST_DIR}/{EARLIER}")
