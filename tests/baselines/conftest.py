"""Synthetic low-rank rating data with known observation mechanisms."""

from dataclasses import dataclass

import numpy as np
import pytest
import scipy.sparse as sp


@dataclass
class Synthetic:
    truth: np.ndarray  # dense users x items, integer ratings 1..5
    mask: np.ndarray  # 1 = observed in train
    propensity: np.ndarray  # true P(O_ui = 1), dense

    @property
    def train(self) -> sp.csr_matrix:
        return sp.csr_matrix(np.where(self.mask == 1, self.truth, 0.0))

    def true_propensities_of_train(self) -> np.ndarray:
        coo = self.train.tocoo()
        return self.propensity[coo.row, coo.col]

    def all_cells(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        u, i = np.indices(self.truth.shape)
        return u.ravel(), i.ravel(), self.truth.ravel()

    def mcar_test(self, fraction: float, seed: int) -> sp.csr_matrix:
        keep = np.random.default_rng(seed).random(self.truth.shape) < fraction
        return sp.csr_matrix(np.where(keep, self.truth, 0.0))


def low_rank_ratings(n_users: int, n_items: int, rank: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    u = rng.normal(0, 1, (n_users, rank))
    v = rng.normal(0, 1, (n_items, rank))
    score = u @ v.T / np.sqrt(rank) + rng.normal(0, 0.6, n_users)[:, None] + rng.normal(0, 0.6, n_items)[None, :]
    # Quantile cut into 1..5 with a low-heavy MCAR distribution, like real rating data.
    cuts = np.quantile(score, [0.35, 0.55, 0.75, 0.9])
    return 1.0 + np.searchsorted(cuts, score)


@pytest.fixture(scope="session")
def mcar_data() -> Synthetic:
    """Ratings observed completely at random (20% of cells)."""
    truth = low_rank_ratings(300, 200, 3, seed=0)
    prop = np.full(truth.shape, 0.2)
    mask = (np.random.default_rng(1).random(truth.shape) < prop).astype(int)
    return Synthetic(truth, mask, prop)


@pytest.fixture(scope="session")
def mnar_data() -> Synthetic:
    """Self-selection on the rating: P(O=1 | Y=r) grows with r (users rate what they like)."""
    truth = low_rank_ratings(400, 300, 3, seed=2)
    p_by_rating = np.array([0.03, 0.06, 0.12, 0.24, 0.48])
    prop = p_by_rating[truth.astype(int) - 1]
    mask = (np.random.default_rng(3).random(truth.shape) < prop).astype(int)
    return Synthetic(truth, mask, prop)
