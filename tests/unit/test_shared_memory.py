"""Named shared-memory tensors (tether.methods.shared_memory): one buffer, many mappings.

Two mappings of one name are the same memory, so a write through either is seen through the other
at once, also after the name is unlinked (which is how the Hogwild server cleans up early).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tether.errors import TetherError
from tether.methods.shared_memory import (
    SharedFiles,
    create_shared,
    map_shared,
    shm_dir,
    unlink_shared,
)


def test_two_mappings_share_writes_and_outlive_the_name(tmp_path: Path) -> None:
    path = tmp_path / "weights"
    a = create_shared(path, 10, torch.float32)
    assert path.stat().st_size == 40 and torch.equal(a, torch.zeros(10))
    b = map_shared(path, 10, torch.float32)
    a[3] = 5.0
    b.sub_(torch.full((10,), 0.5))  # an in-place update, as Hogwild does
    assert a[3].item() == 4.5 and b[0].item() == -0.5
    unlink_shared(path)
    assert not path.exists()
    a[7] = 2.0  # the mappings stay valid: the memory lives as long as they do
    assert b[7].item() == 2.0
    unlink_shared(path)  # idempotent


def test_create_refuses_an_existing_name(tmp_path: Path) -> None:
    path = tmp_path / "taken"
    path.write_bytes(b"\0" * 8)
    with pytest.raises(FileExistsError):
        create_shared(path, 2, torch.float32)


def test_map_explains_a_missing_or_mismatched_file(tmp_path: Path) -> None:
    with pytest.raises(TetherError, match="does not exist"):
        map_shared(tmp_path / "gone", 4, torch.float32)
    create_shared(tmp_path / "small", 4, torch.float32)
    with pytest.raises(TetherError, match="holds 16 bytes"):
        map_shared(tmp_path / "small", 4, torch.float64)


def test_shared_files_name_create_attach_and_unlink() -> None:
    creator = SharedFiles("tether-ab12/x y", token=0x1234)
    assert creator.directory == shm_dir()
    assert creator.prefix == "tether-tether-ab12_x_y-0000000000001234"  # path-safe run id
    weights = creator.create("weights", 6, torch.bfloat16)
    board = creator.create("board", 5, torch.int64)
    try:
        other = SharedFiles("tether-ab12/x y", token=0x1234)
        seen_weights = other.attach("weights", 6, torch.bfloat16)
        seen_board = other.attach("board", 5, torch.int64)
        seen_board[4] = 1  # a worker's write is the server's read
        weights.add_(1.0)
        assert board[4].item() == 1 and torch.equal(seen_weights, torch.ones(6).bfloat16())
        assert other.created == []  # attaching owns nothing: only the creator unlinks
    finally:
        creator.unlink()
    assert not any(p.name.startswith(creator.prefix) for p in creator.directory.iterdir())
    assert creator.created == []


def test_files_are_private_to_their_user(tmp_path: Path) -> None:
    path = tmp_path / "private"
    create_shared(path, 1, torch.float32)
    assert os.stat(path).st_mode & 0o777 == 0o600
