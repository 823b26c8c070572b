"""A resumed run's record times the target the resumed run has, from the evaluations so far."""

from __future__ import annotations

from tether.targets import parse_target
from tether.training.run_record import RunRecord

HISTORY = [
    {"time_s": 1.0, "step": 10, "test_loss": 0.9, "test_accuracy": 0.70},
    {"time_s": 2.0, "step": 20, "test_loss": 0.5, "test_accuracy": 0.85},
    {"time_s": 3.0, "step": 30, "test_loss": 0.4, "test_accuracy": 0.88},
]


def _record() -> RunRecord:
    return RunRecord(start_step=30, history=list(HISTORY), time_to_target=1.0)


def test_the_first_evaluation_that_reaches_the_new_target_sets_the_time() -> None:
    record = _record()
    record.retarget(parse_target("accuracy>=0.85"))
    assert record.time_to_target == 2.0
    record.retarget(parse_target("loss<=0.45"))
    assert record.time_to_target == 3.0


def test_a_target_not_reached_or_dropped_or_of_another_metric_has_no_time() -> None:
    for target in (parse_target("accuracy>=0.9"), None, parse_target("mae<=0.1")):
        record = _record()
        record.retarget(target)
        assert record.time_to_target is None, target
