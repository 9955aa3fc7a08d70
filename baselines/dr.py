"""MF-DR: biased MF trained on the doubly robust estimate of its squared error over every cell (Dudík et
al., 2011; for ratings Wang, Zhang, Sun & Qi, ICML 2019).

Two biased MFs of ``baselines.mf``'s form: the imputation model r̃, the MF-IPS fit with MF-IPS's own
settings and the same propensities, and the prediction model r̂. A cell's error is e = (r̂ - r)^2 and its
imputed error ê = (r̂ - r̃)^2, the squared gap to the imputation model's rating (the pseudo-label form of
Guo et al., 2021). The prediction model minimises the DR loss

    sum_all cells [ê + o (e - ê) / p]  +  l2 x (cells per row or column) x its squared parameters,

an estimate of the squared error over all cells that is right on average when either the propensities p
or the imputed errors are. With r̃ fixed, e and ê are squares in r̂ whose coefficients add up to 1 in every
cell, so the loss is sum_all (r̂ - t)^2 up to a constant, t = r̃ + o (r - r̃) / p: a least-squares fit to
every cell, done by ALS whose normal equations read r̃ through its factors. No users x items matrix is
formed: a sweep costs O((users + items) k^2 + ratings k). The penalty is MF's per-rating one, counted per
cell.

The inverse propensities are rescaled to add up to the number of cells, their expectation under correct
propensities (the self-normalised form, consistent rather than unbiased; the mask model's propensities
are relative weights only, ``baselines.propensities``). The variants are MF-IPS's (``baselines.ips``):
``mf-dr`` (Naive Bayes from an MCAR sample), ``mf-dr-mask`` and ``mf-dr-given``.

A rare rating's target lies far off the scale (1/p times its gap to r̃), so the penalty that the held-out
ratings choose is strong enough to leave little of the factors (``DR_L2``), and on Coat and the simulator
MF-DR scores above MF-IPS, the r̃ it starts from (README).

Wang et al.'s MF-DR-JL, the not-MIWAE paper's row (0.966 on Yahoo! R3, MF-IPS 0.989), also refits r̃, in
turn with r̂, to make ê match e on the observed ratings: sum_obs (ê - e)^2 / p. With ê in the pseudo-label
form r̃ enters that loss only through |r̂ - r̃|, so r̃ = r and its mirror image 2 r̂ - r fit a rating equally
well, and nothing ties r̃ to the ratings. Tried here (``bench/dr_joint_learning.py``, seed 0, 30 rounds),
it took r̃'s own MCAR MSE from 0.920 to 1.6-1.8 on the main simulator and from 1.131 to 1.4-1.5 on Coat,
and r̂'s from 0.963 to about 1.5 and from 1.176 to about 1.23, whether each round moved r̃ all the way or
30% of the way to its step's optimum (the partial steps passed 0.936 on the simulator at round 5
on the way up). So r̃ stays at the MF-IPS fit.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np
import scipy.sparse as sp

from baselines._als import shared_ridge
from baselines.ips import IPSMatrixFactorization
from baselines.mf import MatrixFactorization, MFConfig
from mnar_recsys.checks import check_positive_finite, check_positive_integer
from mnar_recsys.checks.ratings import check_on_scale, check_ratings

# chosen as MF's defaults were, by the IPS estimate on 10% of Coat's train ratings held out over MF_GRID
# (``baselines.registry.tune_baseline``, seed 0): 0.3, n_factors mattering little (1.065 to 1.067; 0.2: 1.117,
# 0.5: 1.086, n_factors 20). The per-cell penalty thresholds the targets' spectrum, so the factors nearly
# vanish there (sd of p·q 0.056 on Coat, seed 0; 0.40 at 0.2, none left at 0.5): the noise of the rare
# ratings' targets outweighs their low-rank signal. That choice weighed the held-out ratings by Naive-Bayes
# propensities from seed 0's 5% MCAR sample, which other seeds' scoring sets partly hold; the variant that
# needs no MCAR data (mf-dr-mask) picks 0.2 instead, by a hair (1.1607 against 1.1615 at 0.3).
DR_L2 = 0.3


class DoublyRobustMF(IPSMatrixFactorization):
    """MF-DR recommender (Recommender protocol), built as MF-IPS is (``baselines.ips.IPSMatrixFactorization``:
    the propensity variant, ``MFConfig`` or its fields, the MCAR sample, the clip, the mask model's settings,
    the given propensities), those of the imputation model r̃ apart. After ``fit``, ``imputation`` holds r̃."""

    NAMES = {"naive-bayes": "mf-dr", "mask": "mf-dr-mask", "given": "mf-dr-given"}
    imputation: MatrixFactorization | None = None

    def __init__(self, propensity: str = "naive-bayes", config: MFConfig | None = None,
                 imputation_config: MFConfig | None = None, **kwargs: object) -> None:
        """``config`` sets the prediction model r̂, its l2 per cell (when omitted, MF's defaults but for
        ``DR_L2``); ``imputation_config`` the MF-IPS fit r̃ (when omitted, MF-IPS's own with r̂'s seed and
        rating scale, so that r̃ is the ``mf-ips`` model of that seed; when given, its own seed and scale).
        Other keywords as for MF-IPS."""
        super().__init__(propensity, config or MFConfig(l2=DR_L2), **kwargs)
        self.imputation_config = imputation_config or MFConfig(seed=self.config.seed,
                                                               rating_scale=self.config.rating_scale)

    def settings(self) -> dict[str, Any]:
        """The prediction model's config, the propensities' and the imputation model's, for a results record."""
        return {**super().settings(), "imputation": asdict(self.imputation_config)}

    def fit(self, train: sp.csr_matrix, *, mcar_sample: sp.csr_matrix | None = None) -> "DoublyRobustMF":
        """Estimate the propensities of ``train``'s ratings, fit r̃ as MF-IPS, then r̂ to the DR loss.
        ``mcar_sample`` as for MF-IPS."""
        train = check_ratings(train)
        for config in (self.config, self.imputation_config):  # both before the propensity model, the slow part
            for name in ("n_factors", "n_iters"):
                check_positive_integer(f"MFConfig.{name}", getattr(config, name))
            check_positive_finite("MFConfig.l2", config.l2)
            check_on_scale(train, config.rating_scale)
        self.train_propensities = self._estimate_propensities(train, mcar_sample)
        inverse = 1.0 / self.train_propensities
        self.imputation = MatrixFactorization(self.imputation_config).fit(train, sample_weight=inverse)
        self.fit_prediction(train, self.imputation, inverse * (train.shape[0] * train.shape[1] / inverse.sum()))
        return self

    def fit_prediction(self, train: sp.csr_matrix, imputation: MatrixFactorization, cell_weight: np.ndarray) -> None:
        """Fit r̂ to sum_all (r̂ - t)^2 + penalty, t = r̃ + o w (r - r̃), by ``config.n_iters`` ALS sweeps from
        random item factors (``config.init_std``, ``config.seed``): ``train`` checked CSR, ``cell_weight`` w aligned
        with its ratings."""
        n_users, n_items = train.shape
        rows = np.repeat(np.arange(n_users), np.diff(train.indptr))
        correction = sp.csr_matrix((cell_weight * (train.data - imputation.predict_unclipped(rows, train.indices)),
                                    train.indices, train.indptr), shape=train.shape)
        # r̃ = left @ right.T: the biases and the global mean meet a column of ones on the other side
        left = np.column_stack([imputation.user_factors, imputation.user_bias, np.ones(n_users)])
        right = np.column_stack([imputation.item_factors, np.ones(n_items),
                                 imputation.global_mean + imputation.item_bias])
        mu = float(left.mean(0) @ right.mean(0) + correction.sum() / (n_users * n_items))  # the mean of t
        cfg = self.config
        q = np.random.default_rng(cfg.seed).normal(0.0, cfg.init_std, size=(n_items, cfg.n_factors))
        bi = np.zeros(n_items)
        for _ in range(cfg.n_iters):
            # each side's unknowns [factors, bias] against the other side's [factors, 1], as in MF's ALS
            items = np.column_stack([q, np.ones(n_items)])
            x = shared_ridge(items, left @ (right.T @ items) + correction @ items - (mu + bi) @ items,
                              cfg.l2 * n_items)
            p, bu = x[:, :-1], x[:, -1]
            users = np.column_stack([p, np.ones(n_users)])
            y = shared_ridge(users, right @ (left.T @ users) + correction.T @ users - (mu + bu) @ users,
                              cfg.l2 * n_users)
            q, bi = y[:, :-1], y[:, -1]
        self.global_mean, self.user_bias, self.item_bias = mu, bu, bi
        self.user_factors, self.item_factors = p, q

