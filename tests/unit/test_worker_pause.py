"""A parameter-server worker's wait for a server busy with its own work (evaluating, saving) is
no communication: the server's reply says how long it has been busy so far, and the part of the
worker's wait that it explains is set aside (the async methods' comm share counted the
server's evaluations: 85% against 18% with one evaluation in the run)."""

from __future__ import annotations

import time
from typing import Any

import torch

from tether.comm.header import MessageHeader, MessageKind
from tether.comm.messages import Message
from tether.methods.ps_worker import WorkerEndpoint
from tether.methods.step_times import StepTimes


class _Server:
    """Replies after ``wait_s``, saying it has been busy for ``busy_s`` in all."""

    rank = 1
    world_size = 2

    def __init__(self) -> None:
        self.wait_s = 0.0
        self.busy_s = 0.0

    def send_message(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs

    def recv_message(self, buffers: dict[MessageKind, torch.Tensor], src: int) -> Message:
        time.sleep(self.wait_s)
        header = MessageHeader(MessageKind.PARAMS, src, 3, 4, torch.float32, self.busy_s, 0)
        return Message(header, buffers[MessageKind.PARAMS][:4])


def test_the_wait_the_servers_own_work_explains_is_set_aside() -> None:
    server = _Server()
    link = WorkerEndpoint(server, torch.zeros(4))  # type: ignore[arg-type]
    server.wait_s, server.busy_s = 0.05, 0.04  # evaluated 40 ms of our 50 ms wait
    link.exchange(torch.zeros(4), MessageKind.PARAMS, 1)
    assert 0.039 < link.take_paused() <= 0.041
    assert link.take_paused() == 0.0  # taken
    server.wait_s = 0.02  # no more work of its own: all communication
    link.exchange(torch.zeros(4), MessageKind.PARAMS, 2)
    assert link.take_paused() == 0.0
    # a second of evaluation, mostly while we computed: our wait at most (the server cannot
    # tell when our message came: an overcount of at most one exchange per evaluation)
    server.busy_s = 1.04
    link.exchange(torch.zeros(4), MessageKind.PARAMS, 3)
    assert 0.02 <= link.take_paused() < 0.2
    server.busy_s = 2.04  # eval_model's fetch, outside any step: no step's pause
    link.fetch(in_step=False)
    assert link.take_paused() == 0.0
    link.exchange(torch.zeros(4), MessageKind.PARAMS, 4)
    assert link.take_paused() == 0.0  # the fetch's wait took that second, not this step's


def test_a_step_counts_the_pause_neither_as_communication_nor_as_its_time() -> None:
    times = StepTimes()
    times.waited(1.0, 1.5, paused=0.4)
    assert (round(times.comm_s, 9), times.paused_s) == (0.1, 0.4)
    assert times.comm_spans == [(1.0, 1.5)]  # the timeline shows the whole wait
    times.waited(2.0, 2.1, paused=3.0)  # never more than the wait
    assert round(times.paused_s, 9) == 0.5 and round(times.comm_s, 9) == 0.1
