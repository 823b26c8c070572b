"""A joined worker of an asynchronous method with no supervisor (torchrun): its own failure ends
only its process, with status 0 (tether.methods.own_failure); every other failure reaches the
launcher as before. Each case in its own interpreter (the rule ends a process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys
from tether.methods.own_failure import tolerate_own_failure, withdraw


class Link:
    in_exchange = 0
    failed = {failed}


tolerate_own_failure(Link(), 2, "async-sgd")
if {withdrawn}:
    withdraw()  # the worker's goodbye
raise {error}
"""


@pytest.mark.parametrize(
    ("failed", "withdrawn", "error", "leaves"),
    [
        (False, False, "ValueError('bad sample')", True),  # its own code: the run goes on
        (True, False, "ConnectionError('rank 0 closed')", False),  # its link: the server's gone
        (False, True, "ValueError('bad save')", False),  # after its goodbye: it left the run
        (False, False, "KeyboardInterrupt()", False),  # the launcher's stop
    ],
)
def test_only_a_joined_workers_own_failure_leaves_quietly(
    failed: bool, withdrawn: bool, error: str, leaves: bool
) -> None:
    script = SCRIPT.format(failed=failed, withdrawn=withdrawn, error=error)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    said = "tether: worker rank 2 failed (ValueError: bad sample); async-sgd carries on"
    if leaves:
        assert done.returncode == 0, done.stderr
        assert "Traceback (most recent call last)" in done.stderr  # what failed, where
        assert said in done.stderr
    else:
        assert done.returncode != 0
        assert "carries on without it" not in done.stderr
        assert error.split("(")[0] in done.stderr  # the usual traceback


TWO_RUNS = """
import sys
from tether.methods.own_failure import tolerate_own_failure, withdraw


class Link:
    in_exchange = 0
    failed = False


tolerate_own_failure(Link(), 1, "async-sgd")
withdraw()
inner = sys.excepthook


def rank_prefix(kind, exc, tb):  # as torch's process group wraps the hook it finds
    sys.stderr.write("[rank1]: ")
    inner(kind, exc, tb)


sys.excepthook = rank_prefix
tolerate_own_failure(Link(), 1, "async-sgd")  # a second run in this process
withdraw()  # its goodbye: a failure now is the launcher's
raise ValueError("after the goodbye")
"""


def test_a_second_run_in_the_process_chains_the_hooks_once() -> None:
    # Before: the second run took torch's wrapper (around our hook) for the previous hook, and
    # the two called each other until a RecursionError hid the exception (found by review).
    done = subprocess.run(
        [sys.executable, "-c", TWO_RUNS], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "RecursionError" not in done.stderr
    assert done.stderr.count("ValueError: after the goodbye") == 1, done.stderr
