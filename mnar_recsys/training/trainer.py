"""Fit a (not-)MIWAE by stochastic gradient ascent on L_K: Adam, row mini-batches, fixed iterations.

There is no early stopping, as in the paper: on real MNAR data the imputation error cannot be
monitored, and the bound on held-out rows is not what the user cares about.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import scipy.sparse as sp
import torch
from tqdm.auto import tqdm

from mnar_recsys.data.rows import RowSource, as_rows
from mnar_recsys.models.notmiwae import NotMIWAE
from mnar_recsys.training.seeds import seed_streams


@dataclass
class TrainConfig:
    """iterations: gradient steps; batch_size: rows per step; n_samples: K; lr: Adam's step size;
    seed: seeds batch order and sampling; device: 'cpu' or 'cuda'; progress: show a tqdm bar;
    log_every: iterations between entries of the returned history (running mean of the bound)."""

    iterations: int = 10_000
    batch_size: int = 100
    n_samples: int = 20
    lr: float = 1e-3
    seed: int = 0
    device: str = "cpu"
    progress: bool = True
    log_every: int = 100

    def __post_init__(self) -> None:
        for name in ("iterations", "batch_size", "n_samples", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")

    def to_dict(self) -> dict:
        return asdict(self)


def _batches(n_rows: int, batch_size: int, rng: np.random.Generator):
    """Endless row mini-batches: shuffled epochs, the short remainder of each epoch dropped."""
    size = min(batch_size, n_rows)
    while True:
        order = rng.permutation(n_rows)
        for start in range(0, n_rows - size + 1, size):
            yield order[start:start + size]


def prepare_rows(model: NotMIWAE, data: "np.ndarray | sp.spmatrix | RowSource") -> RowSource:
    """Validate rows for this model: shape and the decoder's support."""
    rows = as_rows(data)
    if rows.n_features != model.n_features:
        raise ValueError(f"the model has {model.n_features} features but the rows have {rows.n_features}")
    model.decoder.check_values(rows.observed_values())
    return rows


def fit(model: NotMIWAE, data: "np.ndarray | sp.spmatrix | RowSource", config: TrainConfig,
        initialise_missing: bool = True) -> list[tuple[int, float]]:
    """Train `model` in place; return (iteration, running mean of L_K per row) pairs."""
    rows = prepare_rows(model, data)
    if rows.n_rows == 0:
        raise ValueError("cannot train on zero rows")
    rng, _ = seed_streams(config.seed)
    if initialise_missing:
        observed = rows.observed_values()
        model.missing_model.initialise(rows.observed_fraction(), float(observed.mean()) if observed.size else 0.0)
    model.to(config.device).train()
    optimiser = torch.optim.Adam(model.parameters(), lr=config.lr)
    history: list[tuple[int, float]] = []
    running = None
    bar = tqdm(range(1, config.iterations + 1), disable=not config.progress, desc="training", mininterval=0.5)
    batches = _batches(rows.n_rows, config.batch_size, rng)
    for iteration in bar:
        batch = rows.batch(next(batches)).to(config.device)
        bound = model.bound(batch, config.n_samples).mean()
        optimiser.zero_grad(set_to_none=True)
        (-bound).backward()
        optimiser.step()
        value = bound.item()
        running = value if running is None else 0.98 * running + 0.02 * value
        if iteration % config.log_every == 0 or iteration == config.iterations:
            history.append((iteration, running))
            bar.set_postfix(bound=f"{running:.3f}")
    model.eval()
    return history
