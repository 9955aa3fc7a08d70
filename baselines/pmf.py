"""Probabilistic matrix factorisation (Salakhutdinov & Mnih, NIPS 2007), MAP by alternating least squares.

Model: r_ui ~ N(mu + u_u·v_i, sigma^2), u_u ~ N(0, sigma_U^2 I), v_i ~ N(0, sigma_V^2 I). The MAP
estimate minimises  sum_obs (r_ui - mu - u_u·v_i)^2 + lambda_u |U|_F^2 + lambda_v |V|_F^2  with
lambda_u = sigma^2 / sigma_U^2 (likewise v): a fixed prior per side, not MF's per-rating penalty. Ratings
are centred by the train mean ``mu``, so the prior shrinks toward it (the usual linear form of PMF;
the paper's logistic link on ratings mapped to [0, 1] would shrink toward the scale's midpoint, and
an uncentred prior toward 0, i.e. the lowest rating once clipped). ``biases=True`` adds b_u and b_i, each
under its side's prior (one more coordinate of u_u and v_i). Each half-step solves every user's (item's)
ridge problem exactly and all at once (``baselines._als.ridge_rows``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from baselines._als import ridge_rows
from mnar_recsys.checks import check_positive_finite, check_positive_integer
from mnar_recsys.checks.ratings import check_fitted, check_on_scale, check_pairs, check_ratings

# the grid PMFConfig's defaults were chosen on, and which `baselines.registry.tune_baseline` searches
PMF_GRID: tuple[dict[str, float], ...] = tuple({"n_factors": n, "lambda_u": lam, "lambda_v": lam} for n in (5, 10, 20)
                                               for lam in (1.0, 3.0, 5.0, 10.0, 20.0, 40.0))


@dataclass
class PMFConfig:
    """Hyper-parameters of PMF.

    Defaults chosen by a 10% validation split of the Coat *train* ratings
    (``baselines.selection.select_config``), never the MCAR test: with and without biases, over ``PMF_GRID``'s
    n_factors {5, 10, 20} x lambda_u = lambda_v {1, 3, 5, 10, 20, 40}, the best was biases with 20 / 5
    (validation MSE 1.151, against 1.316 at best without). On another data set choose n_factors and the
    lambdas again (``baselines.registry.tune_baseline``).
    """

    #: latent dimension.
    n_factors: int = 20
    #: prior precision ratio sigma^2 / sigma_U^2 on user factors.
    lambda_u: float = 5.0
    #: prior precision ratio sigma^2 / sigma_V^2 on item factors.
    lambda_v: float = 5.0
    #: add a user and an item bias, penalised like their side's factors.
    biases: bool = True
    #: ALS sweeps (each updates U then V); the objective decreases monotonically.
    n_iters: int = 20
    #: standard deviation of the Gaussian initialisation of V.
    init_std: float = 0.1
    #: predictions are clipped to this (low, high); None disables clipping.
    rating_scale: tuple[float, float] | None = (1.0, 5.0)
    #: seeds the initialisation.
    seed: int = 0


class ProbabilisticMF:
    """PMF recommender (Recommender protocol)."""

    name = "pmf"

    def __init__(self, config: PMFConfig | None = None, **overrides: object) -> None:
        """Build from a ``PMFConfig`` or keyword overrides of its fields."""
        base = config or PMFConfig()
        self.config = PMFConfig(**{**base.__dict__, **overrides})
        self.global_mean: float | None = None
        self.user_bias: np.ndarray | None = None
        self.item_bias: np.ndarray | None = None
        self.user_factors: np.ndarray | None = None
        self.item_factors: np.ndarray | None = None

    def fit(self, train: sp.csr_matrix) -> "ProbabilisticMF":
        """MAP fit to the stored ratings of ``train`` (users x items CSR)."""
        cfg = self.config
        for name in ("n_factors", "n_iters"):
            check_positive_integer(f"PMFConfig.{name}", getattr(cfg, name))
        for name in ("lambda_u", "lambda_v"):
            check_positive_finite(f"PMFConfig.{name}", getattr(cfg, name))
        if not isinstance(cfg.biases, bool):
            raise ValueError(f"PMFConfig.biases must be True or False, got {cfg.biases!r}")
        train = check_ratings(train)
        check_on_scale(train, cfg.rating_scale)
        mu = float(train.data.mean())
        coo = train.tocoo()
        mask = train.copy()
        mask.data[:] = 1.0
        mask_t = mask.T.tocsr()
        n_users, n_items = train.shape
        # without biases, each side's regressors get a constant column whose coefficient is pinned at 0
        keep = 1.0 if cfg.biases else 0.0

        def targets(resid: np.ndarray, transpose: bool) -> sp.csr_matrix:
            t = sp.csr_matrix((resid, (coo.row, coo.col)), shape=train.shape)
            return t.T.tocsr() if transpose else t

        rng = np.random.default_rng(cfg.seed)
        v = rng.normal(0.0, cfg.init_std, size=(n_items, cfg.n_factors))
        bu, bi = np.zeros(n_users), np.zeros(n_items)
        for _ in range(cfg.n_iters):
            x = ridge_rows(mask, targets(coo.data - mu - bi[coo.col], False),
                           np.hstack([v, np.full((n_items, 1), keep)]), cfg.lambda_u)
            u, bu = x[:, :-1], x[:, -1]
            y = ridge_rows(mask_t, targets(coo.data - mu - bu[coo.row], True),
                           np.hstack([u, np.full((n_users, 1), keep)]), cfg.lambda_v)
            v, bi = y[:, :-1], y[:, -1]

        self.global_mean, self.user_bias, self.item_bias = mu, bu, bi
        self.user_factors, self.item_factors = u, v
        return self

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Predicted ratings for the (users[k], items[k]) pairs, clipped to ``rating_scale``. A user or item
        with no train rating keeps zero factors and bias, so it is predicted the train mean plus the other's
        bias."""
        check_fitted(self, "user_factors")
        u, i = check_pairs(users, items, (len(self.user_factors), len(self.item_factors)))
        pred = (self.global_mean + self.user_bias[u] + self.item_bias[i]
                + np.einsum("kf,kf->k", self.user_factors[u], self.item_factors[i]))
        if self.config.rating_scale is not None:
            pred = np.clip(pred, *self.config.rating_scale)
        return pred
