"""Doubly robust joint learning, DR-JL (Wang, Zhang, Sun & Qi, ICML 2019), with MF or NFM predictions.

A prediction model r̂ (biased MF, ``mf-dr-jl``, or NFM, ``nfm-dr-jl``) and an imputation model r̃ (biased
MF) take Adam steps in turn. e = (r̂ - r)^2 and ê = (r̂ - r̃)^2 (the pseudo-label form, ``baselines.dr``).
Blocks of ``k1`` steps on batches B_O of ratings fit r̃ to sum_O w (ê - e)^2 + penalty, r̂ fixed; then ``k2``
steps fit r̂, r̃ fixed, to the DR loss, B_D drawn uniformly over all |D| = users x items cells:

    E_DR = (1/|D|) [ (|D|/|B_D|) sum_{B_D} ê + (|O|/|B_O|) sum_{B_O} w (e - ê) ]  +  penalty.

w = 1/p, self-normalised to add up to |D| over the ratings O as in ``baselines.dr``. (ê - e)^2 vanishes at
r̃ = r and at 2 r̂ - r, so both models start from one ALS fit (``baselines.mf``; by default MF-IPS, whose
biases start NFM's), r̃ near the ratings. The joint fit drifts once run long (r̃ slides away from its
start and r̂'s mean past the population's), so the length is a step count. Penalties: nu times the squared
embedding rows each pair reads, averaged over B_D for r̂, over B_O for r̃. Predictions: r̂, clipped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Literal

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from baselines.mf import MatrixFactorization, MFConfig
from baselines.propensities import (
    DEFAULT_MIN_RELATIVE,
    MaskPropensityConfig,
    mask_propensities,
    naive_bayes_propensities,
)
from mnar_recsys.checks import check_positive_finite, check_positive_integer
from mnar_recsys.checks.ratings import check_fitted, check_mcar_sample, check_on_scale, check_pairs, check_ratings

# the penalties ``baselines.registry.tune_baseline`` chooses nu from, on IPS-weighted held-out ratings
DRJL_GRID: tuple[dict[str, float], ...] = tuple({"nu": nu} for nu in (0.01, 0.03, 0.1, 0.3, 1.0))


# nu (and NFMDRJLConfig's) as tuned on Coat seed 0's held-out train ratings, IPS-weighted, over DRJL_GRID
@dataclass
class DRJLConfig:
    """Hyper-parameters of DR-JL with a biased-MF prediction model."""

    #: latent dimension of r̂ (in MF-DR-JL also of r̃ and of the ALS fit both start from).
    n_factors: int = 20
    #: penalty weight of the prediction model (see the module docstring).
    nu: float = 0.3
    #: penalty weight of the imputation model.
    imputation_nu: float = 0.1
    #: Adam step size of the prediction model.
    lr: float = 1e-3
    #: Adam step size of the imputation model.
    imputation_lr: float = 1e-3
    #: observed cells per step (|B_O|).
    batch_size: int = 1024
    #: uniformly drawn cells per observed cell in a prediction step (|B_D| / |B_O|).
    uniform_ratio: int = 1
    #: imputation steps per block.
    k1: int = 1
    #: prediction steps per block.
    k2: int = 1
    #: prediction steps in all (and k1 / k2 as many imputation steps). Steps rather than epochs: Adam moves a parameter
    #: by about ``lr`` a step whatever the data's size, and the fit drifts once run long, so one length suits small and
    #: large data alike.
    n_steps: int = 1000
    #: per-rating l2 of the starting MF fit (``MFConfig.l2``).
    init_l2: float = 0.2
    #: ALS sweeps of the starting MF fit.
    init_iters: int = 15
    #: start from the MF fit weighted by the inverse propensities (MF-IPS) rather than plain MF.
    weighted_start: bool = True
    #: predictions are clipped to this (low, high); None disables clipping.
    rating_scale: tuple[float, float] | None = (1.0, 5.0)
    #: seeds the starting fit, the initialisation and the batches.
    seed: int = 0


@dataclass
class NFMDRJLConfig(DRJLConfig):
    """DR-JL with an NFM prediction model (He & Chua 2017): ``DRJLConfig``'s fields, NFM's factor count and a
    penalty chosen for NFM, and

    Attributes:
        layers: widths of the ReLU layers on the bi-interaction v_u * v_i.
        keep_bi: dropout keep probability on the bi-interaction.
        keep_mlp: dropout keep probability after each ReLU layer.
        init_std: standard deviation of the NFM embeddings' Gaussian initialisation.
        imputation_factors: latent dimension of the imputation MF r̃ and of the ALS fit it starts from (whose
            cost grows with its cube).
    """

    n_factors: int = 64
    nu: float = 0.1
    layers: tuple[int, ...] = (64,)
    keep_bi: float = 0.5
    keep_mlp: float = 0.8
    init_std: float = 0.01
    imputation_factors: int = 20


def _tensor(values: np.ndarray) -> torch.Tensor:
    """A float32 copy: single precision halves the cost of dropout's noise and of the steps."""
    return torch.tensor(values, dtype=torch.float32)


def _row_penalty(module: nn.Module, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """Mean over the pairs of the squared factors and biases each reads."""
    return (module.user_factors[users].square().sum(1) + module.item_factors[items].square().sum(1)
            + module.user_bias[users].square() + module.item_bias[items].square()).mean()


class BiasedMF(nn.Module):
    """mu + b_u + b_i + p_u·q_i, its parameters copied from a fitted ``MatrixFactorization``."""

    def __init__(self, start: MatrixFactorization) -> None:
        super().__init__()
        self.mu = nn.Parameter(torch.tensor(start.global_mean, dtype=torch.float32))
        self.user_bias = nn.Parameter(_tensor(start.user_bias))
        self.item_bias = nn.Parameter(_tensor(start.item_bias))
        self.user_factors = nn.Parameter(_tensor(start.user_factors))
        self.item_factors = nn.Parameter(_tensor(start.item_factors))

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return (self.mu + self.user_bias[users] + self.item_bias[items]
                + (self.user_factors[users] * self.item_factors[items]).sum(1))

    def penalty(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return _row_penalty(self, users, items)


class SeededDropout(nn.Module):
    """Inverted dropout drawing its masks from a given generator (``nn.Dropout`` draws from torch's global one,
    so a seed would not repeat a fit)."""

    def __init__(self, keep: float, generator: torch.Generator) -> None:
        super().__init__()
        self.keep, self.generator = keep, generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.keep == 1.0:
            return x
        return x * (torch.rand(x.shape, generator=self.generator) < self.keep) / self.keep


class NFM(nn.Module):
    """NFM on user and item one-hots: w0 + w_u + w_i + h^T MLP(v_u * v_i), BN and dropout on the
    bi-interaction and after each ReLU layer; w0, w_u and w_i start at an MF fit's mean and biases."""

    def __init__(self, start: MatrixFactorization, cfg: NFMDRJLConfig, generator: torch.Generator) -> None:
        super().__init__()
        n_users, n_items = len(start.user_bias), len(start.item_bias)
        self.w0 = nn.Parameter(torch.tensor(start.global_mean, dtype=torch.float32))
        self.user_bias = nn.Parameter(_tensor(start.user_bias))
        self.item_bias = nn.Parameter(_tensor(start.item_bias))
        normal = torch.randn(n_users + n_items, cfg.n_factors, generator=generator)
        self.user_factors = nn.Parameter(cfg.init_std * normal[:n_users])
        self.item_factors = nn.Parameter(cfg.init_std * normal[n_users:])
        blocks: list[nn.Module] = [nn.BatchNorm1d(cfg.n_factors), SeededDropout(cfg.keep_bi, generator)]
        width = cfg.n_factors
        for out in cfg.layers:
            blocks += [nn.Linear(width, out), nn.ReLU(), nn.BatchNorm1d(out), SeededDropout(cfg.keep_mlp, generator)]
            width = out
        self.mlp = nn.Sequential(*blocks)
        self.h = nn.Linear(width, 1, bias=False)
        with torch.no_grad():  # Glorot weights, as NFM's; drawn from the seeded generator
            for layer in [*self.mlp, self.h]:
                if isinstance(layer, nn.Linear):
                    bound = (6.0 / sum(layer.weight.shape)) ** 0.5
                    layer.weight.copy_((2 * torch.rand(layer.weight.shape, generator=generator) - 1) * bound)
                    if layer.bias is not None:
                        layer.bias.zero_()

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        interaction = self.user_factors[users] * self.item_factors[items]
        return self.w0 + self.user_bias[users] + self.item_bias[items] + self.h(self.mlp(interaction)).squeeze(1)

    def penalty(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return _row_penalty(self, users, items)  # the MLP, as NFM's, has dropout instead


class DoublyRobustJointMF:
    """MF-DR-JL recommender (Recommender protocol).

    Args:
        propensity: ``"naive-bayes"`` (name ``mf-dr-jl``; needs an MCAR sample) or ``"mask"``
            (``mf-dr-jl-mask``; ``baselines.propensities.mask_propensities``, no MCAR data).
        config: a ``DRJLConfig``, or keyword overrides of its fields.
        mcar_sample: MCAR ratings for the Naive-Bayes propensities; may instead be given to ``fit``.
        min_relative: propensity clip, see ``baselines.propensities``.
        mask_config: the mask model's settings (``mask`` variant); its seed follows ``config.seed`` unless given.
    """

    NAMES: ClassVar[dict[str, str]] = {"naive-bayes": "mf-dr-jl", "mask": "mf-dr-jl-mask"}
    CONFIG: ClassVar[type[DRJLConfig]] = DRJLConfig

    def __init__(self, propensity: Literal["naive-bayes", "mask"] = "naive-bayes", config: DRJLConfig | None = None,
                 mcar_sample: sp.csr_matrix | None = None, min_relative: float = DEFAULT_MIN_RELATIVE,
                 mask_config: MaskPropensityConfig | None = None, **overrides: object) -> None:
        if propensity not in self.NAMES:
            raise ValueError(f"propensity must be one of {', '.join(map(repr, self.NAMES))}, got {propensity!r}")
        if propensity != "naive-bayes" and mcar_sample is not None:
            raise ValueError(f"the {propensity!r} variant uses no MCAR data; do not pass mcar_sample")
        if mask_config is not None and mask_config.min_relative != min_relative:
            raise ValueError(f"min_relative {min_relative} and mask_config.min_relative {mask_config.min_relative} "
                             "differ: the mask model clips by its config's; give one")
        base = config or self.CONFIG()
        known = {f.name for f in fields(self.CONFIG)}
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"unknown {self.CONFIG.__name__} fields: {', '.join(sorted(unknown))}")
        self.config = self.CONFIG(**{**asdict(base), **overrides})
        self.propensity = propensity
        self.name = self.NAMES[propensity]
        self.mcar_sample = mcar_sample
        self.min_relative = min_relative
        self.mask_config = mask_config or MaskPropensityConfig(min_relative=min_relative, seed=self.config.seed)
        self.train_propensities: np.ndarray | None = None
        self.prediction: nn.Module | None = None
        self.imputation: BiasedMF | None = None

    def settings(self) -> dict[str, Any]:
        """The config and how the propensities are estimated, for a results record."""
        return {**asdict(self.config), "propensities": self.propensity_settings()}

    def propensity_settings(self) -> dict[str, Any]:
        """How the propensities are estimated, for a results record."""
        if self.propensity == "naive-bayes":
            return {"estimator": "naive-bayes", "min_relative": self.min_relative}
        return {"estimator": "mask", **asdict(self.mask_config)}

    def _check_config(self) -> None:
        cfg = self.config
        for name in ("n_factors", "batch_size", "uniform_ratio", "k1", "k2", "n_steps", "init_iters"):
            check_positive_integer(f"{type(cfg).__name__}.{name}", getattr(cfg, name))
        for name in ("nu", "imputation_nu", "lr", "imputation_lr", "init_l2"):
            check_positive_finite(f"{type(cfg).__name__}.{name}", getattr(cfg, name))

    def _estimate_propensities(self, train: sp.csr_matrix, mcar_sample: sp.csr_matrix | None) -> np.ndarray:
        """P(O_ui = 1) of each stored rating of ``train`` (checked CSR), aligned with ``train.data``."""
        if mcar_sample is not None and self.propensity != "naive-bayes":
            raise ValueError(f"the {self.propensity!r} variant uses no MCAR data; do not pass mcar_sample")
        if self.propensity == "mask":
            return mask_propensities(train, self.mask_config)
        sample = check_mcar_sample(self.name, train, mcar_sample, self.mcar_sample)
        return naive_bayes_propensities(train, sample, min_relative=self.min_relative)(train.data)

    def _prediction_model(self, start: MatrixFactorization, generator: torch.Generator) -> nn.Module:
        return BiasedMF(start)

    def _imputation_factors(self) -> int:
        return self.config.n_factors  # r̂ starts as r̃ does

    def fit(self, train: sp.csr_matrix, *, mcar_sample: sp.csr_matrix | None = None) -> DoublyRobustJointMF:
        """Estimate the propensities of ``train``'s ratings, fit the starting MF, then alternate the two
        models' steps. ``mcar_sample`` (Naive-Bayes variant) overrides the constructor's; it must have
        ``train``'s shape and be disjoint from the ratings later scored."""
        cfg = self.config
        self._check_config()
        train = check_ratings(train)
        check_on_scale(train, cfg.rating_scale)  # before the propensity model, the slow part
        self.train_propensities = self._estimate_propensities(train, mcar_sample)
        start = MatrixFactorization(MFConfig(n_factors=self._imputation_factors(), l2=cfg.init_l2,
                                             n_iters=cfg.init_iters, rating_scale=None, seed=cfg.seed))
        start.fit(train, sample_weight=1.0 / self.train_propensities if cfg.weighted_start else None)
        generator = torch.Generator().manual_seed(cfg.seed)
        self.prediction = self._prediction_model(start, generator)
        self.imputation = BiasedMF(start)
        self._train(train, generator)
        self.prediction.eval()
        return self

    def _train(self, train: sp.csr_matrix, generator: torch.Generator) -> None:
        cfg = self.config
        n_users, n_items = train.shape
        self.n_cells, self.n_observed = n_users * n_items, train.nnz
        inverse = 1.0 / self.train_propensities
        self.cell_weights = _tensor(inverse * (self.n_cells / inverse.sum()))  # adds up to |D| over O
        users = torch.from_numpy(np.repeat(np.arange(n_users), np.diff(train.indptr)))
        items = torch.from_numpy(train.indices.astype(np.int64))
        ratings = _tensor(train.data)
        optimise_prediction = torch.optim.Adam(self.prediction.parameters(), lr=cfg.lr)
        optimise_imputation = torch.optim.Adam(self.imputation.parameters(), lr=cfg.imputation_lr)
        n_uniform = cfg.batch_size * cfg.uniform_ratio

        def observed_batch() -> tuple[torch.Tensor, ...]:
            pick = torch.randint(train.nnz, (cfg.batch_size,), generator=generator)
            return users[pick], items[pick], ratings[pick], self.cell_weights[pick]

        for _ in range(-(-cfg.n_steps // cfg.k2)):
            for _ in range(cfg.k1):
                u, i, r, w = observed_batch()
                loss = self.imputation_loss(u, i, r, w) + cfg.imputation_nu * self.imputation.penalty(u, i)
                optimise_imputation.zero_grad()
                loss.backward()
                optimise_imputation.step()
            self.prediction.train()
            for _ in range(cfg.k2):
                u, i, r, w = observed_batch()
                du = torch.randint(n_users, (n_uniform,), generator=generator)
                di = torch.randint(n_items, (n_uniform,), generator=generator)
                loss = self.dr_loss(du, di, u, i, r, w) + cfg.nu * self.prediction.penalty(du, di)
                optimise_prediction.zero_grad()
                loss.backward()
                optimise_prediction.step()

    def dr_loss(self, users_d: torch.Tensor, items_d: torch.Tensor, users_o: torch.Tensor, items_o: torch.Tensor,
                ratings_o: torch.Tensor, weights_o: torch.Tensor) -> torch.Tensor:
        """E_DR of the module docstring, penalty apart, on uniform pairs B_D and observed cells B_O with their
        ratings and weights w (adding up to |D| over all of O), r̃ held fixed. Both batches go through r̂ in
        one pass, so NFM's batch norm sees them together."""
        n_d = len(users_d)
        rhat = self.prediction(torch.cat([users_d, users_o]), torch.cat([items_d, items_o]))
        with torch.no_grad():
            rtilde = self.imputation(torch.cat([users_d, users_o]), torch.cat([items_d, items_o]))
        imputed = (rhat - rtilde).square()
        error_o = (rhat[n_d:] - ratings_o).square()
        direct = imputed[:n_d].sum() * (self.n_cells / n_d)
        correction = (weights_o * (error_o - imputed[n_d:])).sum() * (self.n_observed / len(users_o))
        return (direct + correction) / self.n_cells

    def imputation_loss(self, users: torch.Tensor, items: torch.Tensor, ratings: torch.Tensor,
                        weights: torch.Tensor) -> torch.Tensor:
        """(1/|O|) (|O|/|B_O|) sum_{B_O} w (ê - e)^2 / mean_O(w): the imputation loss per rating, r̂ held fixed
        (in eval mode: no dropout, batch norm's running statistics)."""
        with torch.no_grad():
            was_training = self.prediction.training
            self.prediction.eval()
            rhat = self.prediction(users, items)
            self.prediction.train(was_training)
        imputed = (rhat - self.imputation(users, items)).square()
        relative = weights * (self.n_observed / self.n_cells)  # mean 1 over O
        return (relative * (imputed - (rhat - ratings).square()).square()).mean()

    def _scores(self, module: nn.Module, users: np.ndarray, items: np.ndarray, block: int = 65_536) -> np.ndarray:
        u, i = check_pairs(users, items, (len(module.user_bias), len(module.item_bias)))
        module.eval()
        with torch.no_grad():
            return np.concatenate([module(torch.from_numpy(u[s:s + block]), torch.from_numpy(i[s:s + block])).numpy()
                                   for s in range(0, len(u), block)] or [np.empty(0)]).astype(np.float64)

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """r̂ for the (users[k], items[k]) pairs, clipped to ``rating_scale``."""
        check_fitted(self, "prediction")
        pred = self._scores(self.prediction, users, items)
        if self.config.rating_scale is not None:
            pred = np.clip(pred, *self.config.rating_scale)
        return pred

    def imputed_errors(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """ê = (r̂ - r̃)^2 for the pairs, r̂ unclipped: what the imputation model says r̂'s squared error is."""
        check_fitted(self, "imputation")
        return (self._scores(self.prediction, users, items) - self._scores(self.imputation, users, items)) ** 2


class DoublyRobustJointNFM(DoublyRobustJointMF):
    """NFM-DR-JL recommender: ``DoublyRobustJointMF`` with an NFM prediction model (``NFMDRJLConfig``)."""

    NAMES: ClassVar[dict[str, str]] = {"naive-bayes": "nfm-dr-jl", "mask": "nfm-dr-jl-mask"}
    CONFIG = NFMDRJLConfig

    def _check_config(self) -> None:
        super()._check_config()
        cfg = self.config
        for width in cfg.layers:
            check_positive_integer("NFMDRJLConfig.layers", width)
        for name in ("keep_bi", "keep_mlp"):
            value = getattr(cfg, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"NFMDRJLConfig.{name} must be in (0, 1], got {value!r}")
        check_positive_finite("NFMDRJLConfig.init_std", cfg.init_std)
        check_positive_integer("NFMDRJLConfig.imputation_factors", cfg.imputation_factors)

    def _prediction_model(self, start: MatrixFactorization, generator: torch.Generator) -> nn.Module:
        return NFM(start, self.config, generator)

    def _imputation_factors(self) -> int:
        return self.config.imputation_factors
