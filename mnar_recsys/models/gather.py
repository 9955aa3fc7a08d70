"""Gathers along the first axis whose gradient repeats bit for bit on a multi-threaded CPU."""

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
