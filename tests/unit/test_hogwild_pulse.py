"""The liveness watches of the Hogwild methods (tether.methods.hogwild_base), which send no
messages while they train: the server watches each worker's step count, a worker the server's
pulse on the board. On a clock of the test's own (no sleeps to overshoot on a busy machine)."""

from __future__ import annotations

from tether.methods.hogwild_base import ServerPulse, Stillness


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_worker_gives_up_a_server_whose_pulse_stands_still() -> None:
    clock = Clock()
    pulse = ServerPulse(timeout_s=5.0, clock=clock)
    assert pulse.check(0) == ""
    clock.now += 60
    assert pulse.check(0) == ""  # a server still starting: the watch waits for its first beat
    assert pulse.check(1) == ""  # first seen
    clock.now += 3
    assert pulse.check(2) == ""  # moved: the watch starts again
    clock.now += 4
    assert pulse.check(2) == ""  # 4 s since 2 was first seen
    clock.now += 2
    assert pulse.check(2) == "server rank 0's pulse stood still for 6 s (hung?)"
    assert pulse.check(3) == ""  # a late beat: alive again


def test_the_server_gives_up_a_worker_whose_steps_stand_still() -> None:
    clock = Clock()
    still = Stillness(timeout_s=5.0, clock=clock)
    assert still.check({1: 5, 2: 5}, [1, 2]) == {}
    clock.now += 3
    assert still.check({1: 6, 2: 5}, [1, 2]) == {}
    clock.now += 3
    assert still.check({1: 6, 2: 5}, [1, 2]) == {2: "its step count stayed at 5 for 6 s (hung?)"}
    assert still.check({1: 6, 2: 5}, [1]) == {}  # given up: no longer watched
