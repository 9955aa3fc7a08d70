"""Biased matrix factorisation: r_ui ≈ mu + b_u + b_i + p_u·q_i, fitted to the observed ratings only.

Trained by mini-batch Adam in torch on a per-rating weighted squared loss, so inverse-propensity
scoring (``baselines.ips``) reuses it by passing ``sample_weight``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from baselines._checks import check_fitted, check_pairs, check_ratings, check_sample_weight


@dataclass
class MFConfig:
    """Hyper-parameters of biased MF.

    Defaults were chosen by a 10% validation split of the Coat *train* (MNAR) ratings with
    ``baselines.selection.select_config`` (never the MCAR test); they also train the Yahoo-sized
    problem (311k ratings) in a few seconds.

    Attributes:
        n_factors: latent dimension of p_u and q_i.
        l2: weight of the per-rating L2 penalty l2 * (|p_u|^2 + |q_i|^2 + b_u^2 + b_i^2), averaged over
            the ratings in a batch (the SGD-style penalty of Koren et al.; busy users are shrunk more
            in total, which is what a per-rating Gaussian prior amounts to).
        epochs: passes over the observed ratings.
        lr: Adam learning rate.
        batch_size: ratings per Adam step.
        init_std: standard deviation of the Gaussian factor initialisation (biases start at 0).
        rating_scale: predictions are clipped to this (low, high); None disables clipping.
        seed: seeds the initialisation and the batch order.
    """

    n_factors: int = 10
    l2: float = 0.3
    epochs: int = 80
    lr: float = 0.03
    batch_size: int = 4096
    init_std: float = 0.1
    rating_scale: tuple[float, float] | None = (1.0, 5.0)
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
            train: observed ratings; canonical CSR without explicit zeros.
            sample_weight: optional positive weight per stored rating, aligned with ``train.data``
                (CSR order); rescaled to mean 1. IPS passes 1 / propensity here. The global mean is
                the weighted mean of the ratings, so under IPS it estimates the population mean.
        """
        cfg = self.config
        if cfg.n_factors < 1 or cfg.epochs < 1 or cfg.batch_size < 1 or cfg.l2 < 0 or cfg.lr <= 0:
            raise ValueError(f"invalid MFConfig: {cfg}")
        train = check_ratings(train)
        w = check_sample_weight(sample_weight, train.nnz)
        coo = train.tocoo()
        n_users, n_items = train.shape
        gen = torch.Generator().manual_seed(cfg.seed)

        users = torch.from_numpy(coo.row.astype(np.int64))
        items = torch.from_numpy(coo.col.astype(np.int64))
        ratings = torch.from_numpy(coo.data).float()
        weights = torch.from_numpy(w).float()
        mu = float(np.average(coo.data, weights=w))

        p = torch.nn.Parameter(torch.randn(n_users, cfg.n_factors, generator=gen) * cfg.init_std)
        q = torch.nn.Parameter(torch.randn(n_items, cfg.n_factors, generator=gen) * cfg.init_std)
        bu = torch.nn.Parameter(torch.zeros(n_users))
        bi = torch.nn.Parameter(torch.zeros(n_items))
        opt = torch.optim.Adam([p, q, bu, bi], lr=cfg.lr)

        for _ in range(cfg.epochs):
            for idx in torch.randperm(train.nnz, generator=gen).split(cfg.batch_size):
                u, i = users[idx], items[idx]
                pu, qi, bu_b, bi_b = p[u], q[i], bu[u], bi[i]
                err = ratings[idx] - (mu + bu_b + bi_b + (pu * qi).sum(1))
                penalty = (pu.pow(2).sum(1) + qi.pow(2).sum(1) + bu_b.pow(2) + bi_b.pow(2)).mean()
                loss = (weights[idx] * err.pow(2)).mean() + cfg.l2 * penalty
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

        self.global_mean = mu
        self.user_bias, self.item_bias = bu.detach().double().numpy(), bi.detach().double().numpy()
        self.user_factors, self.item_factors = p.detach().double().numpy(), q.detach().double().numpy()
        return self

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Predicted ratings for the (users[k], items[k]) pairs, clipped to ``rating_scale``."""
        check_fitted(self, "user_factors")
        u, i = check_pairs(users, items, (len(self.user_bias), len(self.item_bias)))
        pred = (
            self.global_mean
            + self.user_bias[u]
            + self.item_bias[i]
            + np.einsum("kf,kf->k", self.user_factors[u], self.item_factors[i])
        )
        if self.config.rating_scale is not None:
            pred = np.clip(pred, *self.config.rating_scale)
        return pred
