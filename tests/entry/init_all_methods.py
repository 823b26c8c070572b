"""Every method through ``tether.init`` + ``ctx.wrap`` in a user's own loop, one after the other
in the same processes (run by tests/entry/test_api_e2e.py under torchrun and under mpiexec).

Each rank prints one JSON line per method: its role, the steps it took, the accuracy of
``ctx.eval_model()`` on the training digits and a checksum of that model's weights. A server's
``wrap`` serves and then ends the process; here the SystemExit is caught so the next method can
run in the same processes (a real script simply ends there).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tether

STEPS = 40


def emit(record: dict) -> None:
    """One line in one write, so the ranks' lines never interleave."""
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def main() -> None:
    methods = sys.argv[1].split(",")
    x, y = load_digits(return_X_y=True)
    data = TensorDataset(torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y))
    for method in methods:
        ctx = tether.init(method=method, tau=2, batch_size=16, timeout_s=30)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
        try:
            model, optimizer = ctx.wrap(model, optimizer)
        except SystemExit:
            emit({"method": method, "rank": ctx.rank, "role": "server"})
            continue
        loader = DataLoader(data, batch_size=16, sampler=ctx.sampler(data))
        steps = 0
        for xb, yb in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            optimizer.step()
            steps += 1
            if steps == STEPS:
                break
        final = ctx.eval_model()
        with torch.no_grad():
            accuracy = float((final(data.tensors[0]).argmax(1) == data.tensors[1]).float().mean())
            checksum = float(sum(p.double().sum() for p in final.parameters()))
        record = {
            "method": method,
            "rank": ctx.rank,
            "role": "worker",
            "steps": steps,
            "accuracy": accuracy,
            "checksum": checksum,
        }
        emit(record)
        ctx.finish()


if __name__ == "__main__":
    main()
