"""Seeds are handled here, in one place, and derived for sub-streams (SPEC 7 style)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


def step_seed(seed: int, *path: int) -> None:
    """Seed torch for one unit of work named by `path` (e.g. iteration and shard): its noise then does
    not depend on which process computes it or on what ran before, which makes a run with N processes
    reproduce the single-process run with the same shards."""
    state = np.random.SeedSequence([seed, *path]).generate_state(2, dtype=np.uint32)
    value = int(state[0]) << 31 | int(state[1]) >> 1
    # torch.manual_seed would also queue lazy seeding of every accelerator backend, which records a
    # stack trace each call (about 1 ms, a seventh of a small model's training step); the CPU generator
    # and, once in use, the CUDA ones are all that draw noise here
    torch.default_generator.manual_seed(value)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(value)


@contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """torch.manual_seed(seed) for the block, and the caller's random state (the CPU's and, once CUDA is in use,
    every GPU's: `step_seed` seeds them all) as it was afterwards."""
    cuda = range(torch.cuda.device_count()) if device.type == "cuda" or torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        yield
