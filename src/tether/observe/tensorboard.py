"""TensorBoard event files of a run (``--tensorboard``, ``tether.fit(log="tensorboard")``).

torch's own ``SummaryWriter`` writes them; it needs the ``tensorboard`` package (the optional
extra ``tether[tensorboard]``), so the import is checked before any worker starts
(:func:`require_tensorboard`). Rank 0 writes ``DIR/tensorboard``: the training loss per step
and every evaluation metric, with the step as the x axis, so ``tensorboard --logdir DIR`` shows a
run as users of other tools expect.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tether.errors import TetherError

HOW_TO_GET = "install it with pip install 'tether[tensorboard]' (or pip install tensorboard)"


def require_tensorboard() -> None:
    """A one-line error when TensorBoard logging is asked for but cannot be written."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise TetherError(f"TensorBoard logs need the tensorboard package: {HOW_TO_GET}") from None


def open_tensorboard(directory: Path, start_step: int = 0) -> Any:
    """A ``SummaryWriter`` on ``directory``; on resume (``start_step`` > 0) events after the
    checkpoint's step are purged, as TensorBoard does for a crashed run."""
    require_tensorboard()
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(directory), purge_step=start_step or None)
