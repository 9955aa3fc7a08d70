"""Biased matrix factorisation: r_ui ≈ mu + b_u + b_i + p_u·q_i, fitted to the observed ratings only.

Objective (per-rating weights w_ui, rescaled to mean 1):

    sum_obs w_ui (r_ui - mu - b_u - b_i - p_u·q_i)^2 + l2 * sum_obs (|p_u|^2 + |q_i|^2 + b_u^2 + b_i^2)

i.e. the per-rating L2 penalty of SGD-style MF (Koren et al.), equivalently the count-weighted
"ALS-WR" penalty (Zhou et al., 2008). It is minimised by weighted alternating least squares: with the
item side fixed, each user's (p_u, b_u) is an exact ridge solution, and vice versa, all solved at once
in NumPy; the objective decreases monotonically and the fit is deterministic given the seed. Inverse-
propensity scoring (``baselines.ips``) reuses it by passing ``sample_weight``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from baselines._als import ridge_rows
from mnar_recsys.checks import check_positive_finite, check_positive_integer
from mnar_recsys.checks.ratings import check_fitted, check_on_scale, check_pairs, check_ratings, check_sample_weight

# the grid MFConfig's defaults were chosen on, and which `baselines.registry.tune_baseline` searches
MF_GRID: tuple[dict[str, float], ...] = tuple({"n_factors": n, "l2": l2} for n in (5, 10, 20)
                                              for l2 in (0.1, 0.2, 0.3, 0.5, 1.0, 3.0, 10.0))


@dataclass
class MFConfig:
    """Hyper-parameters of biased MF.

    Defaults were chosen by a 10% validation split of the Coat *train* (MNAR) ratings with
    ``baselines.selection.select_config`` (never the MCAR test): over ``MF_GRID``, n_factors {5, 10, 20} x
    l2 {0.1, 0.2, 0.3, 0.5, 1, 3, 10}, the best was 20 / 0.2 (validation MSE 1.142); n_iters 10, 15 and 30
    agreed to 0.001. On another data set choose again (``baselines.registry.tune_baseline``, or
    ``mnar-recsys ratings --tune-baselines``) rather than reuse these.
    """

    #: latent dimension of p_u and q_i.
    n_factors: int = 20
    #: weight of the per-rating L2 penalty (see the module docstring).
    l2: float = 0.2
    #: ALS sweeps (each updates the user side, then the item side).
    n_iters: int = 15
    #: standard deviation of the Gaussian factor initialisation (biases start at 0).
    init_std: float = 0.1
    #: predictions are clipped to this (low, high); None disables clipping.
    rating_scale: tuple[float, float] | None = (1.0, 5.0)
    #: seeds the initialisation.
    seed: int = 0


class MatrixFactorization:
    """Biased MF recommender (Recommender protocol); ``fit`` accepts optional per-rating weights."""

    name = "mf"

    def __init__(self, config: MFConfig | None = None, **overrides: object) -> None:
        """Build from an ``MFConfig``, or from keyword overrides of its fields (``MatrixFactorization(l2=0.1)``)."""
        base = config or MFConfig()
        self.config = MFConfig(**{**base.__dict__, **overrides})
        self.global_mean: float | None = None
        self.user_bias: np.ndarray | None = None
        self.item_bias: np.ndarray | None = None
        self.user_factors: np.ndarray | None = None
        self.item_factors: np.ndarray | None = None

    def fit(self, train: sp.csr_matrix, sample_weight: np.ndarray | None = None) -> "MatrixFactorization":
        """Fit to the stored ratings of ``train`` (users x items CSR).

        Args:
            train: observed ratings, CSR without explicit zeros (sorted indices when weighted).
            sample_weight: optional positive weight per stored rating, aligned with ``train.data``
                (CSR order); rescaled to mean 1. IPS passes 1 / propensity here. The global mean is
                the weighted mean of the ratings, so under IPS it estimates the population mean.
        """
        cfg = self.config
        for name in ("n_factors", "n_iters"):
            check_positive_integer(f"MFConfig.{name}", getattr(cfg, name))
        check_positive_finite("MFConfig.l2", cfg.l2)
        train = check_ratings(train, keep_order=sample_weight is not None)
        check_on_scale(train, cfg.rating_scale)
        n_users, n_items = train.shape
        weights = train.copy()
        weights.data = check_sample_weight(sample_weight, train.nnz)
        weights_t = weights.T.tocsr()
        mu = float(np.average(train.data, weights=weights.data))
        coo = train.tocoo()
        # Per-rating penalty = l2 * (number of ratings) on each row; max(.,1) keeps rating-less rows solvable.
        reg_u = cfg.l2 * np.maximum(np.diff(train.indptr), 1)
        reg_i = cfg.l2 * np.maximum(np.bincount(coo.col, minlength=n_items), 1)

        rng = np.random.default_rng(cfg.seed)
        p = rng.normal(0.0, cfg.init_std, size=(n_users, cfg.n_factors))
        q = rng.normal(0.0, cfg.init_std, size=(n_items, cfg.n_factors))
        bu, bi = np.zeros(n_users), np.zeros(n_items)

        def targets(resid: np.ndarray, transpose: bool) -> sp.csr_matrix:
            t = sp.csr_matrix((resid, (coo.row, coo.col)), shape=train.shape)
            return t.T.tocsr() if transpose else t

        for _ in range(cfg.n_iters):
            # User side: unknowns [p_u, b_u] against item features [q_i, 1].
            x = ridge_rows(weights, targets(coo.data - mu - bi[coo.col], False),
                           np.hstack([q, np.ones((n_items, 1))]), reg_u)
            p, bu = x[:, :-1], x[:, -1]
            y = ridge_rows(weights_t, targets(coo.data - mu - bu[coo.row], True),
                           np.hstack([p, np.ones((n_users, 1))]), reg_i)
            q, bi = y[:, :-1], y[:, -1]

        self.global_mean, self.user_bias, self.item_bias = mu, bu, bi
        self.user_factors, self.item_factors = p, q
        return self

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Predicted ratings for the (users[k], items[k]) pairs, clipped to ``rating_scale``. A user or item
        with no train rating keeps zero factors and bias, so it is predicted the train mean plus the other's
        bias."""
        pred = self.predict_unclipped(users, items)
        if self.config.rating_scale is not None:
            pred = np.clip(pred, *self.config.rating_scale)
        return pred

    def predict_unclipped(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """mu + b_u + b_i + p_u·q_i for the (users[k], items[k]) pairs, before clipping: the low-rank form
        that MF-DR's targets read the imputation model in."""
        check_fitted(self, "user_factors")
        u, i = check_pairs(users, items, (len(self.user_bias), len(self.item_bias)))
        return (self.global_mean + self.user_bias[u] + self.item_bias[i]
                + np.einsum("kf,kf->k", self.user_factors[u], self.item_factors[i]))
