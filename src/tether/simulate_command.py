"""``tether simulate``: the discrete-event simulation of the methods with a server or shared
weights (:mod:`tether.perf.simulator`, through :func:`tether.api.perf.simulate`), from the
command line: its options in ms, and its outputs, ``OUT/simulate.json`` and ``staleness.png``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tether import perf_inputs
from tether.perf.run_setup import (
    SIMULATED_MESSAGE_S,
    SIMULATED_ROUNDS,
    SIMULATED_SERVICE_S,
    SIMULATED_STEP_S,
)
from tether.run_names import run_stamp
from tether.spelling import as_dashed
from tether.words import counted


def cmd_simulate(args: argparse.Namespace) -> int:
    from tether.api.perf import method_tau, simulate, warn_tau_unused
    from tether.observe.files import atomic_write_json
    from tether.observe.perf_plots import plot_staleness

    perf_inputs.check_simulate_options(args)
    warn_tau_unused(args.tau, [args.method], spell=as_dashed)
    out = Path(args.out) if args.out else Path("runs") / f"simulate-{run_stamp()}"
    perf_inputs.check_out_dir(out)
    result = simulate(
        args.method,
        args.workers,
        args.rounds,
        args.step_ms / 1e3,
        heterogeneity=args.heterogeneity,
        jitter=args.jitter,
        straggler_probability=args.straggler_probability,
        straggler_slowdown=args.straggler_slowdown,
        message_s=args.message_ms / 1e3,
        service_s=args.service_ms / 1e3,
        tau=method_tau(args.method, args.tau),
        seed=args.seed,
        worker_factors=perf_inputs.worker_factors(args.slow_workers, args.workers),
    )
    data = result.to_dict()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "simulate.json", data)
    plot_staleness(
        result.staleness,
        out / "staleness.png",
        title=f"{args.method}, {counted(args.workers, 'simulated worker')}",
    )
    print(
        f"{args.method}: {counted(args.workers, 'worker')} x {counted(args.rounds, 'round')} in "
        f"{result.elapsed_s:.3f} simulated s; {result.throughput_steps_s:.1f} steps/s, server "
        f"utilisation {result.server_utilisation:.1%}, mean staleness {result.mean_staleness:.2f}"
    )
    print(f"tether: wrote {out / 'simulate.json'} and {out / 'staleness.png'}", file=sys.stderr)
    return 0


def add_simulate_parser(sub: Any) -> None:
    """``tether simulate`` on the ``tether`` parser."""
    simulate = sub.add_parser(
        "simulate",
        help="simulate asynchronous and round-robin methods with stragglers",
        description="Discrete-event simulation of workers and a parameter server: throughput, "
        "staleness distribution, server utilisation. Writes OUT/simulate.json and "
        "staleness.png.",
    )
    simulate.add_argument(
        "--method", default="async-sgd", help="a server or Hogwild method (default async-sgd)"
    )
    simulate.add_argument("--workers", type=int, default=64, help="simulated workers (64)")
    rounds, step_ms, message_ms, service_ms = (
        SIMULATED_ROUNDS,
        SIMULATED_STEP_S * 1e3,
        SIMULATED_MESSAGE_S * 1e3,
        SIMULATED_SERVICE_S * 1e3,
    )  # tether.simulate's defaults, in ms
    simulate.add_argument(
        "--rounds", type=int, default=rounds, help=f"exchanges per worker ({rounds})"
    )
    simulate.add_argument(
        "--step-ms", type=float, default=step_ms, help=f"mean local step, ms ({step_ms:g})"
    )
    simulate.add_argument(
        "--message-ms", type=float, default=message_ms, help=f"one message, ms ({message_ms:g})"
    )
    simulate.add_argument(
        "--service-ms",
        type=float,
        default=service_ms,
        help=f"the server's work per exchange, ms ({service_ms:g})",
    )
    simulate.add_argument("--tau", type=int, help="local steps per exchange (method's default)")
    simulate.add_argument(
        "--heterogeneity", type=float, default=0.0, help="workers' speed spread, sigma (0)"
    )
    simulate.add_argument("--jitter", type=float, default=0.0, help="per-step spread, sigma (0)")
    simulate.add_argument(
        "--straggler-probability", type=float, default=0.0, help="a step straggles (0)"
    )
    simulate.add_argument(
        "--straggler-slowdown", type=float, default=1.0, help="a straggling step x slower (1)"
    )
    simulate.add_argument(
        "--slow-workers",
        metavar="N:F",
        type=perf_inputs.slow_workers,
        help="the first N workers F times slower, e.g. 1:4 (default none)",
    )
    simulate.add_argument("--seed", type=int, default=0, help="(0)")
    simulate.add_argument("--out", metavar="DIR", help="default runs/simulate-TIME")
    simulate.set_defaults(func=cmd_simulate)
