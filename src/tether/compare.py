"""``tether compare``: run several training methods on the same job, one after another, and compare.

Every method gets the same model, data, worker count, run length and seed, and the same batch
unless a method's defaults hold its global batch (those whose workers step on their own batch,
beyond 2 workers; each row shows the batch it ran with). Each runs as a normal ``tether
train`` run in ``OUT/<method>/``. A method whose run fails is recorded as failed and the
comparison goes on. ``OUT`` then holds ``compare.json`` (the rows and shared settings),
``compare.md`` (the table) and ``compare.png`` (accuracy against time, and the time split).
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tether.config import TrainConfig
from tether.config_sources import apply_overrides
from tether.errors import TetherError, WorkerFailure
from tether.observe.compare import (
    DEFAULT_TARGET,
    Row,
    failed_row,
    markdown_table,
    row_from_summary,
    settings_line,
    write_comparison,
)
from tether.observe.plots import plot_comparison
from tether.train_options import as_flag


def parse_methods(text: str | None) -> list[str]:
    """Method names from ``--methods a,b,c`` (all registered methods when not given).

    Every name is checked before anything runs; unknown names are one TetherError that lists the
    valid ones.
    """
    from tether.methods import METHODS

    valid = METHODS.names()
    if text is None:
        return valid
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise TetherError(f"--methods is empty; valid methods: {', '.join(valid)}")
    unknown = [name for name in names if name not in METHODS]
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        raise TetherError(
            f"unknown method{plural} {', '.join(map(repr, unknown))}; "
            f"valid methods: {', '.join(valid)}"
        )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise TetherError(f"--methods names {', '.join(repeated)} more than once")
    return names


def shared_settings(config: TrainConfig, target: float, target_is_default: bool) -> dict[str, Any]:
    """What every method in the comparison shares (written to compare.json and compare.md)."""
    return {
        "model": config.model,
        "dataset": config.dataset,
        "workers": config.workers,
        "model_parallel": config.model_parallel,
        "batch_size": config.batch_size,
        "epochs": config.epochs if config.steps is None else None,  # steps, where set, rule
        "steps": config.steps,
        "seed": config.seed,
        "backend": config.backend,
        "target_accuracy": target,
        "target_is_default": target_is_default,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def run_one(config: TrainConfig, method: str, run_dir: Path, target: float) -> Row:
    """Train ``method`` as a normal run in ``run_dir``; a failure becomes a failed row."""
    from tether.runner import launch_training

    start = time.perf_counter()
    try:
        method_config = apply_overrides(config, {"method": method, "out": str(run_dir)})
        method_config.validate()
        launch_training(method_config)
        summary_path = run_dir / "summary.json"
        if not summary_path.exists():
            raise TetherError(f"the run finished without writing {summary_path}")
        row = row_from_summary(json.loads(summary_path.read_text()), target, run_dir)
    except (WorkerFailure, TetherError) as exc:
        row = failed_row(method, str(exc), run_dir)
    row["elapsed_s"] = time.perf_counter() - start  # start-up included
    return row


def run_comparison(
    config: TrainConfig,
    methods: Sequence[str],
    config_for: Callable[[str], TrainConfig] | None = None,
    overwrite: bool = False,
) -> int:
    """Run ``methods`` one after another on ``config``'s job and write the comparison to
    ``config.out``. ``config_for(method)`` gives each method's config (the user's options over
    that method's own tuned defaults); without it every method runs ``config``.
    Returns 0 if at least one method succeeded; raises WorkerFailure otherwise.
    """
    from tether.catalog import check_data, check_global_batch, check_launch
    from tether.methods import METHODS
    from tether.training.objective import REGRESSION_LOSSES
    from tether.training.run_dir import prepare_run_dir

    assert config.out is not None
    out = Path(config.out)
    # The table and the plot are of test accuracy (time to a target accuracy, the final one)
    if config.target is not None:
        raise TetherError(
            f"tether compare times every method to a test accuracy: give --target-accuracy, "
            f"not --target {config.target} (that is tether train's)"
        )
    if config.loss in REGRESSION_LOSSES:  # its runs would all end with no accuracy to show
        raise TetherError(
            f"tether compare compares test accuracy, which a regression (--loss {config.loss}) "
            "does not have: run tether train for each method (--target 'loss<=0.3' times it)"
        )
    if config.metrics and "accuracy" not in config.metrics:
        raise TetherError(
            "tether compare compares test accuracy: add --metric accuracy to the metrics"
        )
    # Each method's own config (its defaults may hold the batch, or add a server process), made
    # once: missing or corrupt data, a global batch the data cannot fill, a launch this machine
    # cannot make, and an --out that holds something fail here, in one line, before any run.
    own = {m: config_for(m) if config_for is not None else config for m in methods}
    samples = check_data(config)
    for method, method_config in own.items():
        if samples is not None:
            check_global_batch(method_config, samples)
        check_launch(apply_overrides(method_config, {"method": method}), spell=as_flag)
    prepare_run_dir(config, overwrite)
    target_is_default = config.target_accuracy is None
    target = DEFAULT_TARGET if config.target_accuracy is None else config.target_accuracy
    # Every run times itself against the same target, so its own summary agrees with the table.
    config = apply_overrides(config, {"target_accuracy": target})

    rows: list[Row] = []
    for index, method in enumerate(methods, 1):
        servers = METHODS.get(method).server_processes if method in METHODS else 0
        print(
            f"[{index}/{len(methods)}] {method} on {config.workers} workers "
            f"({config.workers + servers} processes) -> {out / method}",
            file=sys.stderr,
            flush=True,
        )
        base = apply_overrides(own[method], {"target_accuracy": target})
        row = run_one(base, method, out / method, target)
        if row["status"] != "ok":
            print(f"tether: {method} failed: {row['error']}", file=sys.stderr, flush=True)
        rows.append(row)

    settings = shared_settings(config, target, target_is_default)
    # A method may hold its global batch: a batch is shared only when every method had it (what
    # a run recorded, else what its config gave it)
    batches = {
        (row.get("settings") or {}).get("batch_size", own[row["method"]].batch_size) for row in rows
    }
    settings["batch_size"] = batches.pop() if len(batches) == 1 else None
    png = plot_comparison(
        rows,
        out / "compare.png",
        title=f"{config.model} / {config.dataset}, {config.workers} workers: "
        f"{len(methods)} method{'s' if len(methods) != 1 else ''}",
        target=target,
    )
    json_path, md_path = write_comparison(out, rows, settings, figure=png.name)
    print(settings_line(settings))
    print()
    print(markdown_table(rows, target))
    print()
    print(f"comparison: {md_path}, {json_path}, {png}")
    print(f"run directories: {out}/<method>/")
    failed = [row["method"] for row in rows if row["status"] != "ok"]
    if len(failed) == len(rows):
        which = f"all {len(rows)} methods" if len(rows) > 1 else rows[0]["method"]
        raise WorkerFailure(f"{which} failed, nothing to compare (see {md_path})", [])
    return 0
