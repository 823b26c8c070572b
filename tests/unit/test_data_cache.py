"""The shared data cache: one mapped copy of a file data set for every process on a machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.unit.test_data_idx import write_idx
from tether.data import fill_dataset_cache, load_dataset
from tether.data.cache import cache_key, load_shared
from tether.data.idx import MNIST_FILES, load_mnist_like


def fake_mnist(folder: Path, train: int = 40, test: int = 10, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    sizes = {
        "train_x": (train, 28, 28),
        "train_y": (train,),
        "test_x": (test, 28, 28),
        "test_y": (test,),
    }
    for role, stem in MNIST_FILES.items():
        high = 10 if role.endswith("_y") else 256
        write_idx(folder / stem, rng.integers(0, high, sizes[role], dtype=np.uint8))
    return folder


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("TETHER_DATA_CACHE", str(root))
    return root


def counting_loader(folder: Path) -> tuple[list[int], object]:
    calls: list[int] = []

    def load():  # type: ignore[no-untyped-def]
        calls.append(1)
        return load_mnist_like(folder, "mnist")

    return calls, load


def test_the_first_load_fills_the_cache_and_the_next_maps_it(tmp_path: Path, cache: Path) -> None:
    folder = fake_mnist(tmp_path / "mnist")
    direct = load_mnist_like(folder, "mnist")
    calls, load = counting_loader(folder)
    first = load_shared("mnist", folder, load)
    second = load_shared("mnist", folder, load)
    assert len(calls) == 1  # the files were read once
    for key in ("train_x", "train_y", "test_x", "test_y"):
        for got in (first, second):
            assert torch.equal(getattr(got, key), getattr(direct, key)), key
    (entry,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert sorted(p.name for p in entry.iterdir()) == [
        "meta.json",
        "test_x.bin",
        "test_y.bin",
        "train_x.bin",
        "train_y.bin",
    ]
    assert (entry / "train_x.bin").stat().st_size == 40 * 28 * 28 * 4
    # The registry's own path goes through the cache, and so does the launcher's fill.
    assert torch.equal(load_dataset("mnist", folder).train_x, direct.train_x)
    fill_dataset_cache("mnist", folder)
    assert len(list(cache.iterdir())) == 1


def test_a_changed_file_makes_a_new_entry(tmp_path: Path, cache: Path) -> None:
    folder = fake_mnist(tmp_path / "mnist")
    before = cache_key("mnist", folder)
    fake_mnist(folder, train=41)  # other contents, other size
    assert cache_key("mnist", folder) != before
    assert cache_key("fashion-mnist", folder) != cache_key("mnist", folder)
    assert load_dataset("mnist", folder).num_train == 41


@pytest.mark.parametrize("damage", ["truncated", "bad dtype", "no meta", "other byte order"])
def test_a_damaged_entry_is_replaced_not_trusted(tmp_path: Path, cache: Path, damage: str) -> None:
    folder = fake_mnist(tmp_path / "mnist")
    direct = load_mnist_like(folder, "mnist")
    _, load = counting_loader(folder)
    load_shared("mnist", folder, load)
    entry = cache / cache_key("mnist", folder)
    meta = json.loads((entry / "meta.json").read_text())
    if damage == "truncated":
        with open(entry / "train_x.bin", "r+b") as handle:
            handle.truncate(100)
    elif damage == "bad dtype":
        meta["train_y"]["dtype"] = "object"
        (entry / "meta.json").write_text(json.dumps(meta))
    elif damage == "no meta":
        (entry / "meta.json").unlink()
    else:
        meta["byteorder"] = "big" if sys.byteorder == "little" else "little"
        (entry / "meta.json").write_text(json.dumps(meta))
    calls, load = counting_loader(folder)
    got = load_shared("mnist", folder, load)
    assert len(calls) == 1 and torch.equal(got.train_x, direct.train_x)
    again_calls, again = counting_loader(folder)
    assert torch.equal(load_shared("mnist", folder, again).train_y, direct.train_y)
    assert again_calls == []  # the damaged entry was written anew


def test_without_a_usable_cache_every_process_loads_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = fake_mnist(tmp_path / "mnist")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for setting in ("off", str(blocker / "cache")):  # turned off; a root that cannot be made
        monkeypatch.setenv("TETHER_DATA_CACHE", setting)
        calls, load = counting_loader(folder)
        load_shared("mnist", folder, load)
        load_shared("mnist", folder, load)
        assert len(calls) == 2, setting
    assert blocker.read_text() == "not a folder"


def test_processes_share_the_mapped_pages(tmp_path: Path, cache: Path) -> None:
    """Two processes mapping a 64 MB entry hold one copy between them: each one's proportional
    share of it (Pss) is about half its resident size (Rss)."""
    folder = fake_mnist(tmp_path / "mnist", train=20000, test=10)
    fill_dataset_cache("mnist", folder)
    probe = (
        "import sys, time, torch\n"
        "from tether.data import load_dataset\n"
        f"d = load_dataset('mnist', __import__('pathlib').Path({str(folder)!r}))\n"
        "float(d.train_x.sum())\n"  # touch every page
        "print('ready', flush=True); sys.stdin.readline()\n"
        "fields = {}\n"
        "for line in open('/proc/self/smaps'):\n"
        "    if 'train_x.bin' in line: inside = True; continue\n"
        "    if line[0] in '0123456789abcdef' and ' ' in line and '-' in line.split()[0]:\n"
        "        inside = False\n"
        "    elif locals().get('inside') and line.split(':')[0] in ('Rss', 'Pss'):\n"
        "        fields[line.split(':')[0]] = int(line.split()[1])\n"
        "print(fields['Rss'], fields['Pss'], flush=True); sys.stdin.readline()\n"
    )
    env = {**os.environ, "TETHER_DATA_CACHE": str(cache)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", probe],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        sizes = []
        for p in procs:  # both measure while both are alive
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write("\n")
            p.stdin.flush()
            sizes.append([int(v) for v in p.stdout.readline().split()])
    finally:
        for p in procs:
            p.communicate("\n", timeout=30)
    for rss, pss in sizes:
        assert rss >= 20000 * 28 * 28 * 4 // 1024 * 0.95, rss  # all of it mapped in
        assert pss <= rss * 0.6, (rss, pss)  # and shared with the other process


def test_the_launcher_loads_nothing_when_the_cache_is_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tether.data.registry as registry

    folder = fake_mnist(tmp_path / "mnist")
    loads: list[str] = []
    monkeypatch.setattr(registry, "load_dataset", lambda name, d, seed=0: loads.append(name))
    monkeypatch.setenv("TETHER_DATA_CACHE", "off")
    fill_dataset_cache("mnist", folder)
    assert loads == []  # every worker reads its own copy: nothing to fill
    monkeypatch.setenv("TETHER_DATA_CACHE", str(tmp_path / "cache"))
    fill_dataset_cache("mnist", folder)
    fill_dataset_cache("synthetic", None)  # made in each process: nothing to share
    assert loads == ["mnist"]
