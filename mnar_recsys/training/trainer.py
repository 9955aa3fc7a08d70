"""Fit a (not-)MIWAE by stochastic gradient ascent on L_K: Adam, row mini-batches, fixed iterations.

By default there is no early stopping, as in the paper: on real MNAR data the imputation error cannot
be monitored. On small data sets a fixed 10,000 iterations over-fits, so `validation_fraction` can hold
out rows and keep the parameters with the best bound on them, a choice that needs no MCAR data.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field

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
    log_every: iterations between entries of the returned history (running mean of the bound);
    validation_fraction: share of rows held out to select the iteration with the best held-out bound
    (0: train on all rows for all iterations); validation_every: iterations between those checks."""

    iterations: int = 10_000
    batch_size: int = 100
    n_samples: int = 20
    lr: float = 1e-3
    seed: int = 0
    device: str = "cpu"
    progress: bool = True
    log_every: int = 100
    validation_fraction: float = 0.0
    validation_every: int = 250

    def __post_init__(self) -> None:
        for name in ("iterations", "batch_size", "n_samples", "log_every", "validation_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(f"validation_fraction must lie in [0, 1), got {self.validation_fraction}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class History:
    """bound: (iteration, running mean of L_K per row) pairs; validation: (iteration, mean L_K on the
    held-out rows) pairs; best_iteration: the iteration whose parameters were kept (None: the last)."""

    bound: list[tuple[int, float]] = field(default_factory=list)
    validation: list[tuple[int, float]] = field(default_factory=list)
    best_iteration: int | None = None


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
        initialise_missing: bool = True) -> History:
    """Train `model` in place and return its history."""
    rows = prepare_rows(model, data)
    if rows.n_rows == 0:
        raise ValueError("cannot train on zero rows")
    rng, _ = seed_streams(config.seed)
    order = rng.permutation(rows.n_rows)
    n_validation = int(round(config.validation_fraction * rows.n_rows))
    if config.validation_fraction > 0 and not 0 < n_validation < rows.n_rows:
        raise ValueError(f"validation_fraction {config.validation_fraction} of {rows.n_rows} rows leaves no "
                         "validation or no training rows")
    validation, training = np.sort(order[:n_validation]), order[n_validation:]
    if initialise_missing:
        observed = rows.observed_values()
        model.missing_model.initialise(rows.observed_fraction(), float(observed.mean()) if observed.size else 0.0)
    model.to(config.device).train()
    optimiser = torch.optim.Adam(model.parameters(), lr=config.lr)
    history = History()
    best_state, best_value = None, -float("inf")
    running = None
    bar = tqdm(range(1, config.iterations + 1), disable=not config.progress, desc="training", mininterval=0.5)
    batches = _batches(training.size, config.batch_size, rng)
    for iteration in bar:
        batch = rows.batch(training[next(batches)]).to(config.device)
        bound = model.bound(batch, config.n_samples).mean()
        optimiser.zero_grad(set_to_none=True)
        (-bound).backward()
        optimiser.step()
        value = bound.item()
        running = value if running is None else 0.98 * running + 0.02 * value
        if iteration % config.log_every == 0 or iteration == config.iterations:
            history.bound.append((iteration, running))
            bar.set_postfix(bound=f"{running:.3f}")
        if validation.size and (iteration % config.validation_every == 0 or iteration == config.iterations):
            held_out = _mean_bound(model, rows, validation, config)
            history.validation.append((iteration, held_out))
            if held_out > best_value:
                best_value, history.best_iteration = held_out, iteration
                best_state = copy.deepcopy(model.state_dict())
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return history


@torch.no_grad()
def _mean_bound(model: NotMIWAE, rows: RowSource, index: np.ndarray, config: TrainConfig) -> float:
    """Mean L_K per row over `index`, in training-sized batches."""
    model.eval()
    total = 0.0
    for start in range(0, index.size, config.batch_size):
        batch = rows.batch(index[start:start + config.batch_size]).to(config.device)
        total += float(model.bound(batch, config.n_samples).sum())
    model.train()
    return total / index.size
