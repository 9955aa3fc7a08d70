"""The MCAR evaluation protocol for rating models trained on self-selected (MNAR) ratings.

Per seed, 5% of the MCAR test ratings are drawn once (``split_mcar_sample``) for the models that need
an MCAR sample (e.g. the Naive-Bayes propensities of MF-IPS) and left out of scoring for every model, so all
models of a seed are scored on the same entries.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp

from mnar_recsys.data.ratings import RatingsData
from mnar_recsys.data.splits import split_mcar_sample
from mnar_recsys.evaluation.metrics import mae, mse, ndcg_at_k, per_rating_errors

MCAR_SAMPLE_FRACTION = 0.05
NDCG_K = 5


class Recommender(Protocol):
    """What the protocol scores (cornac-style): fit on the MNAR train matrix, predict ratings for (user, item) pairs."""

    name: str

    def fit(self, train: sp.csr_matrix) -> Recommender: ...

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray: ...


@dataclass
class MCARSplit:
    """The MNAR train ratings, the MCAR sample some models may use, and the MCAR entries scored."""

    train: sp.csr_matrix
    mcar_sample: sp.csr_matrix
    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    seed: int

    @property
    def n_test(self) -> int:
        return int(self.ratings.size)


def mcar_split(data: RatingsData, seed: int, fraction: float = MCAR_SAMPLE_FRACTION) -> MCARSplit:
    """Draw the seed's MCAR sample and return what is left to score, in CSR (user-major) order."""
    sample, rest = split_mcar_sample(data.test, fraction=fraction, seed=seed)
    rest = rest.tocsr()
    rest.sort_indices()
    coo = rest.tocoo()
    return MCARSplit(train=data.train, mcar_sample=sample, users=coo.row.astype(np.int64),
                     items=coo.col.astype(np.int64), ratings=coo.data.astype(np.float64), seed=seed)


def score(users: np.ndarray, ratings: np.ndarray, predictions: np.ndarray) -> dict[str, Any]:
    """MSE, MAE, NDCG@5 over each user's scored items, and MSE/MAE per true rating value."""
    return {"mse": mse(ratings, predictions), "mae": mae(ratings, predictions),
            f"ndcg@{NDCG_K}": ndcg_at_k(users, ratings, predictions, k=NDCG_K),
            "per_rating": per_rating_errors(ratings, predictions)}


def fit_and_score(model: Recommender, split: MCARSplit, uses_mcar_sample: bool = False
                  ) -> tuple[dict[str, Any], np.ndarray]:
    """Fit `model` on the split's train ratings (and its MCAR sample, for a model that `uses_mcar_sample`),
    predict the scored entries, time both.

    Returns (record with the metrics, seconds and n_test; the predictions aligned with split.ratings).
    """
    start = time.perf_counter()
    if uses_mcar_sample:
        model.fit(split.train, mcar_sample=split.mcar_sample)
    else:
        model.fit(split.train)
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    predictions = np.asarray(model.predict(split.users, split.items), dtype=np.float64)
    predict_seconds = time.perf_counter() - start
    if not np.isfinite(predictions).all():  # NaN would pass through the ranking metric as a score
        raise ValueError(f"{model.name} (seed {split.seed}) predicted {int((~np.isfinite(predictions)).sum())} of "
                         f"{predictions.size} scored entries as NaN or infinite; nothing of it is scored")
    record = {"model": model.name, "seed": split.seed, **score(split.users, split.ratings, predictions),
              "train_seconds": train_seconds, "predict_seconds": predict_seconds, "n_test": split.n_test}
    return record, predictions
