"""Settings the run will not use: one warning for each key the user set that the chosen method
(or the user's own optimizer, schedule or loss) ignores, e.g. ``--momentum`` with sync-easgd,
whose workers take plain SGD steps as in SC17, or a warm-up given with a schedule of one's own.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

from tether.config import TrainConfig
from tether.config_sources import OWN_OPTIMIZER_KEYS, OWN_SCHEDULE_KEYS
from tether.data.registry import DATASETS
from tether.imports import is_import_path
from tether.methods import METHOD_SETTINGS, METHODS
from tether.optim.schedules import epoch_warmup, warmup_length
from tether.spelling import Spell, as_keyword
from tether.training.build import known_run_length, uses_momentum

# the settings of scaling the rate with the batch, which only a base batch turns on
_SCALING_KEYS = ("lr_scaling", "lr_scale_max", "lr_batch")


class IgnoredSettingWarning(UserWarning):
    """A setting that has no effect with the chosen method (or components)."""


class LongWarmupWarning(UserWarning):
    """A warm-up as long as the run: the rate never reaches the one asked for."""


_MOMENTUM_HINT = {
    "sync-easgd": "its workers take plain SGD steps, as in the paper",
    "original-easgd": "its workers take plain SGD steps, as in the paper",
    "async-easgd": "its workers take plain SGD steps, as in the paper",
    "hogwild-easgd": "its workers take plain SGD steps, as in the paper",
    "hogwild-sgd": "its workers take plain SGD steps",
    "async-sgd": "its server applies plain SGD; async-msgd keeps momentum on the server",
}


# the named optimizers whose rate is on another scale than the methods' SGD defaults, with what
# the large-batch benchmark took (LeNet-5 with batch norm, Fashion-MNIST, 30 epochs)
RATE_OF_THEIR_OWN = {
    "lars": "16-32",
    "lamb": "0.064-0.128",
}


def own_component_keys(config: TrainConfig, supplied: Iterable[str] = ()) -> set[str]:
    """The settings a user's own optimizer or schedule (``supplied`` as an object, or an import
    path in ``config``) sets for itself: the config's values for them go unused."""
    keys: set[str] = set()
    if "optimizer" in supplied or is_import_path(config.optimizer):
        keys.update(OWN_OPTIMIZER_KEYS)
    if "lr_schedule" in supplied or is_import_path(config.lr_schedule):
        keys.update(OWN_SCHEDULE_KEYS)
    return keys


def ignored_settings(
    config: TrainConfig,
    given: Iterable[str],
    supplied: Iterable[str] = (),
    spell: Spell = as_keyword,
) -> list[str]:
    """One message per setting in ``given`` (keys the user set) that the run will not use.
    ``supplied``: the components that are the user's own objects (``optimizer``,
    ``lr_schedule``, ``loss``), which take none of the settings of the named ones. ``spell``
    names a setting to change as the reader writes it (a keyword, or a flag on the command
    line)."""
    method = METHODS.get(config.method)
    messages = []
    optimizer_named = config.optimizer != "auto"
    own = {
        key
        for key in ("optimizer", "lr_schedule", "loss")
        if key in supplied or is_import_path(getattr(config, key))
    }
    for key in sorted(set(given)):
        if key in OWN_OPTIMIZER_KEYS and "optimizer" in own:
            messages.append(f"{key} has no effect: your own optimizer sets its own")
        elif key in OWN_SCHEDULE_KEYS and "lr_schedule" in own:
            messages.append(
                f"{key} has no effect: your own schedule (lr_schedule) is the whole one"
            )
        elif key == "momentum":
            if not uses_momentum(config):
                why = (
                    f"the {config.optimizer} optimizer has no momentum setting"
                    if optimizer_named
                    else _MOMENTUM_HINT.get(config.method, "it does not use momentum")
                )
                messages.append(
                    f"{config.method} ignores momentum: {why} ({spell('optimizer', 'sgd')} uses it)"
                    if not optimizer_named
                    else f"momentum has no effect: {why}"
                )
        elif key == "nesterov" and config.optimizer != "sgd":
            messages.append(f"nesterov applies to {spell('optimizer', 'sgd')} only")
        elif key in METHOD_SETTINGS and key not in method.settings:
            users = [n for n in METHODS if key in METHODS.get(n).settings]
            messages.append(f"{config.method} ignores {key} (it applies to {', '.join(users)})")
        elif key == "label_smoothing" and (config.loss != "cross-entropy" or "loss" in own):
            messages.append("label_smoothing applies to the named loss cross-entropy only")
        elif key in ("lr_decay_every", "lr_decay") and config.lr_schedule != "step":
            messages.append(f"{key} applies to {spell('lr_schedule', 'step')} only")
        elif key == "lr_decay_power" and config.lr_schedule != "poly":
            messages.append(f"lr_decay_power applies to {spell('lr_schedule', 'poly')} only")
        elif key == "lars_eta" and config.optimizer != "lars":
            messages.append(f"lars_eta applies to {spell('optimizer', 'lars')} only")
        elif key == "trust_exclude" and config.optimizer not in ("lars", "lamb"):
            messages.append(
                f"trust_exclude applies to {spell('optimizer', 'lars')} or "
                f"{spell('optimizer', 'lamb')} only"
            )
        elif key == "parallel_plan" and config.model_parallel == 1:
            messages.append("parallel_plan applies with model_parallel > 1 only")
        elif key in _SCALING_KEYS and not config.lr_base_batch:
            messages.append(
                f"{key} has no effect without {spell('lr_base_batch')} (the batch lr was tuned "
                "at; giving lr alone drops the method's scaling)"
            )
        elif key == "lr_scale_max" and not config.lr_scaling.endswith("-capped"):
            messages.append(
                f"lr_scale_max applies to {spell('lr_scaling', 'linear-capped')} or "
                "sqrt-capped only"
            )
        elif key.startswith("loss_scale") and config.precision != "fp16":
            messages.append(f"{key} applies to {spell('precision', 'fp16')} only")
        elif key == "ranks_per_node" and not _uses_nodes(config):
            messages.append(
                f"ranks_per_node has no effect on {config.method} with {spell('allreduce', config.allreduce)}: "
                f"it sizes the nodes of {spell('allreduce', 'hierarchical')} (or auto), "
                "two-level-easgd and lr_batch node"
            )
        elif key == "loader_workers" and config.dataset in DATASETS:
            messages.append(
                f"loader_workers has no effect on {config.dataset}: a built-in data set is "
                "in-memory tensors, indexed without a DataLoader (it applies to your own)"
            )
    rate_given = "lr" in set(given) or bool(config.resume)  # a resumed run's rate is its own
    if config.optimizer in RATE_OF_THEIR_OWN and not rate_given and "optimizer" not in own:
        # Not ignored but unsuited: the method's default rate is tuned for its SGD step, two
        # orders of magnitude off for LARS (eta scales it) and one for LAMB.
        messages.append(
            f"{spell('optimizer', config.optimizer)} takes {config.method}'s default rate "
            f"{config.scaled_lr:g}, tuned for SGD: give {spell('lr')} (the large-batch "
            f"benchmark's best were {RATE_OF_THEIR_OWN[config.optimizer]} at batches 4096-16384, "
            "docs/large_batch.md)"
        )
    return messages


def warn_ignored(
    config: TrainConfig,
    given: Iterable[str],
    stacklevel: int = 2,
    supplied: Iterable[str] = (),
    spell: Spell = as_keyword,
) -> None:
    for message in ignored_settings(config, given, supplied, spell):
        warnings.warn(message, IgnoredSettingWarning, stacklevel=stacklevel + 1)


def long_warmup(
    config: TrainConfig, samples: int, supplied: Iterable[str] = (), spell: Spell = as_keyword
) -> str | None:
    """A message when the named schedule's warm-up is not shorter than the run of ``samples``
    training samples: the rate then rises for the whole run and never reaches ``lr`` (Goyal et
    al. 2017 warm up for 5 of 90 epochs). Only ``warmup_steps`` can do this: the part given in
    epochs is cut to a quarter of the run (:func:`~tether.optim.schedules.warmup_length`)."""
    if not config.warmup_steps or "lr_schedule" in supplied or is_import_path(config.lr_schedule):
        return None
    length = known_run_length(config, samples)
    if length is None:
        return None
    total, per_epoch = length
    warmup = warmup_length(config.warmup_steps, config.warmup_epochs, total, per_epoch)
    if warmup < total:
        return None
    return (
        f"the warm-up ({warmup} steps) is not shorter than the run ({total} steps): the rate "
        f"rises for the whole run and ends at {total / warmup:.0%} of lr; lower "
        f"{spell('warmup_steps')}"
    )


def cut_warmup(
    config: TrainConfig, samples: int, supplied: Iterable[str] = (), spell: Spell = as_keyword
) -> str | None:
    """A message when a warm-up the user gave in epochs is cut to a quarter of the run
    (:func:`~tether.optim.schedules.warmup_length`: the cut is there for the methods' default
    half epoch, so that a short run still trains; a user's own was cut without a word)."""
    own = config.warmup_epochs != METHODS.get(config.method).defaults.get("warmup_epochs", 0.0)
    if not own or "lr_schedule" in supplied or is_import_path(config.lr_schedule):
        return None
    length = known_run_length(config, samples)
    if length is None:
        return None
    total, per_epoch = length
    asked, taken = epoch_warmup(config.warmup_epochs, total, per_epoch)
    if asked <= taken:
        return None
    return (
        f"{spell('warmup_epochs', config.warmup_epochs)} ({asked} steps) is cut to a quarter of "
        f"the run ({taken} of {total} steps); give it in {spell('warmup_steps')} to take "
        "it as it is"
    )


def warn_long_warmup(
    config: TrainConfig,
    samples: int,
    supplied: Iterable[str] = (),
    stacklevel: int = 2,
    spell: Spell = as_keyword,
) -> None:
    """Warn of a warm-up as long as the run, or of one given in epochs that was cut."""
    for message in (
        long_warmup(config, samples, supplied, spell),
        cut_warmup(config, samples, supplied, spell),
    ):
        if message:
            warnings.warn(message, LongWarmupWarning, stacklevel=stacklevel + 1)


def _uses_nodes(config: TrainConfig) -> bool:
    """Whether the run has nodes for ``ranks_per_node`` to size: two-level-easgd's, the
    hierarchical all-reduce's (auto's calibration's), a rate scaled with the node's batch, the
    model groups that share a node."""
    return (
        config.method == "two-level-easgd"
        or config.allreduce in ("hierarchical", "auto")
        or config.lr_batch == "node"
        or config.model_parallel > 1
    )
