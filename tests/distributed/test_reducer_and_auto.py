"""The training all-reducer (algorithm x wire format) and the calibrated ``auto`` choice, on one
spawned gloo group of 3 ranks (starting a group costs seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tether.comm.calibration.cache import cache_path, load_or_calibrate
from tether.comm.collectives import COLLECTIVES
from tether.comm.reducer import AllReducer
from tether.comm.transport import TorchTransport
from tether.launch.spawn import run_spawned

WORLD = 3
N = 10_007  # not divisible by 3
# Unit roundoff of the wire formats; the stated bound is in the test.
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}


def _input(rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(N, generator=gen) * 10


def _worker(rank: int, world: int, cache: str) -> dict:
    cache_dir = Path(cache)
    transport = TorchTransport()
    out: dict = {}
    for algorithm in ("native", "ring", "halving-doubling", "hierarchical", "auto"):
        for compress in ("none", "fp16", "bf16"):
            # "auto" measures its calibration on the first reducer and reads it on the others
            reducer = AllReducer(transport, algorithm, compress, 1, cache_dir=cache_dir)
            # several in flight at once, waited out of order: they complete in start order
            tensors = [_input(rank), _input(rank) * 2, _input(rank)[:5].clone()]
            pending = [reducer.start(t, average=(i != 1)) for i, t in enumerate(tensors)]
            for p in reversed(pending):
                p.wait()
            out[f"{algorithm}/{compress}"] = torch.cat(tensors)
    # fp16 would overflow summing three values near its maximum without the pre-division
    big = torch.full((8,), 60000.0)
    AllReducer(transport, "ring", "fp16").start(big, average=True).wait()
    out["overflow"] = big
    # a second auto reducer reads rank 0's cached calibration instead of measuring again
    path = cache_path(cache_dir, "gloo", world, 1)
    before = path.stat().st_mtime_ns if rank == 0 else 0
    calibration = load_or_calibrate(transport, cache_dir, ranks_per_node=1)
    after = path.stat().st_mtime_ns if rank == 0 else 0
    out["cache_reused"] = torch.tensor([before == after])
    out["choices"] = torch.tensor(
        [COLLECTIVES.names().index(calibration.choose("all_reduce", n)) for n in (4, 1 << 24)]
    )
    return out


def test_reducer_algorithms_wire_formats_and_auto(tmp_path: Path) -> None:
    results = run_spawned(_worker, WORLD, str(tmp_path), timeout_s=90)
    inputs = [_input(r) for r in range(WORLD)]
    mean = torch.stack(inputs).double().mean(0)
    expected = torch.cat([mean, 2 * WORLD * mean, mean[:5]]).numpy()
    abs_mean = torch.stack(inputs).double().abs().mean(0)
    magnitude = torch.cat([abs_mean, 2 * WORLD * abs_mean, abs_mean[:5]]).numpy()
    scale = np.abs(expected).max()
    for key in results[0]:
        if "/" not in key:
            continue
        compress = key.split("/")[1]
        for res in results:  # every rank holds the same result, bitwise
            np.testing.assert_array_equal(res[key], results[0][key])
        error = np.abs(results[0][key] - expected)
        if compress == "none":
            assert error.max() / scale < 1e-6, key
        else:
            # P casts of x_i/P and P-1 additions, each rounding once: (2P-1)*u*mean_i|x_i| (and
            # P times that for the block reduced as a sum)
            bound = (2 * WORLD - 1) * UNIT_ROUNDOFF[compress] * magnitude
            assert (error <= bound).all(), (key, float((error / bound).max()))
            assert error.max() > 0, f"{key} did not compress"
    np.testing.assert_allclose(results[0]["overflow"], 60000.0, rtol=1e-3)
    assert bool(results[0]["cache_reused"][0])
    for res in results:  # every rank made the same choice
        np.testing.assert_array_equal(res["choices"], results[0]["choices"])
    data = json.loads(next(tmp_path.rglob("*.json")).read_text())
    assert data["world_size"] == WORLD and data["alpha"] > 0 and data["beta"] > 0
    assert data["gamma"] > 0
    timed = data["measured"]["all_reduce"]
    assert {"native", "ring", "naive", "binomial"} <= set(timed)
    assert len({len(points) for points in timed.values()}) == 1  # same sizes for all
    assert "chain" in data["measured"]["broadcast"]


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
