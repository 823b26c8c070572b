"""Config: defaults, TOML files, --set parsing, type checks and validation messages."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from tether.config import (
    TrainConfig,
    apply_overrides,
    load_toml,
    parse_set_options,
    resolve_config,
)
from tether.errors import TetherError


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
    with pytest.raises(TetherError, match=r"unknown config key 'lrr'; valid keys: method, "):
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
        ({"backend": "mpi"}, "backend must be one of"),
        ({"method": "nope"}, "unknown method .nope.; valid methods: .*sync-sgd"),
        ({"model": "nope"}, "valid models: .*lenet5"),
        ({"dataset": "nope"}, "valid datasets: .*fashion-mnist"),
    ],
)
def test_validation_messages(change: dict, message: str) -> None:
    with pytest.raises(TetherError, match=message):
        dataclasses.replace(TrainConfig(), **change).validate()


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
