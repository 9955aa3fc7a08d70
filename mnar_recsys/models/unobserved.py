"""Uniform draws of unobserved columns from a batch's observed entries, without a dense mask.

With row r's observed columns sorted, o_0 < o_1 < ..., the number of unobserved columns before o_i is
o_i - i, so the u-th unobserved column (counting from 0) is u + #{i : o_i - i <= u}. Keying each
observed entry by r (p + 1) + (o_i - i) makes one sorted array for the whole batch, and a single
searchsorted counts that set for every draw: the cost grows with the observed entries and the draws,
never with rows x features.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mnar_recsys.data.rows import RowBatch


@dataclass
class UnobservedDraw:
    """Draws (rows[n], cols[n]) of unobserved entries, sorted by row, and weight[n] = n_unobserved[row] / m,
    which makes the weighted sum over a row's m draws an unbiased estimate of the sum over all its
    unobserved entries."""

    rows: torch.Tensor
    cols: torch.Tensor
    weight: torch.Tensor


def draw_unobserved(batch: RowBatch, n_draws: int) -> UnobservedDraw:
    """`n_draws` unobserved columns per row, uniform and with replacement; rows with none get no draws.

    The batch's observed entries must be sorted by (row, column) without duplicates, as every
    `RowSource` batch is.
    """
    if n_draws < 1:
        raise ValueError(f"the number of unobserved draws per row must be at least 1, got {n_draws}")
    device, n_features = batch.obs_col.device, batch.n_features
    counts = torch.bincount(batch.obs_row, minlength=batch.n_rows)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(batch.obs_row.numel(), device=device) - starts[batch.obs_row]
    key = batch.obs_row * (n_features + 1) + (batch.obs_col - rank)
    _check_sorted(batch.obs_row, key)
    n_unobserved = n_features - counts
    rows = torch.nonzero(n_unobserved > 0).squeeze(1).repeat_interleave(n_draws)
    available = n_unobserved[rows]
    # float64: float32 has too few levels to be uniform over 10^5 columns
    u = (torch.rand(rows.shape, dtype=torch.float64, device=device) * available).long()
    u = torch.minimum(u, available - 1)
    skipped = torch.searchsorted(key, rows * (n_features + 1) + u, right=True) - starts[rows]
    return UnobservedDraw(rows, u + skipped, available.to(batch.obs_value.dtype) / n_draws)


def _check_sorted(rows: torch.Tensor, key: torch.Tensor) -> None:
    """Rows non-decreasing and columns strictly increasing within each row, which the search needs."""
    if rows.numel() > 1 and not bool(((rows[1:] >= rows[:-1]) & (key[1:] >= key[:-1])).all()):
        raise ValueError("the batch's observed entries must be sorted by (row, column) without duplicates "
                         "to draw unobserved columns, as RowSource batches are")
