"""Gathers along the first axis, and sums into rows, whose gradients repeat bit for bit on a multi-threaded CPU."""

from __future__ import annotations

import torch


def take(source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """source[index] along the first axis, shape (*index.shape, *source.shape[1:]).

    The backward pass of `source[index]` adds the gradients of repeated indices with atomic adds split
    across threads once they exceed 32,768 entries on a CPU (index_put_ with accumulate), so its sums,
    and all training after them, change in the last bits from run to run with two or more threads.
    index_select's backward (index_add_) adds them in order.
    """
    return source.index_select(0, index.reshape(-1)).view(index.shape + source.shape[1:])


def sum_by_row(values: torch.Tensor, rows: torch.Tensor, n_rows: int) -> torch.Tensor:
    """out[r] = Σ_{i : rows[i] = r} values[i]: the per-entry values of a batch's entries (n, ...) summed into
    its rows (n_rows, ...), rows without entries 0. index_add_ adds in order, and its backward is `take`'s
    index_select."""
    return values.new_zeros((n_rows, *values.shape[1:])).index_add_(0, rows, values)
