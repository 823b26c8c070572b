"""`tether train --timeline` end to end: the merged Chrome trace of a real two-worker run (the
uninterrupted sync-sgd run other end-to-end tests check as well: tests/entry/conftest.py)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import CliResult, requires_fashion_mnist
from tests.entry.conftest import STRAIGHT_STEPS


@requires_fashion_mnist
def test_timeline_traces_every_rank_step_by_step(straight_run: tuple[Path, CliResult]) -> None:
    run, result = straight_run
    assert result.returncode == 0, result.stderr

    trace = json.loads((run / "timeline.json").read_text())
    assert trace["displayTimeUnit"] in ("ms", "ns")
    assert sorted(p.name for p in (run / "timeline").iterdir()) == ["rank0.json", "rank1.json"]
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    names = {(e["pid"], e["args"]["name"]) for e in meta if e["name"].endswith("_name")}
    assert {(0, "rank 0"), (1, "rank 1"), (0, "main"), (1, "main")} <= names
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)
    assert all(e["dur"] >= 0 for e in events)
    for pid in (0, 1):
        cats = {e["cat"] for e in events if e["pid"] == pid}
        assert {"step", "data", "compute", "comm", "eval"} <= cats, (pid, cats)

    by_step: dict[tuple[int, int], dict[str, dict]] = defaultdict(dict)
    for event in events:
        # (evaluations and checkpoints, after their step, name it too)
        after = event["cat"] in ("eval", "checkpoint")
        if event["tid"] == 1 and "step" in event.get("args", {}) and not after:
            by_step[event["pid"], event["args"]["step"]][event["name"]] = event
    steps = range(1, STRAIGHT_STEPS + 1)
    assert sorted(by_step) == [(pid, step) for pid in (0, 1) for step in steps]
    for (pid, step), spans in by_step.items():
        assert {"step", "data", "forward+backward", "comm wait", "optimizer step"} <= set(spans)
        outer = spans.pop("step")
        for span in spans.values():  # every piece inside its step: the viewer nests them
            assert outer["ts"] <= span["ts"], (pid, step, span)
            assert span["ts"] + span["dur"] <= outer["ts"] + outer["dur"], (pid, step, span)
        data, compute = spans["data"], spans["forward+backward"]
        wait, update = spans["comm wait"], spans["optimizer step"]
        # Sync SGD's order: load, forward+backward, wait for the all-reduce, update.
        assert data["ts"] + data["dur"] <= compute["ts"], (pid, step)
        assert compute["ts"] + compute["dur"] <= wait["ts"] <= update["ts"], (pid, step)

    # The trace's time split is the one metrics.jsonl reports (the same measurements).
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    data_s = {r["step"]: r["data_s"] for r in records if "event" not in r}
    for step, seconds in data_s.items():
        assert by_step[0, step]["data"]["dur"] == pytest.approx(seconds * 1e6, abs=1.0)
