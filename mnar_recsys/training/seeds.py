"""Seeds are handled here, in one place, and derived for sub-streams (SPEC 7 style)."""

from __future__ import annotations

import numpy as np
import torch


def step_seed(seed: int, *path: int) -> None:
    """Seed torch for one unit of work named by `path` (e.g. iteration and shard): its noise then does
    not depend on which process computes it or on what ran before, which makes a run with N processes
    reproduce the single-process run with the same shards."""
    state = np.random.SeedSequence([seed, *path]).generate_state(2, dtype=np.uint32)
    torch.manual_seed(int(state[0]) << 31 | int(state[1]) >> 1)
