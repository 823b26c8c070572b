"""The progress bar shown by rank 0 (tqdm on stderr), or nothing."""

from __future__ import annotations

import sys
from typing import Any


class NoProgress:
    def update(self, n: int = 1) -> None:
        del n

    def set_postfix(self, **values: Any) -> None:
        del values

    def close(self) -> None:
        pass


def progress_bar(total: int, enabled: bool, initial: int = 0, desc: str = "train") -> Any:
    if not enabled:
        return NoProgress()
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit="step",
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=0.5,
        leave=True,
    )
