"""Hardware profiles: what a machine or cluster is, as data, every number with its source.

A profile describes one kind of worker and the links between workers, in the alpha-beta-gamma
model of the communication layer (docs/communication.md: a message of n bytes costs ``a + n*b``,
reducing n bytes costs ``n*g``; Thakur, Rabenseifner and Gropp 2005), with two link levels as the
hierarchical all-reduce of Jia et al. 2018 needs them: inside a node and between nodes. Compute is
a worker's achieved FLOP/s (the fraction of peak a training step reaches), which turns a model's
counted FLOPs into seconds where no layer was timed on the machine itself.

On disk a profile is JSON; each number is ``{"value": x, "source": "where it comes from"}``, so a
prediction can say what it rests on. ``tether calibrate`` writes one for the running machine; the
built-in ones are files in ``tether/perf/profiles/`` (``tether predict --profile NAME``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tether.errors import TetherError
from tether.perf.checks import is_finite_number, is_whole

BUILT_IN = "tether.perf.profiles"


@dataclass(frozen=True)
class Sourced:
    """A number and where it comes from (a paper, a datasheet, a measurement and its date)."""

    value: float
    source: str


@dataclass(frozen=True)
class Link:
    """One link level: ``alpha`` seconds per message, ``beta`` seconds per byte."""

    alpha: Sourced
    beta: Sourced

    def time(self, n_bytes: float) -> float:
        return self.alpha.value + n_bytes * self.beta.value


@dataclass(frozen=True)
class ExchangeLoad:
    """What an exchange costs beyond the idle links' price when the workers also compute
    (:mod:`tether.perf.exchange_load`): ``alpha`` seconds more per message of a collective (a
    peer blocked in the exchange wakes on a core busy with compute), ``skew`` seconds one
    exchange of two ranks waits for the later of them (their steps end at different times), and
    ``server`` seconds of a parameter server's CPU per exchange beyond its priced apply (its
    loop, the socket copies, the checks of every message)."""

    alpha: Sourced
    skew: Sourced
    server: Sourced


@dataclass(frozen=True)
class HardwareProfile:
    """A worker kind and its links. ``cores_per_node`` is how many workers (one thread each) a
    node runs without sharing a core: beyond it a worker's compute slows in proportion (the
    partitioning of one chip into workers, SC17 section on KNL); 0 means no such limit (GPUs,
    one worker per device)."""

    name: str
    description: str
    ranks_per_node: int
    cores_per_node: int
    intra: Link
    inter: Link
    gamma: Sourced
    flops: Sourced  # achieved FLOP/s of one worker in a training step
    # The parameter server's push/reply wire inside a node (a message of n bytes), where it was
    # measured (`tether calibrate`); without it those messages are priced with ``intra``.
    server_wire: Link | None = None
    # How much slower one worker's training step is when every core of the node runs a worker
    # (a ratio >= 1: shared caches, memory bandwidth, clocks), where it was measured (`tether
    # calibrate`); without it a worker computes as fast beside others as alone.
    busy_node_slowdown: Sourced | None = None
    # The exchange under load, where it was measured (`tether calibrate`); without it an
    # exchange in training costs what the idle links price it at.
    exchange_load: ExchangeLoad | None = None

    def link(self, crosses_nodes: bool) -> Link:
        return self.inter if crosses_nodes else self.intra

    def to_dict(self) -> dict[str, Any]:
        def sourced(s: Sourced) -> dict[str, Any]:
            return {"value": s.value, "source": s.source}

        def link(k: Link) -> dict[str, Any]:
            return {"alpha": sourced(k.alpha), "beta": sourced(k.beta)}

        data = {
            "name": self.name,
            "description": self.description,
            "ranks_per_node": self.ranks_per_node,
            "cores_per_node": self.cores_per_node,
            "intra": link(self.intra),
            "inter": link(self.inter),
            "gamma": sourced(self.gamma),
            "flops": sourced(self.flops),
        }
        if self.server_wire is not None:
            data["server_wire"] = link(self.server_wire)
        if self.busy_node_slowdown is not None:
            data["busy_node_slowdown"] = sourced(self.busy_node_slowdown)
        if self.exchange_load is not None:
            data["exchange_load"] = {
                "alpha": sourced(self.exchange_load.alpha),
                "skew": sourced(self.exchange_load.skew),
                "server": sourced(self.exchange_load.server),
            }
        return data


def _field(data: dict[str, Any], path: str, where: str) -> Any:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise TetherError(
                f"profile {where}: missing field '{path}' (every profile needs name, description, "
                "ranks_per_node, cores_per_node, intra/inter alpha and beta, gamma and flops; "
                "see docs/performance.md)"
            )
        node = node[part]
    return node


def _sourced(data: dict[str, Any], path: str, where: str) -> Sourced:
    entry = _field(data, path, where)
    if not isinstance(entry, dict) or "value" not in entry or "source" not in entry:
        raise TetherError(
            f'profile {where}: field \'{path}\' must be {{"value": number, "source": text}}'
        )
    value = entry["value"]
    if not is_finite_number(value):
        raise TetherError(f"profile {where}: '{path}' must be a finite number, not {value!r}")
    if value < 0:
        raise TetherError(f"profile {where}: '{path}' must be >= 0, not {value}")
    return Sourced(float(value), str(entry["source"]))


def profile_from_dict(data: dict[str, Any], where: str = "(given)") -> HardwareProfile:
    """Build and validate a profile; a missing or malformed field is one-line TetherError."""
    if not isinstance(data, dict):
        raise TetherError(f"profile {where}: expected a JSON object")
    counts = {}
    for key in ("ranks_per_node", "cores_per_node"):
        value = _field(data, key, where)
        if not is_whole(value) or value < 0:
            raise TetherError(f"profile {where}: '{key}' must be a whole number >= 0")
        counts[key] = value
    if counts["ranks_per_node"] < 1:
        raise TetherError(f"profile {where}: 'ranks_per_node' must be at least 1")
    flops = _sourced(data, "flops", where)
    if flops.value <= 0:
        raise TetherError(f"profile {where}: 'flops' must be > 0")

    def link(level: str) -> Link:
        return Link(_sourced(data, f"{level}.alpha", where), _sourced(data, f"{level}.beta", where))

    busy = None
    if "busy_node_slowdown" in data:
        busy = _sourced(data, "busy_node_slowdown", where)
        if busy.value < 1:
            raise TetherError(
                f"profile {where}: 'busy_node_slowdown' must be >= 1 (a worker beside others "
                f"computes no faster than alone), not {busy.value}"
            )

    return HardwareProfile(
        name=str(_field(data, "name", where)),
        description=str(_field(data, "description", where)),
        ranks_per_node=counts["ranks_per_node"],
        cores_per_node=counts["cores_per_node"],
        intra=link("intra"),
        inter=link("inter"),
        gamma=_sourced(data, "gamma", where),
        flops=flops,
        server_wire=link("server_wire") if "server_wire" in data else None,
        busy_node_slowdown=busy,
        exchange_load=(
            ExchangeLoad(
                _sourced(data, "exchange_load.alpha", where),
                _sourced(data, "exchange_load.skew", where),
                _sourced(data, "exchange_load.server", where),
            )
            if "exchange_load" in data
            else None
        ),
    )


def built_in_profiles() -> list[str]:
    """The names of the profiles shipped with Tether."""
    files = resources.files(BUILT_IN).iterdir()
    return sorted(f.name.removesuffix(".json") for f in files if f.name.endswith(".json"))


def load_profile(name_or_path: str) -> HardwareProfile:
    """A built-in profile by name, or a JSON file (``tether calibrate``'s output) by path."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if path.is_dir():
            raise TetherError(
                f"profile {path} is a directory: give the profile file in it (e.g. "
                f"{path / 'profile.json'}, as `tether calibrate` writes it)"
            )
        if not path.is_file():
            raise TetherError(f"profile file {path} not found (write one with `tether calibrate`)")
        text = path.read_text()
        where = str(path)
    else:
        names = built_in_profiles()
        if name_or_path not in names:
            raise TetherError(
                f"unknown profile '{name_or_path}': give a JSON file or one of {', '.join(names)}"
            )
        text = resources.files(BUILT_IN).joinpath(f"{name_or_path}.json").read_text()
        where = name_or_path
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TetherError(
            f"profile {where}: not valid JSON ({exc.msg}, line {exc.lineno})"
        ) from None
    hardware = data.get("hardware", data) if isinstance(data, dict) else data
    return profile_from_dict(hardware, where)
