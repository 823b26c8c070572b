"""Data vs model parallelism on a wide MLP (the COTS HPC argument, Coates et al., ICML 2013).

Four ranks train one MLP (784 -> H -> H -> H -> 10, ReLU) with sync-sgd in three layouts:

- ``data``: 4 data-parallel replicas, each on a quarter of the global batch; the gradients
  (every weight) are all-reduced over the 4 ranks every step;
- ``model``: one model group of 4 that splits every layer (fc1 column, fc2 row, fc3 column,
  out row) and sees the whole global batch; activations are all-reduced in the model group;
- ``grid``: 2 model groups of 2 (the same split), each on half the global batch, gradients
  all-reduced over the 2 data-parallel ranks of each slice.

Measured per layout and global batch, in one spawned group with the layouts interleaved over
``--repeats`` rounds: the time of a training step (median over the timed steps of all rounds,
slowest rank), the bytes every rank hands to collectives per step (counted at the transport:
the sizes of the tensors all-reduced or all-gathered) and what a ring sends of them per rank
(``2(P-1)/P`` of an all-reduce's bytes, ``(P-1)/P`` of an all-gather's), the parameter bytes each
rank holds (counted), and beside each the alpha-beta prediction of the step's communication
(:mod:`tether.perf`, the ``vm-2cores`` profile) and the predicted crossover batch where the
activations moved equal the weights moved.

Part ``memory``: a model that does not fit a stated per-process budget for its training state
(weights, gradients and momentum: counted tensor bytes after a step, beside each rank's peak
resident memory) trains with K = 4: a wide MLP (H = 4096 by default, 37M parameters) for a few
steps, data-parallel and split four ways, with the loss of each step.

    .venv/bin/python benchmarks/bench_model_parallel.py --part layouts   # ~5 min on 2 cores
    .venv/bin/python benchmarks/bench_model_parallel.py --part memory    # ~2 min
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import nn

from _common import machine, write_part_result
from tether.comm.transport import TorchTransport
from tether.config import TrainConfig
from tether.launch.spawn import run_spawned
from tether.methods import MethodContext, StepTimes
from tether.methods.sync_sgd import SyncSGD
from tether.parallel import ProcessGrid, parallelize
from tether.perf.collective_cost import Links, all_reduce_time
from tether.perf.predict import links_of
from tether.perf.profile import load_profile

WORLD = 4
LAYOUTS = {"data": 1, "grid": 2, "model": 4}  # layout -> model parallelism K
PLAN = {"fc1": "column", "fc2": "row", "fc3": "column", "out": "row"}


class WideMLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc2(F.relu(self.fc1(x))))
        return self.out(F.relu(self.fc3(x)))


class CountingTransport(TorchTransport):
    """The torch transport, counting the bytes handed to each collective."""

    def __init__(self, inner: TorchTransport) -> None:
        super().__init__(inner.group)
        self.bytes: Counter[str] = Counter()

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", async_op: bool = False) -> Any:
        self.bytes["all_reduce"] += tensor.numel() * tensor.element_size()
        return super().all_reduce(tensor, op, async_op)

    def all_gather(self, tensor: torch.Tensor) -> None:
        self.bytes["all_gather"] += tensor.numel() * tensor.element_size()
        super().all_gather(tensor)


def _ring_sent(counts: Counter[str], size: int) -> float:
    if size == 1:
        return 0.0
    return 2 * (size - 1) / size * counts["all_reduce"] + (size - 1) / size * counts["all_gather"]


def _one_layout(
    world: TorchTransport, grids: dict[int, ProcessGrid | None], k: int, batch: int, args: Any
) -> dict[str, float]:
    """Warm-up and timed sync-sgd steps of one layout at one global batch, on this rank."""
    grid = grids[k]
    data = CountingTransport(grid.data if grid is not None else world)
    model_group = CountingTransport(grid.model) if grid is not None else None
    torch.manual_seed(0)
    model: nn.Module = WideMLP(args.hidden)
    if model_group is not None:
        parallelize(model, PLAN, model_group)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    config = TrainConfig(lr=0.01, momentum=0.9)
    method = SyncSGD(model, MethodContext(config, data, torch.device("cpu")))
    method.start()
    per_worker = batch // (WORLD // k)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(per_worker, 784, generator=gen)
    y = torch.randint(0, 10, (per_worker,), generator=gen)

    times = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            data.bytes.clear()
            if model_group is not None:
                model_group.bytes.clear()
        begin = time.perf_counter()
        _sgd_step(method, x, y)
        times.append(time.perf_counter() - begin)
    method.finish(None)
    steps = args.steps
    sent = _ring_sent(data.bytes, data.world_size)
    handed = sum(data.bytes.values()) if data.world_size > 1 else 0  # a group of one sends nothing
    if model_group is not None:
        sent += _ring_sent(model_group.bytes, model_group.world_size)
        handed += sum(model_group.bytes.values())
    return {
        "step_s": statistics.median(times[args.warmup :]),
        "handed_bytes": handed / steps,
        "sent_bytes": sent / steps,
        "param_bytes": float(param_bytes),
    }


def _on_rank(rank: int, world_size: int, args: Any) -> dict[str, list[dict[str, float]]]:
    torch.set_num_threads(1)
    world = TorchTransport()
    grids = {k: (ProcessGrid.build(world, k, 60) if k > 1 else None) for k in LAYOUTS.values()}
    out: dict[str, list[dict[str, float]]] = {}
    layouts = list(LAYOUTS.items())
    for round_ in range(args.repeats):
        for batch in args.batches:
            # rotate the order each round so no layout always runs first
            shift = round_ % len(layouts)
            for name, k in layouts[shift:] + layouts[:shift]:
                out.setdefault(f"{name}/{batch}", []).append(
                    _one_layout(world, grids, k, batch, args)
                )
    return out


def _training_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the weights, their gradients and the optimizer's state this rank holds."""
    tensors: list[torch.Tensor] = list(model.parameters())
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return sum(t.numel() * t.element_size() for t in tensors)


def _memory_on_rank(rank: int, world_size: int, args: Any, name: str) -> dict[str, Any]:
    """One layout in a fresh group of processes, so each process's peak memory is its own."""
    torch.set_num_threads(1)
    world = TorchTransport()
    grid = ProcessGrid.build(world, WORLD, 60)
    out: dict[str, Any] = {}
    for k in (LAYOUTS[name],):
        torch.manual_seed(0)
        model: nn.Module = WideMLP(args.memory_hidden)
        if k > 1:
            parallelize(model, PLAN, grid.model)
        transport = grid.data if k > 1 else world
        config = TrainConfig(lr=0.01, momentum=0.9)
        method = SyncSGD(model, MethodContext(config, transport, torch.device("cpu")))
        method.start()
        per_worker = args.memory_batch // (WORLD // k)
        gen = torch.Generator().manual_seed(2 + (rank if k == 1 else 0))
        x = torch.randn(per_worker, 784, generator=gen)
        y = torch.randint(0, 10, (per_worker,), generator=gen)
        begin = time.perf_counter()
        losses = [_sgd_step(method, x, y) for _ in range(args.memory_steps)]
        out[name] = {
            "state_bytes": _training_state_bytes(model, method.optimizer),
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "losses": losses,
            "step_s": (time.perf_counter() - begin) / args.memory_steps,
        }
        method.finish(None)
    return out


def _sgd_step(method: SyncSGD, x: torch.Tensor, y: torch.Tensor) -> float:
    def backward() -> torch.Tensor:
        loss = F.cross_entropy(method.model(x), y)
        loss.backward()
        return loss.detach()

    method.zero_grad()
    return float(method.step(backward, StepTimes()) or 0.0)


def memory_part(args: Any, info: dict[str, str], started: float) -> None:
    ranks: list[dict[str, Any]] = [{} for _ in range(WORLD)]
    for name in ("data", "model"):
        for rank, result in enumerate(
            run_spawned(_memory_on_rank, WORLD, args, name, timeout_s=900)
        ):
            ranks[rank].update(result)
    budget = args.budget_mib * 2**20
    params = _parameters(args.memory_hidden)
    lines = [
        f"Wide MLP 784 -> {args.memory_hidden} x 3 -> 10 ({params / 1e6:.1f}M parameters), "
        f"momentum SGD, global batch {args.memory_batch}, {args.memory_steps} steps, {WORLD} "
        f"ranks; a stated budget of {args.budget_mib} MiB per process for the training state "
        "(weights + gradients + momentum, counted after the steps). Each layout runs in its own "
        "processes; peak RSS is a process's whole (torch and the batch included).",
        "",
        "| layout | training state per rank | fits the budget | peak RSS per rank | "
        "s per step | loss, first -> last step |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("data", "model"):
        cells = [rank[name] for rank in ranks]
        state = max(c["state_bytes"] for c in cells)
        rss = max(c["peak_rss"] for c in cells)
        losses = cells[0]["losses"]
        lines.append(
            f"| {name} (K={1 if name == 'data' else WORLD}) | {state / 2**20:.0f} MiB | "
            f"{'yes' if state <= budget else 'NO'} | {rss / 2**20:.0f} MiB | "
            f"{statistics.mean(c['step_s'] for c in cells):.2f} | "
            f"{losses[0]:.3f} -> {losses[-1]:.3f} |"
        )
    figure = Figure(figsize=(6, 3.6))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    names = ["data (K=1)", f"model (K={WORLD})"]
    values = [max(r[n]["state_bytes"] for r in ranks) / 2**20 for n in ("data", "model")]
    ax.bar(names, values, color=["tab:blue", "tab:orange"])
    ax.axhline(args.budget_mib, color="black", linestyle="--", label="budget per process")
    ax.set_ylabel("training state per rank (MiB)")
    ax.set_title(f"Wide MLP, {params / 1e6:.0f}M parameters")
    ax.legend()
    figure.tight_layout()
    write_part_result(
        "Model parallelism under a per-process memory budget",
        "model_parallel_memory",
        lines,
        figure,
        info,
        started,
    )


def _parameters(hidden: int) -> int:
    return 784 * hidden + 2 * hidden * hidden + hidden * 10 + 3 * hidden + 10


def _predicted_comm_s(k: int, batch: int, hidden: int, links: Links) -> float:
    """The alpha-beta time of one step's collectives (ring all-reduces) for a layout: the
    gradients in sync-sgd's 1 MiB buckets over the data-parallel group, the activations of the
    column -> row pairs over the model group."""
    per_group = batch // (WORLD // k)
    total = 0.0
    if k < WORLD:  # gradients of this rank's slices over the data-parallel group
        grad_bytes = 4 * _parameters(hidden) / k
        full, rest = divmod(grad_bytes, 2**20)
        total += int(full) * all_reduce_time("ring", WORLD // k, 2**20, links)
        total += all_reduce_time("ring", WORLD // k, rest, links) if rest else 0.0
    if k > 1:  # forward: fc2's and out's partial sums; backward: fc3's input gradient
        for width in (hidden, 10, hidden):
            total += all_reduce_time("ring", k, 4 * per_group * width, links)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batches", default="32,256,2048")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--part", choices=("layouts", "memory"), default="layouts")
    parser.add_argument("--memory-hidden", type=int, default=4096)
    parser.add_argument("--memory-batch", type=int, default=64)
    parser.add_argument("--memory-steps", type=int, default=4)
    parser.add_argument("--budget-mib", type=int, default=256)
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    started = time.perf_counter()
    info = machine()
    if args.part == "memory":
        memory_part(args, info, started)
        return
    ranks = run_spawned(_on_rank, WORLD, args, timeout_s=600)
    links = links_of(load_profile("vm-2cores"))
    params = _parameters(args.hidden)
    # activations all-reduced per sample in a model group: fc2 and out forward, fc3 backward
    per_sample = 4 * (2 * args.hidden + 10)
    lines = [
        f"Wide MLP 784 -> {args.hidden} -> {args.hidden} -> {args.hidden} -> 10 "
        f"({params / 1e6:.2f}M parameters, {4 * params / 2**20:.1f} MiB), sync-sgd, {WORLD} "
        f"ranks; {args.steps} timed steps after {args.warmup} warm-up, {args.repeats} rounds, "
        "layouts interleaved. Step time: median over all rounds' steps of the slowest rank "
        "(range of the rounds' medians). Bytes per step per rank. Predicted communication: "
        "ring all-reduces priced with the vm-2cores profile (alpha "
        f"{links.a * 1e3:.2f} ms, beta {links.b * 1e9:.3f} ns/B).",
        "",
        "| layout | K | global batch | step (ms) | range | handed to collectives | sent (ring) "
        "| predicted comm (ms) | parameters per rank |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    table: dict[str, dict[int, float]] = {}
    for batch in args.batches:
        for name, k in LAYOUTS.items():
            cells = [rank[f"{name}/{batch}"] for rank in ranks]
            rounds = len(cells[0])
            medians = [max(cells[r][i]["step_s"] for r in range(WORLD)) for i in range(rounds)]
            median = statistics.median(medians)
            table.setdefault(name, {})[batch] = median
            first = cells[0][0]
            predicted = _predicted_comm_s(k, batch, args.hidden, links)
            lines.append(
                f"| {name} | {k} | {batch} | {median * 1e3:.1f} | "
                f"{min(medians) * 1e3:.1f}-{max(medians) * 1e3:.1f} | "
                f"{first['handed_bytes'] / 2**20:.2f} MiB | {first['sent_bytes'] / 2**20:.2f} MiB "
                f"| {predicted * 1e3:.1f} | {first['param_bytes'] / 2**20:.1f} MiB |"
            )
    by_bytes = 4 * params / per_sample
    # model parallelism's communication grows with the batch, data parallelism's does not
    by_time = next(
        (
            b
            for b in range(WORLD, 1 << 20, WORLD)
            if _predicted_comm_s(WORLD, b, args.hidden, links)
            >= _predicted_comm_s(1, b, args.hidden, links)
        ),
        None,
    )
    if by_time == WORLD:
        time_text = (
            "model parallelism's communication is never the cheaper here (the latencies of its "
            "all-reduces alone cost more than the gradients' all-reduces)"
        )
    else:
        time_text = (
            f"model parallelism's communication is the cheaper below a global batch of {by_time}"
        )
    lines += [
        "",
        f"Predicted crossover. Bytes: a model group of {WORLD} all-reduces {per_sample} bytes of "
        f"activations per sample, data parallelism {4 * params} bytes of gradients per step: "
        f"equal at a global batch of about {by_bytes:.0f}. Time (alpha-beta, the layouts' "
        f"collectives as above): {time_text}.",
    ]
    faster = [b for b in args.batches if table["model"][b] < table["data"][b]]
    lines.append(
        "Measured: model parallelism's step is faster than data parallelism's at global batch "
        + (", ".join(str(b) for b in faster) if faster else "none of those run")
        + " (computation included: on this VM's 2 cores the 4 ranks share the cores)."
    )
    figure = Figure(figsize=(7, 4.2))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    for name, values in table.items():
        batches = sorted(values)
        ax.plot(batches, [values[b] * 1e3 for b in batches], marker="o", label=name)
    ax.axvline(by_bytes, color="gray", linestyle=":", label="predicted crossover (bytes)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("global batch")
    ax.set_ylabel("time per step (ms, median)")
    ax.set_title(f"Wide MLP (H={args.hidden}), sync-sgd on {WORLD} ranks")
    ax.legend()
    figure.tight_layout()
    write_part_result(
        "Data vs model parallelism: a wide MLP", "model_parallel", lines, figure, info, started
    )


if __name__ == "__main__":
    main()
