"""Hyper-parameter choice from the *train* ratings only: hold out some observed ratings, score, pick.

This is how the baselines' defaults were chosen; the MCAR test set is never consulted. Note that the
held-out ratings are MNAR like the rest of train, so the choice favours fitting the observed
distribution (the honest protocol when no MCAR data may be used).
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import scipy.sparse as sp

from baselines.base import Recommender
from mnar_recsys.checks.ratings import check_ratings
from mnar_recsys.data.splits import split_entries


def validation_split(train: sp.csr_matrix, fraction: float = 0.1, seed: int = 0) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Split the stored train ratings uniformly at random into (fit, validation) matrices of train's shape."""
    train = check_ratings(train)
    if train.nnz < 2:  # one part would be empty
        raise ValueError(f"a validation split holds out some train ratings and fits the rest: train has {train.nnz}, "
                         "it needs at least 2")
    held, fit = split_entries(train, fraction, seed)
    return fit, held


def select_config(
    make: Callable[..., Recommender],
    train: sp.csr_matrix,
    grid: Iterable[dict],
    fraction: float = 0.1,
    seed: int = 0,
    *,
    fit_kwargs: dict | None = None,
    weigh: Callable[[sp.csr_matrix], np.ndarray] | None = None,
) -> tuple[dict, list[tuple[dict, float]]]:
    """Return the keyword set from ``grid`` whose model, built by ``make(**kwargs)`` and fitted with
    ``fit_kwargs``, has the lowest validation MSE on a held-out ``fraction`` of the train ratings, plus
    every (kwargs, MSE) tried.

    ``weigh(held_out)`` gives each held-out rating a weight (in ``held_out.data``'s order), which makes the
    score their weighted mean squared error: with inverse propensities, the self-normalised IPS estimate
    of the error over all cells that Schnabel et al. (2016) select MF-IPS by.
    """
    fit_part, val = validation_split(train, fraction, seed)
    vc = val.tocoo()
    weights = None if weigh is None else np.asarray(weigh(val), dtype=np.float64)
    if weights is not None and (weights.shape != vc.data.shape or not (np.isfinite(weights) & (weights > 0)).all()):
        raise ValueError(f"weigh must give one finite positive weight per held-out rating ({vc.nnz}), "
                         f"got shape {weights.shape}")
    scores = []
    for kwargs in grid:
        pred = make(**kwargs).fit(fit_part, **(fit_kwargs or {})).predict(vc.row, vc.col)
        scores.append((kwargs, float(np.average((pred - vc.data) ** 2, weights=weights))))
    if not scores:
        raise ValueError("grid is empty")
    return min(scores, key=lambda s: s[1])[0], scores
