"""Probabilistic matrix factorisation (Salakhutdinov & Mnih, NIPS 2007), MAP by alternating least squares.

Model: r_ui ~ N(mu + u_u·v_i, sigma^2), u_u ~ N(0, sigma_U^2 I), v_i ~ N(0, sigma_V^2 I). The MAP
estimate minimises  sum_obs (r_ui - mu - u_u·v_i)^2 + lambda_u |U|_F^2 + lambda_v |V|_F^2  with
lambda_u = sigma^2 / sigma_U^2 (likewise v). No user/item biases (as in the paper); ratings are centred
by the train mean ``mu`` (the usual preprocessing, standing in for the paper's [0, 1] rescaling with a
logistic link). Each half-step solves every user's (item's) ridge problem exactly and all at once
(``baselines._als.ridge_rows``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from baselines._als import ridge_rows
from baselines._checks import check_fitted, check_on_scale, check_pairs, check_ratings
from mnar_recsys.checks import check_positive_finite, check_positive_integer


# the grid PMFConfig's defaults were chosen on, and which `baselines.registry.tune_baseline` searches
PMF_GRID: tuple[dict[str, float], ...] = tuple({"n_factors": n, "lambda_u": lam, "lambda_v": lam} for n in (5, 10, 20)
                                               for lam in (1.0, 3.0, 5.0, 10.0, 20.0, 40.0))


@dataclass
class PMFConfig:
    """Hyper-parameters of PMF.

    Defaults chosen by a 10% validation split of the Coat *train* ratings
    (``baselines.selection.select_config``), never the MCAR test: over ``PMF_GRID``, n_factors {5, 10, 20}
    x lambda_u = lambda_v {1, 3, 5, 10, 20, 40}, the best was 20 / 5 (validation MSE 1.316). On another
    data set choose again (``baselines.registry.tune_baseline``).

    Attributes:
        n_factors: latent dimension.
        lambda_u: prior precision ratio sigma^2 / sigma_U^2 on user factors.
        lambda_v: prior precision ratio sigma^2 / sigma_V^2 on item factors.
        n_iters: ALS sweeps (each updates U then V); the objective decreases monotonically.
        init_std: standard deviation of the Gaussian initialisation of V.
        rating_scale: predictions are clipped to this (low, high); None disables clipping.
        seed: seeds the initialisation.
    """

    n_factors: int = 20
    lambda_u: float = 5.0
    lambda_v: float = 5.0
    n_iters: int = 20
    init_std: float = 0.1
    rating_scale: tuple[float, float] | None = (1.0, 5.0)
    seed: int = 0


class ProbabilisticMF:
    """PMF recommender (Recommender protocol)."""

    name = "pmf"

    def __init__(self, config: PMFConfig | None = None, **overrides: object) -> None:
        """Build from a ``PMFConfig`` or keyword overrides of its fields."""
        base = config or PMFConfig()
        self.config = PMFConfig(**{**base.__dict__, **overrides})
        self.global_mean: float | None = None
        self.user_factors: np.ndarray | None = None
        self.item_factors: np.ndarray | None = None

    def fit(self, train: sp.csr_matrix) -> "ProbabilisticMF":
        """MAP fit to the stored ratings of ``train`` (users x items CSR)."""
        cfg = self.config
        for name in ("n_factors", "n_iters"):
            check_positive_integer(f"PMFConfig.{name}", getattr(cfg, name))
        for name in ("lambda_u", "lambda_v"):
            check_positive_finite(f"PMFConfig.{name}", getattr(cfg, name))
        train = check_ratings(train)
        check_on_scale(train, cfg.rating_scale)
        mu = float(train.data.mean())
        resid = train.copy()
        resid.data -= mu
        mask = resid.copy()
        mask.data[:] = 1.0
        resid_t, mask_t = resid.T.tocsr(), mask.T.tocsr()

        rng = np.random.default_rng(cfg.seed)
        v = rng.normal(0.0, cfg.init_std, size=(train.shape[1], cfg.n_factors))
        for _ in range(cfg.n_iters):
            u = ridge_rows(mask, resid, v, cfg.lambda_u)
            v = ridge_rows(mask_t, resid_t, u, cfg.lambda_v)

        self.global_mean, self.user_factors, self.item_factors = mu, u, v
        return self

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Predicted ratings for the (users[k], items[k]) pairs, clipped to ``rating_scale``. A user or item
        with no train rating keeps zero factors and is predicted the train mean."""
        check_fitted(self, "user_factors")
        u, i = check_pairs(users, items, (len(self.user_factors), len(self.item_factors)))
        pred = self.global_mean + np.einsum("kf,kf->k", self.user_factors[u], self.item_factors[i])
        if self.config.rating_scale is not None:
            pred = np.clip(pred, *self.config.rating_scale)
        return pred
