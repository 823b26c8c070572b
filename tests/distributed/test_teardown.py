"""A worker's process group is really gone, its gloo threads joined, before the process exits.

A gloo backend that is alive when the interpreter finalises lets its threads release a finished
collective's tensors there, which aborts the process after a successful run
(``tether.launch.teardown``). Three things kept it alive, each checked here through the real
code: ``torch.distributed.nn.functional``'s default arguments (imported by torch.optim's first
step), the transport's cached backend held in a reference cycle, and sync SGD's gradient hooks,
which hold the bucketer, its reducer and that transport in a cycle the garbage collector cannot
break.
"""

from __future__ import annotations

import os

import torch

from tests.method_drive import cross_entropy_step
from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.launch.spawn import run_spawned
from tether.launch.teardown import shut_down_process_group
from tether.methods.base import MethodContext
from tether.methods.sync_sgd import SyncSGD


def _gloo_threads() -> list[str]:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names.append(comm.read().strip())
        except OSError:  # a thread that ended while listed
            continue
    return sorted(name for name in names if name.startswith(("pt_gloo", "gloo")))


def _train_then_shut_down(rank: int, world: int) -> tuple[list[str], list[str]]:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    config = TrainConfig(allreduce="ring", bucket_mb=0.0)  # our ring: the transport's backend
    method = SyncSGD(model, MethodContext(config, TorchTransport(), torch.device("cpu")))
    method.start()
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 0])
    for _ in range(2):  # the optimizer's first step imports torch.distributed.nn.functional
        cross_entropy_step(method, x, y)
    method.finish(None)
    method.itself = method  # a cycle, as objects holding a transport may form: only gc frees it
    before = _gloo_threads()
    del method, model
    shut_down_process_group()
    return before, _gloo_threads()


def test_after_training_the_gloo_threads_are_joined_before_exit() -> None:
    for before, after in run_spawned(_train_then_shut_down, 2, timeout_s=20):
        assert "pt_gloo_runloop" in before, before  # what the check looks for exists
        assert after == [], after
