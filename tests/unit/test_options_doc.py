"""docs/options.md is the reference of every setting: one row per TrainConfig field, with its
default as TrainConfig has it and flags that `tether train` has."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from tether.catalog import method_defaults
from tether.cli import build_parser
from tether.config import TrainConfig
from tether.methods import METHODS

DOC = Path(__file__).resolve().parents[2] / "docs" / "options.md"
ROW = re.compile(r"^\| `(\w+)` \|([^|]*)\|([^|]*)\|")


def _rows() -> dict[str, tuple[str, str]]:
    rows: dict[str, tuple[str, str]] = {}
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            key, flags, default = match.groups()
            assert key not in rows, f"{key} has two rows"
            rows[key] = (flags.strip(), default.strip())
    return rows


def _as_written(value: object) -> str:
    """A default as the doc writes it: TOML's spelling, unset for None."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple):
        return "`[]`" if not value else f"`{list(value)}`"
    return f"`{value!r}`"


def test_every_setting_has_one_row_with_its_default() -> None:
    rows = _rows()
    config = TrainConfig()
    names = [field.name for field in dataclasses.fields(TrainConfig)]
    assert sorted(rows) == sorted(names)
    set_by_methods = {key for name in METHODS.names() for key in method_defaults(name)}
    for name in names:
        default = rows[name][1]
        written = _as_written(getattr(config, name))
        if name in set_by_methods:
            assert default == f"method's, {written}", (name, default)
        else:
            assert default == written, (name, default)


def test_the_flags_it_names_are_tether_trains() -> None:
    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    flags = {flag for action in train._actions for flag in action.option_strings}
    for key, (cell, _) in _rows().items():
        for flag in re.findall(r"--[a-z-]+", cell):
            assert flag in flags, (key, flag)
