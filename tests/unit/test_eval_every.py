"""The default evaluation interval: four per epoch, and at least eight in a short run."""

from __future__ import annotations

from tether.training.evaluation import (
    MIN_EVAL_INTERVAL,
    MIN_EVALUATIONS,
    default_eval_every,
    eval_interval,
)


def test_four_per_epoch_in_long_runs() -> None:
    assert default_eval_every(937, 937 * 3) == 234


def test_short_runs_get_a_curve() -> None:
    # --steps 100 at 937 steps per epoch used to evaluate once (every 234 steps).
    every = default_eval_every(937, 100)
    assert every == 12 and 100 // every >= MIN_EVALUATIONS
    assert default_eval_every(937, 30) == MIN_EVAL_INTERVAL  # not at every step
    assert default_eval_every(2) == 1


def test_a_large_batch_is_not_evaluated_at_every_step() -> None:
    # At a global batch of 8192, an epoch of Fashion-MNIST is 7 steps: evaluating every step
    # (7 per epoch, nearly twice the four intended) is what the floor of 7 / 4 gave.
    assert default_eval_every(7, 70) == 2 and default_eval_every(6) == 2


def test_without_evaluation_data_only_the_last_step_is_evaluated() -> None:
    assert eval_interval(0, 937, 2811, True) == default_eval_every(937, 2811)
    assert eval_interval(50, 937, 2811, True) == 50  # as asked
    # nothing to measure: one evaluation, at the last step (it fixes the saved model)
    assert eval_interval(0, 937, 2811, False) == 2811
    assert eval_interval(50, 937, 2811, False) == 2811
    assert eval_interval(0, 937, 0, False) == 1
