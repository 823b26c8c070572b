"""The README's own runs: its numbers come from here, not from a hand.

Runs the commands whose results the README quotes (the default job that ``make demo`` trains,
and the first ``tether train`` example), as a user would, one after another, and writes
``results/readme_runs_<machine>.md``: each command, its printed output, and its figures as JSON.
``--update-readme`` then rewrites the README's marked blocks from that file (the blocks between
``<!-- results:FILE NAME -->`` and ``<!-- /results -->``, FILE in ``benchmarks/results``); a unit
test checks that the README's blocks are what their files give, so a number typed by hand fails.

Run from the repository root::

    .venv/bin/python benchmarks/bench_readme.py --update-readme        # about 2 minutes
    .venv/bin/python benchmarks/bench_readme.py --reuse --update-readme # the README from the file
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shlex
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, machine, machine_slug, tether_command, write_result

README = Path(__file__).resolve().parent.parent / "README.md"
STEM = "readme_runs"
# name -> the arguments after `tether` (the README shows them with `.venv/bin/tether`)
RUNS = {
    "demo": ["train"],
    "first-example": [
        "train", "--method", "sync-sgd", "--workers", "4", "--model", "lenet5", "--dataset",
        "fashion-mnist", "--epochs", "5", "--batch-size", "64", "--lr", "0.05", "--momentum",
        "0.9", "--target-accuracy", "0.88", "--out", "runs/lenet4",
    ],
}  # fmt: skip
BLOCK = re.compile(
    r"(<!-- results:(?P<file>[\w.-]+) (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results -->)",
    re.S,
)


def run(name: str, args: list[str], where: str) -> dict[str, Any]:
    """One command in a fresh folder (its run directory is made there, as for a user)."""
    with tempfile.TemporaryDirectory() as cwd:
        start = time.perf_counter()
        done = subprocess.run(
            [*tether_command(), *args, "--no-progress"], cwd=cwd, capture_output=True, text=True
        )
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{name} failed ({done.returncode}): {done.stderr[-600:]}")
        (summary_file,) = Path(cwd).glob("runs/*/summary.json")
        summary = json.loads(summary_file.read_text())
    reached = next(
        (h for h in summary["history"] if h.get("test_accuracy", 0) >= 0.88), None
    )  # fmt: skip
    return {
        "name": name,
        "command": shlex.join(["tether", *args]),
        "output": done.stdout.rstrip("\n"),
        "command_wall_s": round(wall, 1),
        "final_test_accuracy": summary["final_test_accuracy"],
        "time_to_88_s": None if reached is None else round(reached["time_s"], 1),
        "date": datetime.date.today().isoformat(),
        "where": where,
    }


def read_runs(path: Path) -> dict[str, dict[str, Any]]:
    """The runs a result file holds (its ```json blocks)."""
    blocks = re.findall(r"```json\n(.*?)\n```", path.read_text(), re.S)
    return {run["name"]: run for run in (json.loads(b) for b in blocks)}


def render(name: str, run: dict[str, Any]) -> str:
    """The README's text for one run."""
    where = run["where"]
    if name == "demo":
        return (
            f"```\n{run['output']}\n```\n"
            f"(measured on {where} on {run['date']}: {run['command_wall_s']:.0f} s for the whole "
            "command, start-up included; `make demo` adds the one-time set-up of `.venv`. The "
            "accuracy is the center variable's, and it is the same on every run: sync-easgd is "
            "deterministic.)\n"
        )
    if name == "first-example":
        reached = (
            f"reaches 88% test accuracy after {run['time_to_88_s']:.0f} s of training"
            if run["time_to_88_s"] is not None
            else "does NOT reach 88% test accuracy"
        )
        return (
            f"The first command {reached} and ends at {run['final_test_accuracy']:.1%} "
            f"({where}, {run['date']}).\n"
        )
    raise KeyError(name)


def readme_with_runs(text: str, results: Path = RESULTS) -> str:
    """``text`` (the README) with every marked block rendered from its result file."""

    def fill(match: re.Match[str]) -> str:
        body = render(match["name"], read_runs(results / match["file"])[match["name"]])
        return match.group(1) + body + match.group(5)

    return BLOCK.sub(fill, text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reuse", action="store_true", help="no runs: use the result file")
    parser.add_argument("--update-readme", action="store_true")
    args = parser.parse_args()
    info = machine()
    path = RESULTS / f"{STEM}_{machine_slug(info)}.md"
    if not args.reuse:
        where = f"the {info['cores']}-core development machine"
        runs = {name: run(name, argv, where) for name, argv in RUNS.items()}
        lines = [
            "# The README's runs",
            "",
            f"- machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}",
            "- command: `python benchmarks/bench_readme.py --update-readme`",
            "",
        ]
        for r in runs.values():
            lines += [f"## {r['name']}: `{r['command']}`", "", "```json", json.dumps(r, indent=1),
                      "```", ""]  # fmt: skip
        write_result(path, lines)
        print(f"wrote {path}")
    if args.update_readme:
        README.write_text(readme_with_runs(README.read_text()))
        print(f"updated {README}")


if __name__ == "__main__":
    main()
