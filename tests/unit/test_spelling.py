"""A message names a setting in its reader's words: a keyword for tether.fit and tether.init, a
flag on the command line, both where a check cannot know which (it runs in a worker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether.config import TrainConfig
from tether.errors import TetherError
from tether.spelling import as_dashed, as_keyword, both_ways
from tether.train_options import as_flag
from tether.training.run_dir import _check_same_batch


def test_each_reader_has_its_spelling() -> None:
    assert as_keyword("lr_schedule", "step") == "lr_schedule='step'"
    assert as_keyword("warmup_steps") == "warmup_steps"
    assert as_dashed("bucket_mb", 4) == "--bucket-mb 4"
    assert as_flag("lr_schedule", "step") == "--lr-schedule step"
    # tether train's flags are not always the key dashed, and some keys have none
    assert as_flag("timeout_s", 5) == "--timeout 5"
    assert as_flag("lars_eta", 0.002) == "--set lars_eta=0.002"
    assert as_flag("trust_exclude") == "--set trust_exclude"
    assert both_ways(workers=4, batch_size=64) == (
        "--workers 4 --batch-size 64 (workers=4, batch_size=64 in Python)"
    )


def test_a_resume_that_would_change_the_global_batch_says_how_in_both_words() -> None:
    config = TrainConfig(method="sync-sgd", workers=4, batch_size=32)
    with pytest.raises(TetherError) as refused:
        _check_same_batch(Path("run/checkpoint.pt"), {"workers": 2, "batch_size": 64}, config)
    assert str(refused.value).endswith(
        "resume with --workers 2 --batch-size 64 (workers=2, batch_size=64 in Python)"
    )
