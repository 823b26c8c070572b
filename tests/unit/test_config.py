"""Config: defaults, TOML files, --set parsing, type checks and validation messages."""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch

from tether.catalog import check_names, method_defaults
from tether.catalog import resolve_config as catalog_resolve
from tether.config import TrainConfig
from tether.config_sources import apply_overrides, load_toml, parse_set_options, resolve_config
from tether.errors import TetherError
from tether.ignored_settings import (
    IgnoredSettingWarning,
    cut_warmup,
    ignored_settings,
    long_warmup,
)
from tether.methods import METHODS
from tether.methods.default_rates import damped_step, describe_rate
from tether.targets import Target, parse_target, target_text
from tether.train_options import as_flag


def test_defaults_validate_and_round_trip_through_toml() -> None:
    config = TrainConfig().validate()
    again = apply_overrides(TrainConfig(), tomllib.loads(config.to_toml()))
    assert again == config
    assert config.global_batch_size == config.batch_size * config.workers


def test_set_options_parse_toml_values_and_bare_words() -> None:
    values = parse_set_options(["lr=0.1", "method=sync-sgd", 'data_dir="/x y"', "steps = 7"])
    assert values == {"lr": 0.1, "method": "sync-sgd", "data_dir": "/x y", "steps": 7}
    with pytest.raises(TetherError, match="key=value"):
        parse_set_options(["lr"])


def test_overrides_check_keys_and_types() -> None:
    config = apply_overrides(TrainConfig(), {"lr": 1, "target_accuracy": 0.5})
    assert config.lr == 1.0 and isinstance(config.lr, float)
    with pytest.raises(
        TetherError,
        match=r"unknown config key 'lrr' \(did you mean 'lr'\?\); every key: docs/options.md$",
    ):
        apply_overrides(TrainConfig(), {"lrr": 0.1})
    with pytest.raises(TetherError, match="'workers' must be int"):
        apply_overrides(TrainConfig(), {"workers": "two"})
    with pytest.raises(TetherError, match="'workers' must be int"):
        apply_overrides(TrainConfig(), {"workers": True})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"workers": 0}, "workers must be >= 1"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"lr": 0.0}, "lr must be > 0"),
        ({"lr": -1.0}, "lr must be > 0"),
        ({"momentum": 1.0}, "momentum must be in"),
        ({"bucket_mb": -1.0}, "bucket_mb must be >= 0"),
        ({"target_accuracy": 88.0}, "write 0.88"),
        ({"backend": "mpi"}, "backend must be auto, gloo or nccl, got 'mpi'"),
        ({"precision": "fp8"}, "precision must be fp32, bf16 or fp16, got 'fp8'"),
        ({"trust_exclude": "biases"}, "trust_exclude must be bias-norm or none, got 'biases'"),
        ({"target": "accuracy=0.9"}, "target must look like"),
        ({"target": "accuracy>=0.9", "target_accuracy": 0.9}, "not both"),
        ({"accumulate": 0}, "accumulate must be >= 1"),
        ({"lr_decay": 0.0}, "lr_decay must be in"),
    ],
)
def test_validation_messages(change: dict, message: str) -> None:
    with pytest.raises(TetherError, match=message):
        dataclasses.replace(TrainConfig(), **change).validate()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"method": "nope"}, "unknown method .nope.; valid methods: .*sync-sgd"),
        ({"model": "nope"}, "valid models: .*lenet5"),
        ({"dataset": "nope"}, "valid datasets: .*fashion-mnist"),
        ({"loss": "nope"}, "valid losses: .*cross-entropy"),
        ({"optimizer": "nope"}, "valid optimizers: .*adamw"),
        ({"lr_schedule": "nope"}, "cosine"),
        ({"metrics": ("nope",)}, "valid metrics: .*accuracy"),
        # each name once ("auto" was listed twice)
        (
            {"allreduce": "nope"},
            "allreduce 'nope' is no collective; the all-reduce algorithms: naive, ring, .*auto$",
        ),
        # a collective of `tether list` that has no all-reduce was "unknown"
        ({"allreduce": "chain"}, "^allreduce 'chain' has no all-reduce; the all-reduce algorithms"),
        ({"model": "no_such_module_x:Net"}, "no module named 'no_such_module_x'"),
        ({"loss": "tether.metrics:nothing"}, "has no attribute 'nothing'"),
        # before the workers start (it failed in them: three lines, status 1; found by a user)
        (
            {"method": "async-measgd", "precision": "fp16"},
            "^async-measgd's look-ahead Nesterov step .* fp16's loss scale cannot be checked: "
            "use --precision bf16 \\(precision='bf16' in Python\\), or --optimizer sgd "
            "\\(optimizer='sgd' in Python\\)$",
        ),
    ],
)
def test_names_are_checked_by_the_catalog(change: dict, message: str) -> None:
    with pytest.raises(TetherError, match=message):
        check_names(dataclasses.replace(TrainConfig(), **change))


def test_targets_parse_with_a_direction() -> None:
    assert parse_target("accuracy>=0.88") == Target("accuracy", True, 0.88)
    assert parse_target(" loss < 0.3 ").reached(0.29)
    assert not parse_target("loss<=0.3").reached(0.31)
    assert target_text("loss", 0.3) == "loss<=0.3"
    assert target_text("accuracy", 0.9) == "accuracy>=0.9"
    assert TrainConfig(target_accuracy=0.5).target_spec == Target("accuracy", True, 0.5)


def test_method_defaults_apply_under_the_file_and_the_overrides(tmp_path: Path) -> None:
    assert catalog_resolve(None, {"method": "sync-easgd"}).lr == 0.4  # its tuned default
    assert catalog_resolve(None, {"method": "sync-easgd", "lr": 0.1}).lr == 0.1
    file = tmp_path / "run.toml"
    file.write_text('method = "local-sgd"\n')
    assert catalog_resolve(file, {}).tau == 4


def test_a_warm_up_as_long_as_the_run_is_named() -> None:
    """The rate would rise for the whole run and never reach lr: said with the run's length
    (1000 samples, 2 workers x 10 x accumulate 2: 25 steps an epoch, 2 epochs)."""
    config = TrainConfig(method="sync-sgd", workers=2, batch_size=10, accumulate=2, epochs=2)
    too_long = dataclasses.replace(config, warmup_steps=50)
    assert long_warmup(too_long, 1000) == (
        "the warm-up (50 steps) is not shorter than the run (50 steps): the rate rises for the "
        "whole run and ends at 100% of lr; lower warmup_steps"
    )  # as tether.fit takes it; on the command line, the flag
    assert str(long_warmup(too_long, 1000, spell=as_flag)).endswith("lower --warmup-steps")
    # the part in epochs counts, cut to a quarter of the run as the schedule cuts it
    both = dataclasses.replace(config, warmup_steps=40, warmup_epochs=5.0)
    assert "the warm-up (52 steps)" in str(long_warmup(both, 1000))
    assert "ends at 50% of lr" in str(long_warmup(dataclasses.replace(too_long, steps=25), 1000))
    assert long_warmup(dataclasses.replace(config, warmup_steps=49), 1000) is None
    assert long_warmup(dataclasses.replace(config, warmup_epochs=8.0), 1000) is None
    # the user's own schedule is the whole schedule: warmup_steps is not used (said elsewhere)
    assert long_warmup(too_long, 1000, supplied=["lr_schedule"]) is None


def test_a_warm_up_in_epochs_cut_to_a_quarter_of_the_run_is_named() -> None:
    """warmup_epochs=2 in a run of 40 steps warmed up over 10 steps without a word; the
    method's own half epoch is cut as designed (a short run still trains)."""
    config = TrainConfig(method="sync-sgd", workers=2, batch_size=10, steps=40)  # 50 an epoch
    assert cut_warmup(dataclasses.replace(config, warmup_epochs=2.0), 1000, spell=as_flag) == (
        "--warmup-epochs 2.0 (100 steps) is cut to a quarter of the run (10 of 40 steps); give "
        "it in --warmup-steps to take it as it is"
    )
    assert cut_warmup(dataclasses.replace(config, warmup_epochs=0.5), 1000) is None  # default
    assert cut_warmup(dataclasses.replace(config, warmup_epochs=0.2), 1000) is None  # fits
    own = dataclasses.replace(config, warmup_epochs=2.0)
    assert cut_warmup(own, 1000, supplied=["lr_schedule"]) is None


def test_rate_scaling_and_loss_scale_settings_that_do_nothing_are_named() -> None:
    # each was taken without a word: no base batch (lr given alone drops the method's), no cap
    # to set, no fp16 to scale
    plain = TrainConfig(method="sync-easgd", lr=0.1, lr_scaling="sqrt")
    (said,) = ignored_settings(plain, {"lr", "lr_scaling"})
    assert said.startswith("lr_scaling has no effect without lr_base_batch")
    uncapped = catalog_resolve(
        None, {"method": "sync-sgd", "lr_scale_max": 4.0, "lr_scaling": "linear"}
    )
    (said,) = ignored_settings(uncapped, {"lr_scale_max", "lr_scaling"})
    assert said == "lr_scale_max applies to lr_scaling='linear-capped' or sqrt-capped only"
    (said,) = ignored_settings(TrainConfig(loss_scale=1024.0), {"loss_scale"})
    assert said == "loss_scale applies to precision='fp16' only"
    assert ignored_settings(TrainConfig(precision="fp16", loss_scale=1024.0), {"loss_scale"}) == []
    used = catalog_resolve(None, {"method": "sync-sgd", "lr_scaling": "sqrt"})
    assert ignored_settings(used, {"lr_scaling"}) == []  # the method's base batch: used
    # no nodes to size: sync-sgd's ring all-reduce is flat
    flat = catalog_resolve(None, {"method": "sync-sgd", "allreduce": "ring", "ranks_per_node": 1})
    (said,) = ignored_settings(flat, {"allreduce", "ranks_per_node"})
    assert said.startswith("ranks_per_node has no effect on sync-sgd with allreduce='ring'")
    nodes = catalog_resolve(
        None, {"method": "sync-sgd", "allreduce": "hierarchical", "ranks_per_node": 1}
    )
    assert ignored_settings(nodes, {"allreduce", "ranks_per_node"}) == []
    # a built-in data set is in-memory tensors, which no DataLoader reads
    (said,) = ignored_settings(TrainConfig(loader_workers=2), {"loader_workers"})
    assert said.startswith("loader_workers has no effect on fashion-mnist")
    own = TrainConfig(loader_workers=2, dataset="mypkg.data:load")
    assert ignored_settings(own, {"loader_workers"}) == []


def test_settings_a_method_ignores_are_named() -> None:
    messages = ignored_settings(TrainConfig(method="sync-easgd"), {"momentum", "lr"})
    assert len(messages) == 1 and "sync-easgd ignores momentum" in messages[0]
    assert ignored_settings(TrainConfig(method="sync-easgd", optimizer="sgd"), {"momentum"}) == []
    (stale,) = ignored_settings(TrainConfig(method="sync-sgd"), {"staleness_bound"})
    assert "async-sgd" in stale
    assert ignored_settings(TrainConfig(method="async-msgd"), {"momentum", "staleness_bound"}) == []
    # LARS keeps a momentum: no warning that it has none
    lars = TrainConfig(method="sync-sgd", optimizer="lars")
    assert ignored_settings(lars, {"momentum", "lr", "trust_exclude"}) == []
    (exclusion,) = ignored_settings(TrainConfig(optimizer="sgd"), {"trust_exclude"})
    assert exclusion == "trust_exclude applies to optimizer='lars' or optimizer='lamb' only"
    (exclusion,) = ignored_settings(TrainConfig(optimizer="sgd"), {"trust_exclude"}, spell=as_flag)
    assert exclusion == "trust_exclude applies to --optimizer lars or --optimizer lamb only"
    # ...but without a rate of its own it would take sync-sgd's SGD default, said in one line
    (rate,) = ignored_settings(lars, {"momentum"})
    assert rate.startswith("optimizer='lars' takes sync-sgd's default rate") and "give lr " in rate
    (rate,) = ignored_settings(lars, {"momentum"}, spell=as_flag)
    assert rate.startswith("--optimizer lars takes sync-sgd's default rate") and "--lr" in rate
    (rate,) = ignored_settings(TrainConfig(method="sync-easgd", optimizer="lamb"), set())
    # a resumed run's rate comes from its saved config: the user's own, not a default
    resumed = TrainConfig(method="sync-sgd", optimizer="lars", lr=16.0, resume=True)
    assert ignored_settings(resumed, {"momentum"}) == []
    assert "optimizer='lamb' takes sync-easgd's default rate" in rate
    # the rate quoted is the one the run takes (scaled with the batch), not the reference rate
    two = catalog_resolve(overrides={"method": "sync-easgd", "optimizer": "lars", "workers": 2})
    assert two.scaled_lr != two.lr
    (rate,) = ignored_settings(two, set())
    assert f"default rate {two.scaled_lr:g}, tuned for SGD" in rate
    # the user's own optimizer and schedule take none of the named ones' settings
    own = {"lr", "momentum", "warmup_steps", "lr_decay_power"}
    messages = ignored_settings(TrainConfig(method="sync-sgd"), own, ["optimizer", "lr_schedule"])
    assert messages == [
        "lr has no effect: your own optimizer sets its own",
        "lr_decay_power has no effect: your own schedule (lr_schedule) is the whole one",
        "momentum has no effect: your own optimizer sets its own",
        "warmup_steps has no effect: your own schedule (lr_schedule) is the whole one",
    ]
    # label smoothing is the named cross-entropy's: a loss object of the user's takes none
    smoothing = ignored_settings(TrainConfig(method="sync-sgd"), {"label_smoothing"}, ["loss"])
    assert smoothing == ["label_smoothing applies to the named loss cross-entropy only"]
    assert ignored_settings(TrainConfig(method="sync-sgd"), {"label_smoothing"}) == []
    path = TrainConfig(method="sync-sgd", lr_schedule="mypkg.sched:build")
    assert ignored_settings(path, {"warmup_epochs"}) == [
        "warmup_epochs has no effect: your own schedule (lr_schedule) is the whole one"
    ]


def test_config_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(TetherError, match=r"cannot read config file .*missing\.toml"):
        load_toml(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("lr = = 1\n")
    with pytest.raises(TetherError, match=r"bad.toml is not valid TOML"):
        load_toml(bad)


def test_precedence_file_then_overrides(tmp_path: Path) -> None:
    file = tmp_path / "run.toml"
    file.write_text('lr = 0.2\nworkers = 3\nmodel = "mlp"\n')
    config = resolve_config(file, {"workers": 4})
    assert (config.lr, config.workers, config.model) == (0.2, 4, "mlp")


def test_the_linear_scaling_rule_counts_the_batch_one_update_averages_over() -> None:
    base: dict[str, Any] = {"lr": 0.1, "lr_base_batch": 256, "batch_size": 64, "workers": 8}
    assert TrainConfig(**base).scaled_lr == pytest.approx(0.2)  # all 8 batches: 512
    assert TrainConfig(**base, accumulate=2).scaled_lr == pytest.approx(0.4)
    assert TrainConfig(**base, lr_batch="worker").scaled_lr == pytest.approx(0.025)  # 64
    node = TrainConfig(**base, lr_batch="node", ranks_per_node=2)
    assert node.scaled_lr == pytest.approx(0.05)  # one node's 2 batches: 128
    assert TrainConfig(**base, lr_batch="node").scaled_lr == pytest.approx(0.2)  # one node
    assert TrainConfig(**base, model_parallel=2).scaled_lr == pytest.approx(0.1)  # 4 groups
    assert TrainConfig(lr=0.1, workers=8).scaled_lr == 0.1  # no base batch: as given
    assert TrainConfig(**base, lr_scaling="sqrt").scaled_lr == pytest.approx(0.1 * 2**0.5)
    assert TrainConfig(**{**base, "workers": 1}, lr_scaling="sqrt").scaled_lr == pytest.approx(0.05)
    below = TrainConfig(**{**base, "workers": 2}, lr_scaling="linear-capped")
    assert below.scaled_lr == pytest.approx(0.05)  # linear below the base batch
    above = TrainConfig(**base, lr_scaling="linear-capped")
    assert above.scaled_lr == pytest.approx(0.1)  # the base rate above it
    doubled = {**base, "lr_scaling": "linear-capped", "lr_scale_max": 2.0}
    assert TrainConfig(**doubled).scaled_lr == pytest.approx(0.2)  # 512: r = 2, at the cap
    assert TrainConfig(**{**doubled, "workers": 16}).scaled_lr == pytest.approx(0.2)  # r = 4
    assert TrainConfig(**{**doubled, "workers": 6}).scaled_lr == pytest.approx(0.15)  # r = 1.5
    assert TrainConfig(**base, lr_scale_max=2.0).scaled_lr == pytest.approx(0.2)  # linear: no cap
    assert TrainConfig(**{**base, "workers": 16}, lr_scale_max=2.0).scaled_lr == pytest.approx(0.4)
    with pytest.raises(TetherError, match="lr_scale_max must be > 0, got 0"):
        TrainConfig(lr_scale_max=0).validate()
    assert TrainConfig(**base, lr_scaling="sqrt-capped").scaled_lr == pytest.approx(0.1)  # r = 2
    capped_sqrt = {**base, "workers": 2, "lr_scaling": "sqrt-capped"}
    assert TrainConfig(**capped_sqrt).scaled_lr == pytest.approx(0.1 * 0.5**0.5)  # r = 1/2
    with pytest.raises(
        TetherError, match="lr_scaling must be linear, sqrt, linear-capped or sqrt-capped"
    ):
        TrainConfig(lr_scaling="log").validate()
    with pytest.raises(TetherError, match="lr_batch must be global, node or worker"):
        TrainConfig(lr_batch="rank").validate()


def test_a_rate_given_without_its_base_batch_is_taken_as_it_is() -> None:
    scaled = [m for m in METHODS.names() if method_defaults(m).get("lr_base_batch")]
    assert scaled, "the methods' default rates scale with the batch"
    for method in scaled:
        default = catalog_resolve(None, {"method": method, "workers": 8})
        assert default.lr_base_batch == method_defaults(method)["lr_base_batch"]
        given = catalog_resolve(None, {"method": method, "workers": 8, "lr": 0.05})
        assert (given.lr_base_batch, given.scaled_lr, given.warmup_epochs) == (0, 0.05, 0.0)
        assert given.clip_grad_norm is None, method  # the clip guarded the method's own rate
        both = catalog_resolve(
            None, {"method": method, "workers": 8, "lr": 0.05, "lr_base_batch": 64}
        )
        assert (both.lr_base_batch, both.lr_scaling) == (64, "linear"), method  # the user's rule


def test_all_workers_defaults_double_the_rate_at_most_and_clip_the_gradient() -> None:
    """sync-sgd, local-sgd and two-level-easgd: 0.1 at 256 samples, linear up to 512 (0.2),
    constant beyond; the gradient's norm clipped at 2 unless the user sets a clip or a rate."""
    for method in ("sync-sgd", "local-sgd", "two-level-easgd"):
        rates = [catalog_resolve(None, {"method": method, "workers": w}) for w in (1, 4, 8, 16)]
        assert [c.scaled_lr for c in rates] == pytest.approx([0.025, 0.1, 0.2, 0.2]), method
        assert {c.clip_grad_norm for c in rates} == {2.0}, method
        own = catalog_resolve(None, {"method": method, "workers": 8, "clip_grad_norm": 5.0})
        assert (own.clip_grad_norm, own.scaled_lr) == (5.0, pytest.approx(0.2)), method
    easgd = catalog_resolve(None, {"method": "sync-easgd", "workers": 1})
    assert (easgd.clip_grad_norm, easgd.scaled_lr) == (None, 0.4)  # the plain-SGD workers
    assert "lr 0.1 x min(r, 2), r = B / 256" in describe_rate(method_defaults("sync-sgd"))
    assert "clip_grad_norm 2" in describe_rate(method_defaults("sync-sgd"))
    assert "lr 0.4 x min(sqrt(r), 1), r = B / 64" in describe_rate(method_defaults("sync-easgd"))


def test_own_batch_methods_hold_the_global_batch_beyond_two_workers() -> None:
    """The methods whose workers step on their own batch (the EASGD family, the parameter-server
    and Hogwild methods): beyond 2 workers the default per-worker batch shrinks to hold the
    global batch at 128 (sync-easgd at 64; held up to 8 workers), and the rate follows the
    square root of the worker's batch."""
    own = [m for m in METHODS.names() if method_defaults(m).get("lr_batch") == "worker"]
    assert len(own) == 8, own
    for method in own:
        runs = [catalog_resolve(None, {"method": method, "workers": w}) for w in (1, 2, 4, 8, 16)]
        # sync-easgd holds one worker's 64, the others 128; both beyond 8 workers no further
        held = [64, 32, 16, 8, 8] if method == "sync-easgd" else [64, 64, 32, 16, 16]
        assert [c.batch_size for c in runs] == held, method
        base = method_defaults(method)["lr"]
        rates = [base * (b / 64) ** 0.5 for b in held]
        assert [c.scaled_lr for c in runs] == pytest.approx(rates), method
        given = catalog_resolve(None, {"method": method, "workers": 8, "batch_size": 64})
        assert (given.batch_size, given.scaled_lr) == (64, pytest.approx(base)), method
        larger = catalog_resolve(None, {"method": method, "workers": 2, "batch_size": 256})
        assert larger.scaled_lr == pytest.approx(base), method  # capped at the reference rate
    text = describe_rate(method_defaults("async-easgd"))
    assert "; batch 128 / P per worker beyond 2 workers (at least 16; a rate you give " in text
    text = describe_rate(method_defaults("sync-easgd"))
    assert text.endswith(
        "; batch 64 / P per worker beyond 1 worker (at least 8; a rate you give runs at 64)"
    ), text
    # A rate the user gives is for the batch of 64 they know: not run at 16 (sync-easgd's own
    # 0.4 diverged there), unless they hold the batch themselves
    given_rate = catalog_resolve(None, {"method": "sync-easgd", "workers": 8, "lr": 0.4})
    assert (given_rate.batch_size, given_rate.scaled_lr) == (64, 0.4)
    rule = catalog_resolve(None, {"method": "async-sgd", "workers": 8, "lr_base_batch": 64})
    assert rule.batch_size == 64
    asked = {"method": "sync-easgd", "workers": 8, "lr": 0.2, "global_batch_max": 128}
    assert catalog_resolve(None, asked).batch_size == 16
    for method in ("sync-sgd", "local-sgd", "two-level-easgd"):  # all workers' batch: 64 each
        assert catalog_resolve(None, {"method": method, "workers": 16}).batch_size == 64
    held = catalog_resolve(None, {"method": "sync-sgd", "workers": 8, "global_batch_max": 128})
    assert (held.batch_size, held.scaled_lr) == (16, pytest.approx(0.05))  # 128 samples
    split = catalog_resolve(None, {"method": "sync-easgd", "workers": 8, "model_parallel": 2})
    assert split.batch_size == 16  # 4 data-parallel groups of 16: sync-easgd's 64 samples
    with pytest.raises(TetherError, match=r"global_batch_max must be >= 0 \(0: off\), got -1"):
        TrainConfig(global_batch_max=-1).validate()


def test_an_asynchronous_step_is_damped_beyond_its_workers_from_the_momentum_first() -> None:
    assert damped_step(0.01, 0.9, 1.0) == (0.01, 0.9)  # at or below the tuned worker count
    lr, momentum = damped_step(0.01, 0.9, 0.5)
    assert (lr, momentum) == (pytest.approx(0.01), pytest.approx(0.8))
    assert damped_step(0.1, 0.0, 0.5) == (pytest.approx(0.05), 0.0)  # no momentum: the rate
    lr, momentum = damped_step(0.01, 0.9, 0.05)  # more than the momentum can give
    assert momentum == 0.0 and lr == pytest.approx(0.005)
    for rate, mu, s in ((0.3, 0.5, 0.7), (0.02, 0.99, 0.25), (0.1, 0.6, 0.3)):
        lr, momentum = damped_step(rate, mu, s)  # the effective step, scaled by s
        assert lr / (1 - momentum) == pytest.approx(s * rate / (1 - mu))
    assert TrainConfig(async_base_workers=4, workers=8).async_damping == 0.5
    assert TrainConfig(async_base_workers=4, workers=2).async_damping == 1.0
    assert TrainConfig(workers=8).async_damping == 1.0
    with pytest.raises(TetherError, match="async_base_workers must be >= 0"):
        TrainConfig(async_base_workers=-1).validate()


def _server_step(**given: Any) -> dict[str, Any]:
    """The parameter-server optimizer's rate and momentum that a run with ``given`` builds."""
    config = catalog_resolve(None, given)
    method = METHODS.get(config.method)
    group = method.build_default_optimizer([torch.zeros(1, requires_grad=True)], config)
    return {key: group.param_groups[0][key] for key in ("lr", "momentum")}


def test_the_parameter_server_defaults_are_damped_but_a_users_settings_are_not() -> None:
    msgd = {"method": "async-msgd", "batch_size": 64}  # the damping alone: no held batch
    assert _server_step(**msgd, workers=4) == {"lr": 0.01, "momentum": 0.9}
    assert _server_step(**msgd, workers=8) == {"lr": 0.01, "momentum": pytest.approx(0.8)}
    assert _server_step(**msgd, workers=8, momentum=0.9) == {"lr": 0.01, "momentum": 0.9}
    assert _server_step(**msgd, workers=8, lr=0.02) == {"lr": 0.02, "momentum": 0.9}
    sgd = {"method": "async-sgd", "batch_size": 64}
    assert _server_step(**sgd, workers=4)["lr"] == pytest.approx(0.1)
    assert _server_step(**sgd, workers=8) == {"lr": pytest.approx(0.05), "momentum": 0}
    assert _server_step(**sgd, workers=8, lr=0.1)["lr"] == 0.1
    # async-sgd has no momentum to take from: one given (and ignored) leaves the damping on
    assert _server_step(**sgd, workers=8, momentum=0.5)["lr"] == pytest.approx(0.05)
    # with the held batch (16 per worker on 8): the square-root rate, then the damping
    held = _server_step(method="async-msgd", workers=8)
    assert held == {"lr": pytest.approx(0.005), "momentum": pytest.approx(0.8)}
    assert _server_step(method="async-sgd", workers=8)["lr"] == pytest.approx(0.025)
    damped = [m for m in METHODS.names() if method_defaults(m).get("async_base_workers")]
    assert damped == ["async-sgd", "async-msgd"]
    ignored = ignored_settings(TrainConfig(method="sync-sgd"), ["async_base_workers"])
    assert ignored == ["sync-sgd ignores async_base_workers (it applies to async-sgd, async-msgd)"]


@pytest.mark.filterwarnings("ignore:8 processes on")  # an oversubscribed launch, not run here
def test_fit_holds_the_batch_unless_given_and_init_leaves_it_to_the_loop() -> None:
    """tether.fit builds the loaders, so the EASGD family's held batch applies when no batch is
    given (observed through the global-batch check: 8 x 16 samples fit in 200, 8 x 64 do
    not); under tether.init the user's loop picks the batch, so the config keeps 64."""
    from tether.api.fit import check_fit
    from tether.api.init import init_configs

    data = torch.utils.data.TensorDataset(torch.zeros(200, 4), torch.zeros(200, dtype=torch.long))
    check_fit(torch.nn.Linear(4, 2), data, method="sync-easgd", workers=8)
    # parallel_plan=None is no plan, as leaving it out (it was "must be a list of strings")
    check_fit(torch.nn.Linear(4, 2), data, method="sync-sgd", workers=1, parallel_plan=None)
    with pytest.raises(TetherError, match=r"8 workers x batch 64 = 512\) is larger"):
        check_fit(torch.nn.Linear(4, 2), data, method="sync-easgd", workers=8, batch_size=64)
    config, own = init_configs("sync-easgd", 8, {})
    assert (config.batch_size, config.scaled_lr, own.batch_size) == (64, 0.4, 64)
    assert init_configs("sync-easgd", 8, {"batch_size": 16})[0].batch_size == 16


def test_fit_resume_keeps_the_runs_batch_on_another_worker_count(tmp_path: Path) -> None:
    """An EASGD run may resume on other workers: its batch (held at 16 on 8) stays, as under
    `tether train --resume`, instead of being held again for 4 (32, and another rate)."""
    from tether.api.fit import _config

    run = TrainConfig(method="async-easgd", workers=8, batch_size=16, global_batch_max=128)
    run = dataclasses.replace(run, model="Linear", dataset="TensorDataset")  # what fit records
    (tmp_path / "config.toml").write_text(run.to_toml())
    data = torch.utils.data.TensorDataset(torch.zeros(200, 4), torch.zeros(200, dtype=torch.long))
    net = torch.nn.Linear(4, 2)

    def resumed(batch_size: int | None) -> TrainConfig:
        args = ("async-easgd", 4, 1, batch_size, str(tmp_path), None, None, True, {})
        return _config(net, data, None, None, None, None, *args)[0]

    assert resumed(None).batch_size == 16
    assert resumed(64).batch_size == 64  # a batch given is what it says


def test_a_held_batch_is_named_on_the_runs_first_line() -> None:
    from tether.batch_notes import batch_text

    held = catalog_resolve(None, {"method": "async-easgd", "workers": 8})
    assert batch_text(held, set()) == (
        "batch 16 per worker (the method holds its global batch at 128; --batch-size)"
    )
    given = catalog_resolve(None, {"method": "async-easgd", "workers": 8, "batch_size": 16})
    assert batch_text(given, {"batch_size"}) == "batch 16 per worker"
    mine = catalog_resolve(None, {"method": "sync-sgd", "workers": 8, "global_batch_max": 256})
    assert batch_text(mine, {"global_batch_max"}) == (
        "batch 32 per worker (you hold the global batch at 256; --batch-size)"
    )
    plain = catalog_resolve(None, {"method": "sync-sgd", "workers": 8})
    assert batch_text(plain, set()) == "batch 64 per worker"
    # the ranks of a model group share one batch (it said "per worker")
    grid = catalog_resolve(None, {"method": "sync-sgd", "workers": 4, "model_parallel": 2})
    assert batch_text(grid, set()) == "batch 64 per model group"
    # a resumed run's batch is not among the keys given: only a method's hold is named
    resumed = TrainConfig(method="sync-sgd", workers=4, batch_size=32)
    assert batch_text(resumed, set()) == "batch 32 per worker"
    # a resumed run keeps its batch, whoever chose it: no claim that the method held it (the
    # user who gave 16 on 8 workers was told the method had)
    resumed_held = TrainConfig(method="async-easgd", workers=8, batch_size=16, global_batch_max=128)
    assert batch_text(dataclasses.replace(resumed_held, resume=True), set()) == (
        "batch 16 per worker"
    )


def test_a_config_file_is_read_once_and_its_keys_count_as_given(tmp_path: Path) -> None:
    from tether.cli import build_parser
    from tether.train_options import config_from_args, given_values

    file = tmp_path / "run.toml"
    file.write_text('method = "async-easgd"\nworkers = 8\nbatch_size = 48\nlr = 0.2\n')
    args = build_parser().parse_args(["train", "--config", str(file), "--lr", "0.1"])
    given = given_values(args)
    assert given == {"method": "async-easgd", "workers": 8, "batch_size": 48, "lr": 0.1}
    file.unlink()  # resolving from the values given does not read the file again
    config = config_from_args(args, lambda c: "out", given)
    assert (config.batch_size, config.lr, config.out) == (48, 0.1, "out")


@pytest.mark.filterwarnings("ignore:async-sgd ignores ranks_per_node")  # the 8 workers in 2 nodes
def test_under_torchrun_the_held_batch_follows_the_launchers_world_size() -> None:
    from tether.launch.env import DistEnv
    from tether.run import worker_config
    from tether.train_options import add_train_options

    def config(world: int, *options: str) -> TrainConfig:
        parser = argparse.ArgumentParser()
        add_train_options(parser)
        env = DistEnv(
            rank=0,
            world_size=world,
            local_rank=0,
            local_world_size=world,
            master_addr="127.0.0.1",
            master_port=29500,
            run_id=None,
        )
        return worker_config(parser.parse_args(list(options)), env)

    # 8 workers: 64 / 8 (it was held for the default 2 workers, 32, before the count was known)
    easgd = config(8, "--method", "sync-easgd")
    assert (easgd.workers, easgd.batch_size) == (8, 8)
    # a parameter-server method: 9 processes are 8 workers and the server
    server = config(9, "--method", "async-easgd")
    assert (server.workers, server.batch_size) == (8, 16)
    assert config(9, "--method", "async-easgd", "--batch-size", "64").batch_size == 64
    assert config(4, "--method", "sync-sgd").batch_size == 64  # sync-sgd holds nothing
    # the server is not a worker, not even while the config is being checked: 8 workers make
    # 2 nodes of 4 (9 would be refused)
    nodes = config(9, "--method", "async-sgd", "--ranks-per-node", "4")
    assert (nodes.workers, nodes.ranks_per_node) == (8, 4)
    # rank 0 warns as tether train does (nothing was said under torchrun)
    with pytest.warns(IgnoredSettingWarning) as said:
        config(3, "--method", "async-easgd", "--workers", "7", "--momentum", "0.5")
    messages = [str(w.message) for w in said]
    assert any("async-easgd ignores momentum" in m for m in messages), messages
    assert any(m.startswith("--workers 7 is ignored: the launcher started 3") for m in messages)


def test_fit_gives_loader_workers_to_the_loader(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """loader_workers, a config key, was dropped by tether.fit (only the command line read it)."""
    import tether.api.fit as fit_module

    class Sent(Exception):
        pass

    seen: dict[str, Any] = {}

    def capture(task: Any, path: Path) -> None:
        seen["options"] = dict(task.loader_options)
        raise Sent  # what the workers would load with; nothing is launched

    monkeypatch.setattr(fit_module, "write_task", capture)
    data = torch.utils.data.TensorDataset(torch.zeros(64, 4), torch.zeros(64, dtype=torch.long))
    for given, options in ((None, {"num_workers": 2}), ({"num_workers": 1}, {"num_workers": 1})):
        with pytest.raises(Sent):
            fit_module.fit(
                model=torch.nn.Linear(4, 2), train_data=data, method="sync-sgd", workers=1,
                loader_workers=2, loader_options=given, out=str(tmp_path / str(given)),
            )  # fmt: skip
        assert seen["options"] == options


def test_a_two_level_rate_takes_the_launchers_node_size() -> None:
    # Under torchrun across 2 nodes of 2 ranks, ranks_per_node unset ("the launcher's") made
    # the rate count every worker's batch as one node's: lr 0.1 against 0.05 on one machine
    # with --ranks-per-node 2, and the two runs, meant to be one computation, differed.
    config = dataclasses.replace(
        TrainConfig(), method="two-level-easgd", workers=4, lr=0.1, lr_base_batch=256,
        lr_batch="node", lr_scaling="linear-capped", lr_scale_max=2.0, batch_size=64,
    )  # fmt: skip
    assert config.on_nodes_of(2).ranks_per_node == 2
    assert config.on_nodes_of(2).scaled_lr == pytest.approx(0.05)  # 2 x 64 of 256
    assert config.scaled_lr == pytest.approx(0.1)  # unresolved: every worker's batch
    given = dataclasses.replace(config, ranks_per_node=4)
    assert given.on_nodes_of(2) is given  # a node size given is kept
    global_rate = dataclasses.replace(config, lr_batch="global")
    assert global_rate.on_nodes_of(2) is global_rate  # only a node's rate needs it


def test_an_import_path_optimizer_or_schedule_sets_its_own_rate() -> None:
    # Before, `tether train --optimizer mypkg.opt:build` took the method's clip at 2 and its
    # warm-up (only --lr dropped them), where tether.fit with the same factory took neither.
    named = resolve_config(None, {"method": "sync-sgd"}, None, method_defaults)
    assert (named.clip_grad_norm, named.warmup_epochs) == (2.0, 0.5)  # the method's own
    for key in ("optimizer", "lr_schedule"):
        own = resolve_config(
            None, {"method": "sync-sgd", key: "mypkg.opt:build"}, None, method_defaults
        )
        assert (own.clip_grad_norm, own.warmup_epochs, own.lr_base_batch) == (None, 0.0, 0), key
    (scaling,) = ignored_settings(TrainConfig(optimizer="mypkg.opt:build"), {"lr_base_batch"})
    assert scaling == "lr_base_batch has no effect: your own optimizer sets its own"


def test_rho_is_taken_on_the_rate_the_workers_step_with() -> None:
    # alpha = eta * rho with eta the scaled rate (it took the unscaled lr: 0.4, not 0.283)
    from tether.methods.elastic import elastic_rate

    config = TrainConfig(lr=0.4, lr_base_batch=64, lr_scaling="sqrt", lr_batch="worker")
    config = dataclasses.replace(config, batch_size=32, rho=1.0)
    assert config.scaled_lr == pytest.approx(0.4 * 0.5**0.5)
    assert elastic_rate(config, 2) == pytest.approx(config.scaled_lr)
    with pytest.raises(TetherError, match=r"rho \(1.0\) and alpha \(0.3\) set one rate twice"):
        dataclasses.replace(config, alpha=0.3).validate()


def test_a_refusal_adds_the_value_only_where_its_rule_does_not_say_it() -> None:
    # "workers (6) must be a multiple of ranks_per_node (4), got 6" said the value twice
    cases = [
        (TrainConfig(loss_scale=0.0), "loss_scale must be > 0, got 0.0"),
        (
            TrainConfig(workers=6, ranks_per_node=4),
            "workers (6) must be a multiple of ranks_per_node (4)",
        ),
        (TrainConfig(workers=0), "workers must be >= 1, got 0"),
    ]
    for config, said in cases:
        with pytest.raises(TetherError) as refused:
            config.validate()
        assert str(refused.value) == said
