"""Fitting a link's alpha (seconds per message) and beta (seconds per byte) to timed sizes:
Hockney's model, as MG-WFBP fits its clusters, for ``tether calibrate``'s all-reduce and the
parameter server's wire."""

from __future__ import annotations

import torch

from tether.errors import TetherError


def fit_ring(points: list[tuple[float, float]], world: int) -> tuple[float, float]:
    """Least squares of ``t = 2(P-1)a + 2(P-1)/P*n*b`` over (bytes, seconds) points."""
    return fit_alpha_beta(points, 2 * (world - 1), 2 * (world - 1) / world)


def fit_alpha_beta(
    points: list[tuple[float, float]], messages: float, bytes_factor: float
) -> tuple[float, float]:
    """Least squares of ``t = messages*a + bytes_factor*n*b`` over (bytes, seconds) points,
    relative (each point weighted by 1/t, so the small sizes count as much as the large ones);
    a and b are kept >= 0."""
    rows = [(messages / t, bytes_factor * n / t) for n, t in points if t > 0]
    if len(rows) < 2:
        raise TetherError("the link fit needs at least two timed sizes")
    a_matrix = torch.tensor(rows, dtype=torch.float64)
    ones = torch.ones(len(rows), 1, dtype=torch.float64)
    solution = torch.linalg.lstsq(a_matrix, ones).solution.flatten()
    alpha, beta = (max(0.0, float(v)) for v in solution)
    return alpha, beta
