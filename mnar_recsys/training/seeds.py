"""Seeds are handled here, in one place, and derived for sub-streams (SPEC 7 style)."""

from __future__ import annotations

import numpy as np
import torch


def seed_streams(seed: int) -> tuple[np.random.Generator, int]:
    """Seed torch from `seed`'s first child stream; return a NumPy generator on the second (batch order)."""
    torch_seq, numpy_seq = np.random.SeedSequence(seed).spawn(2)
    torch_seed = int(torch_seq.generate_state(1, dtype=np.uint64)[0] % (2 ** 63))
    torch.manual_seed(torch_seed)
    return np.random.default_rng(numpy_seq), torch_seed
