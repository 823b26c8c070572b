"""The liveness watches of the Hogwild methods (tether.methods.hogwild_base), which send no
messages while they train: the server watches each worker's step count, a worker the server's
pulse on the board."""

from __future__ import annotations

import time

from tether.methods.hogwild_base import ServerPulse, Stillness


def test_a_worker_gives_up_a_server_whose_pulse_stands_still() -> None:
    pulse = ServerPulse(timeout_s=0.05)
    assert pulse.check(1) == ""  # first seen
    time.sleep(0.03)
    assert pulse.check(2) == ""  # moved: the watch starts again
    time.sleep(0.03)
    assert pulse.check(2) == ""  # still within the timeout of when 2 was first seen
    time.sleep(0.05)
    assert pulse.check(2).startswith("server rank 0's pulse stood still for ")
    assert pulse.check(3) == ""  # a late beat: alive again


def test_the_server_gives_up_a_worker_whose_steps_stand_still() -> None:
    still = Stillness(timeout_s=0.05)
    assert still.check({1: 5, 2: 5}, [1, 2]) == {}
    time.sleep(0.03)
    assert still.check({1: 6, 2: 5}, [1, 2]) == {}
    time.sleep(0.04)
    hung = still.check({1: 6, 2: 5}, [1, 2])
    assert list(hung) == [2] and hung[2].startswith("its step count stayed at 5 for ")
