"""The fault matrix: every method x {kill, stop, raise, hang} on 3 workers, through `tether train`.

One worker (rank 1 for the replicated methods, rank 2 for those with a server at rank 0) fails at
step 20 of 150 (LeNet-5, Fashion-MNIST, batch 32, ``--timeout 10``):

- ``kill``: SIGKILL to itself;
- ``stop``: SIGSTOP to itself (a process swapped out, a debugger, a ^Z);
- ``raise``: an exception in the training step;
- ``hang``: an endless sleep in the training step (alive, silent).

Each cell: how the run ended (exit code; completed with the rank lost, or failed naming a rank),
and the seconds from the fault to the end of the `tether` process. The contract: a synchronous
method fails fast naming the rank that failed or stopped answering, an asynchronous one carries
on without it; no run hangs (the harness gives each run 180 s and records a hang if it must kill
it) and none reports success with its training cut short.

    .venv/bin/python benchmarks/bench_faults.py            # ~15 min on 2 cores
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine, machine_slug, tether_command, write_result

RESULTS = Path(__file__).parent / "results"
METHODS = (
    "sync-sgd",
    "sync-easgd",
    "local-sgd",
    "original-easgd",
    "async-easgd",
    "async-measgd",
    "hogwild-easgd",
    "async-sgd",
    "async-msgd",
    "hogwild-sgd",
)
SERVER_METHODS = {m for m in METHODS if m not in ("sync-sgd", "sync-easgd", "local-sgd")}
KINDS = ("kill", "stop", "raise", "hang")
HARNESS_LIMIT_S = 180
STEPS, FAULT_STEP, TIMEOUT_S = 150, 20, 10


def run_cell(method: str, kind: str, scratch: Path) -> dict[str, object]:
    run = scratch / f"{method}-{kind}"
    rank = 2 if method in SERVER_METHODS else 1
    command = [
        *tether_command(),
        "train",
        "--method",
        method,
        "--workers",
        "3",
        "--batch-size",
        "32",
        "--steps",
        str(STEPS),
        "--eval-every",
        "50",
        "--timeout",
        str(TIMEOUT_S),
        "--no-progress",
        "--set",
        f"fault_rank={rank}",
        "--set",
        f"fault_step={FAULT_STEP}",
        "--set",
        f"fault_kind={kind}",
        "--out",
        str(run),
    ]
    begin = time.time()
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=HARNESS_LIMIT_S, check=False
        )
        code: int | None = proc.returncode
        stderr = proc.stderr
    except subprocess.TimeoutExpired as expired:
        code, stderr = None, str(expired.stderr or "")
    ended = time.time()
    fault_file = run / "injected_fault.txt"
    fault_at = float(fault_file.read_text()) if fault_file.exists() else None
    cell: dict[str, object] = {
        "method": method,
        "kind": kind,
        "rank": rank,
        "exit": code,
        "seconds_to_exit": round(ended - fault_at, 1) if fault_at else None,
        "wall_s": round(ended - begin, 1),
    }
    summary_file = run / "summary.json"
    if code is None:
        cell["outcome"] = f"HUNG (killed by the harness after {HARNESS_LIMIT_S} s)"
    elif code == 0 and summary_file.exists():
        summary = json.loads(summary_file.read_text())
        lost = [w["rank"] for w in summary.get("lost_workers", [])]
        cell["outcome"] = f"completed {summary['steps']}/{STEPS} steps, lost {lost}"
        cell["lost"] = lost
    else:
        errors = [line for line in stderr.splitlines() if line.startswith("tether: error:")]
        cell["outcome"] = f"failed: {errors[-1][15:] if errors else stderr.strip()[-200:]}"
        cell["names_rank"] = f"rank {rank}" in (errors[-1] if errors else "")
    return cell


def short(cell: dict[str, object]) -> str:
    """A table cell: what happened and how fast."""
    outcome = str(cell["outcome"])
    seconds = cell["seconds_to_exit"]
    when = f"{seconds} s" if seconds is not None else "-"
    if outcome.startswith("completed"):
        what = f"carried on, lost {cell.get('lost')}"
    elif outcome.startswith("failed"):
        what = f"failed, names rank {cell['rank']}" if cell.get("names_rank") else "failed"
    else:
        what = "HUNG"
    return f"{what}; {when}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args()
    methods, kinds = args.methods.split(","), args.kinds.split(",")
    started = time.time()
    cells = []
    with tempfile.TemporaryDirectory(prefix="tether-faults-") as scratch:
        for method in methods:
            for kind in kinds:
                cell = run_cell(method, kind, Path(scratch))
                print(json.dumps(cell), flush=True)
                cells.append(cell)
    info = machine()
    slug = machine_slug(info)
    out = RESULTS / f"faults_{slug}.md"
    (RESULTS / f"faults_{slug}.json").write_text(json.dumps(cells, indent=2) + "\n")
    lines = [
        "# Fault matrix: every method x {kill, stop, raise, hang}",
        "",
        f"- machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- command: `python {shlex.join(['benchmarks/bench_faults.py', *sys.argv[1:]])}`",
        f"- took {(time.time() - started) / 60:.0f} min; 3 workers, LeNet-5 / Fashion-MNIST, "
        f"batch 32, {STEPS} steps, fault at step {FAULT_STEP} on rank 1 (replicated methods) "
        f"or rank 2 (server methods), --timeout {TIMEOUT_S}",
        "- each cell: the outcome; seconds from the fault to the end of the `tether` process",
        "",
        "| method | " + " | ".join(kinds) + " |",
        "|---|" + "---|" * len(kinds),
    ]
    for method in methods:
        row = [short(c) for c in cells if c["method"] == method]
        lines.append(f"| {method} | " + " | ".join(row) + " |")
    lines += ["", "Raw outcomes:", ""]
    lines += [f"- {c['method']} / {c['kind']}: exit {c['exit']}, {c['outcome']}" for c in cells]
    write_result(out, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
