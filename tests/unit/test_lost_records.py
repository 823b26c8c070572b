"""Records of lost workers across a resume (tether.launch.lost): the losses of the attempts before
it stay in the run directory and reach summary.json's ``lost_before_resume``."""

from __future__ import annotations

import json
from pathlib import Path

from tether.launch.local import _record_lost_workers
from tether.launch.lost import (
    LOST_DIR,
    SERVER_FINISHED,
    lost_record,
    read_earlier_records,
    read_lost_records,
    set_aside_earlier,
    write_lost_record,
)
from tether.observe.summary import run_summary_text


def _lose(run_dir: Path, rank: int, returncode: int) -> None:
    (run_dir / LOST_DIR).mkdir(parents=True, exist_ok=True)
    write_lost_record(run_dir / LOST_DIR, lost_record(rank, returncode, {}))


def test_a_resumed_run_keeps_the_losses_before_it(tmp_path: Path) -> None:
    # The first attempt lost rank 2 and was resumed; the resumed attempt lost rank 1. Before,
    # the resume deleted lost/ and summary.json named rank 1 alone.
    _lose(tmp_path, 2, -9)
    (tmp_path / LOST_DIR / SERVER_FINISHED).touch()  # the first attempt's server finished
    set_aside_earlier(tmp_path, resume=True)
    assert read_lost_records(tmp_path) == []  # not this attempt's
    # nor its server's end: this attempt's supervisors would kill their workers 5 s in
    assert not (tmp_path / LOST_DIR / SERVER_FINISHED).exists()
    _lose(tmp_path, 1, 1)
    summary = {
        "method": "async-sgd",
        "workers": 3,
        "model": "lenet5",
        "dataset": "fashion-mnist",
        "steps": 100,
        "epochs": 0.1,
        "wall_time_s": 5.0,
        "samples_per_s": 1000.0,
        "comm_fraction": 0.1,
        "lost_workers": [{"rank": 1, "reason": "closed its connection"}],
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    _record_lost_workers(tmp_path)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert [entry["rank"] for entry in written["lost_workers"]] == [1]
    (earlier,) = written["lost_before_resume"]
    assert earlier["rank"] == 2 and earlier["exit"] == "killed by SIGKILL"
    assert earlier["record"].startswith(f"{LOST_DIR}/before-resume-")
    assert (tmp_path / earlier["record"]).is_file()
    log = (tmp_path / "failures.log").read_text()
    assert "== worker rank 2 (lost at " in log and ", before the resume) ==" in log
    assert "== worker rank 1 (lost at " in log
    text = run_summary_text(tmp_path)
    assert "lost workers (the run carried on without them): rank 1 at " in text
    assert "lost before the resume: rank 2 at " in text and "(killed by SIGKILL)" in text


def test_each_resume_keeps_its_own_and_a_new_run_starts_clean(tmp_path: Path) -> None:
    _lose(tmp_path, 2, -9)
    set_aside_earlier(tmp_path, resume=True)
    _lose(tmp_path, 2, -15)  # the same rank lost again in the second attempt
    set_aside_earlier(tmp_path, resume=True)
    assert [r["exit"] for r in read_earlier_records(tmp_path)] == [
        "killed by SIGKILL",
        "killed by SIGTERM",
    ]
    # a resumed attempt that lost nothing still reports the earlier losses
    (tmp_path / "summary.json").write_text(json.dumps({"lost_workers": []}))
    _record_lost_workers(tmp_path)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["lost_workers"] == [] and len(written["lost_before_resume"]) == 2
    set_aside_earlier(tmp_path, resume=False)  # a new run (overwrite): nothing of the old one
    assert not (tmp_path / LOST_DIR).exists()


def test_a_finished_run_resumed_keeps_its_loss_listed_once(tmp_path: Path) -> None:
    # A finished run resumed with nothing left to do keeps its summary, which already lists
    # rank 2: it was listed a second time, under lost_before_resume, its record path dangling.
    _lose(tmp_path, 2, -9)
    (record,) = read_lost_records(tmp_path)
    entry = {"rank": 2, "lost_at": record["time_iso"], "record": f"{LOST_DIR}/rank-2.json"}
    (tmp_path / "summary.json").write_text(json.dumps({"lost_workers": [entry]}))
    set_aside_earlier(tmp_path, resume=True)
    _record_lost_workers(tmp_path)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert "lost_before_resume" not in written
    (kept,) = written["lost_workers"]
    assert kept["record"].startswith(f"{LOST_DIR}/before-resume-")
    assert (tmp_path / kept["record"]).is_file()


def test_a_run_that_lost_nobody_leaves_no_lost_directory(tmp_path: Path) -> None:
    # lost/ held the supervisors' marks while the run lasted; every server run left it behind
    (tmp_path / LOST_DIR).mkdir()
    (tmp_path / LOST_DIR / SERVER_FINISHED).touch()
    (tmp_path / LOST_DIR / ".joined-rank-1").touch()
    _record_lost_workers(tmp_path)
    assert not (tmp_path / LOST_DIR).exists()
