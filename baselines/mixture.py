"""Multinomial mixture for ratings 1..V (Marlin et al., UAI 2007), with or without a missing model, by MAP-EM.

User n has a component z_n ~ Cat(theta); given z = k every item's rating x_nd ~ Cat(beta_.dk), and it is
observed (r_nd = 1) with probability mu_vd when x_nd = v (``baselines.mixture_missing``). Priors:
Dirichlet(alpha) on theta and on each beta_.dk. Without a missing model (``mixture``) the unobserved cells
are ignored (MAR). With one, an unobserved cell contributes g_dk = sum_v (1 - mu_vd) beta_vdk, and its
rating's posterior given component k is phi_vdk = (1 - mu_vd) beta_vdk / g_dk, the same for every user.

The sums over the unobserved cells are all-items sums minus the observed items (sum_{d not in O_n} log g_dk
= sum_d log g_dk - sum_{d in O_n} log g_dk, and sum_{n: r_nd = 0} q_nk = Q_k - S_dk), so an iteration costs
O(nnz K + V D K) and never builds a users x items array. Everything is in log space. A prediction for a
cell unobserved in train is sum_k q_nk sum_v v phi_vdk (sum_v v beta_vdk for ``mixture``), q_n being the
user's posterior over components given the train ratings and mask.
"""

from __future__ import annotations

import copy
import numbers
import warnings
from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np
import scipy.sparse as sp
from scipy.special import logit, logsumexp
from sklearn.exceptions import ConvergenceWarning

from baselines.mixture_missing import CPTv, LogitVD
from baselines.propensities import naive_bayes_propensities
from mnar_recsys.checks import check_positive_finite, check_positive_integer
from mnar_recsys.checks.ratings import check_fitted, check_mcar_sample, check_on_scale, check_pairs, check_ratings

# the grid for choosing n_components and alpha on held-out train ratings (``baselines.selection.select_config``)
MIXTURE_GRID: tuple[dict[str, float], ...] = tuple({"n_components": k, "alpha": a} for k in (5, 10, 20)
                                                   for a in (1.5, 2.0, 5.0, 10.0))


@dataclass
class MixtureConfig:
    """Hyper-parameters of the multinomial mixture and its missing models.

    n_components and alpha follow the public re-implementation (dgliu/TKDE_Spiral); held-out train ratings
    prefer other values on other data sets, so choose them with ``MIXTURE_GRID`` and
    ``baselines.selection.select_config``. The missing models' prior strengths cannot be chosen that way
    (held-out ratings are MNAR and favour the MAR fit); their defaults are set per prior centre, see below.
    """

    #: number of mixture components K.
    n_components: int = 10
    #: Dirichlet concentration on theta and every beta_.dk; above 1, so every MAP probability is > 0.
    alpha: float = 2.0
    #: CPT-v: pseudo-cells per level in the Beta prior on mu_v (see ``CPTv``), as a fraction of the users x items
    #: cells; None: ``WEAK_PRIOR`` for ``prior="train"``, ``TIGHT_PRIOR`` for "mcar".
    prior_strength: float | None = None
    #: Logit-vd: prior standard deviation of the level logits omega_v around their centre; None: ``WEAK_PRIOR`` or
    #: ``TIGHT_PRIOR`` as for prior_strength.
    omega_sd: float | None = None
    #: Logit-vd: prior standard deviation of the item logits psi_d around 0.
    psi_sd: float = 10.0
    #: Logit-vd: L-BFGS iterations per M-step.
    m_step_iters: int = 20
    #: most EM steps (M-steps; a ConvergenceWarning says when they ran out).
    max_iter: int = 2000
    #: EM stops once an iteration (a SQUAREM cycle when accelerated) raises the log posterior by less than tol times
    #: its magnitude.
    tol: float = 1e-7
    #: SQUAREM extrapolation of the EM steps (see ``_squarem_cycle``): EM crawls here, as nearly all cells are missing;
    #: every kept cycle still raises the log posterior. False runs plain EM.
    accelerate: bool = True
    #: integer (low, high): the levels are low..high; predictions are clipped to it.
    rating_scale: tuple[float, float] = (1.0, 5.0)
    #: seeds the random initial assignment of users to components.
    seed: int = 0


# prior_strength / omega_sd when the config leaves them None. Around the train density (MCAR) the prior is weak:
# a tight one would pin the missing model to MAR. Around the Naive-Bayes propensities it is tight: trusting them
# is the point of that variant, and the likelihood alone lets mu drift along a weakly identified ridge.
WEAK_PRIOR = {"prior_strength": 1e-4, "omega_sd": 1.0}
TIGHT_PRIOR = {"prior_strength": 1.0, "omega_sd": 0.01}

_SQUAREM_TRIES = 3  # extrapolations tried per cycle, each nearer the plain EM steps
# an E-step's result: responsibilities (N x K), log posterior, log g (D x K; None without a missing model)
_State = tuple[np.ndarray, float, "np.ndarray | None"]

Missing = Literal["none", "cpt-v", "logit-vd"]
Prior = Literal["train", "mcar"]


class MultinomialMixture:
    """Multinomial mixture recommender (Recommender protocol), fitted by MAP-EM.

    Args:
        missing: ``"none"`` (name ``mixture``), ``"cpt-v"`` or ``"logit-vd"``.
        prior: centre of the missing model's prior. ``"train"`` (names ``cpt-v``, ``logit-vd``): the train
            density for every level (MCAR), the one guess at P(o=1|v) that needs no MCAR data. ``"mcar"``
            (names ``cpt-v-mcar``, ``logit-vd-mcar``): the Naive-Bayes propensities P(o=1|v) from an MCAR
            sample (uses MCAR data).
        config: ``MixtureConfig``, or keyword overrides of its fields.
        mcar_sample: MCAR ratings for ``prior="mcar"``; may instead be given to ``fit``.
    """

    NAMES = {("none", "train"): "mixture", ("cpt-v", "train"): "cpt-v", ("logit-vd", "train"): "logit-vd",
             ("cpt-v", "mcar"): "cpt-v-mcar", ("logit-vd", "mcar"): "logit-vd-mcar"}

    def __init__(self, missing: Missing = "cpt-v", prior: Prior = "train", config: MixtureConfig | None = None,
                 mcar_sample: sp.csr_matrix | None = None, **overrides: object) -> None:
        if missing not in ("none", "cpt-v", "logit-vd"):
            raise ValueError(f"missing must be 'none', 'cpt-v' or 'logit-vd', got {missing!r}")
        if prior not in ("train", "mcar"):
            raise ValueError(f"prior must be 'train' or 'mcar', got {prior!r}")
        if missing == "none" and prior == "mcar":
            raise ValueError("the MAR mixture (missing='none') has no missing model to put an MCAR prior on")
        if prior == "train" and mcar_sample is not None:
            raise ValueError(f"{self.NAMES[missing, prior]} uses no MCAR data; do not pass mcar_sample")
        base = config or MixtureConfig()
        fields = {**base.__dict__, **overrides}
        for name, value in (TIGHT_PRIOR if prior == "mcar" else WEAK_PRIOR).items():
            fields[name] = value if fields.get(name) is None else fields[name]
        self.config = MixtureConfig(**fields)
        self.missing, self.prior = missing, prior
        self.name = self.NAMES[missing, prior]
        self.mcar_sample = mcar_sample
        self.missing_model: CPTv | LogitVD | None = None
        self.log_theta: np.ndarray | None = None
        self.log_beta: np.ndarray | None = None
        self.responsibilities: np.ndarray | None = None
        self.item_means: np.ndarray | None = None
        self.history: list[float] = []
        self.n_iter = 0

    def fit(self, train: sp.csr_matrix, *, mcar_sample: sp.csr_matrix | None = None) -> "MultinomialMixture":
        """Fit by MAP-EM to the stored ratings of ``train`` (users x items CSR, integer levels on
        ``rating_scale``). ``mcar_sample`` (``prior="mcar"`` only) overrides the constructor's. The log
        posterior after each iteration is kept in ``history`` (it never falls), the EM steps taken in ``n_iter``."""
        cfg = self.config
        levels = self._check_config()
        train = check_ratings(train)
        check_on_scale(train, cfg.rating_scale)
        fractional = train.data[train.data != np.round(train.data)]
        if fractional.size:
            raise ValueError(f"train holds {fractional.size} non-integer ratings, the first {fractional[0]:g}: the "
                             f"mixture treats each level of {levels.tolist()} as a category")
        onehot = _onehot(train, levels)
        self.missing_model = self._missing_model(train, levels, mcar_sample)
        observed = np.asarray(onehot.sum(axis=0)).reshape(len(levels), train.shape[1])
        onehot_t = onehot.T.tocsr()

        rng = np.random.default_rng(cfg.seed)
        q = np.eye(cfg.n_components)[rng.integers(cfg.n_components, size=train.shape[0])]
        counts = np.asarray(onehot_t @ q).reshape(len(levels), train.shape[1], cfg.n_components)
        self._m_step_mixture(q.sum(axis=0), counts)  # the first beta sees the observed ratings only
        state = self._e_step(onehot)
        self.history, self.n_iter = [state[1]], 0

        def em_step(state: _State) -> _State:
            self.n_iter += 1
            self._m_step(state[0], onehot_t, observed, state[2])
            return self._e_step(onehot)

        while self.n_iter < cfg.max_iter:
            state = self._squarem_cycle(state, em_step, onehot) if cfg.accelerate else em_step(state)
            self.history.append(state[1])
            if self.history[-1] - self.history[-2] <= cfg.tol * abs(self.history[-1]):
                break
        else:
            warnings.warn(f"{self.name}: EM stopped at max_iter={cfg.max_iter} before the log posterior changed by "
                          f"less than tol={cfg.tol} of itself; raise max_iter", ConvergenceWarning, stacklevel=2)
        q, _, log_g = state
        self.responsibilities = q
        self.item_means = np.einsum("v,vdk->dk", levels, np.exp(self._log_phi(log_g)))
        return self

    def _squarem_cycle(self, state: _State, em_step: Callable[[_State], _State], onehot: sp.csr_matrix) -> _State:
        """Two EM steps, then a SQUAREM extrapolation (Varadhan & Roland, 2008) along them followed by one more
        EM step, kept only if its log posterior is at least the second step's (else that step is kept)."""
        x0 = self._parameters()
        state = em_step(state)
        x1 = self._parameters()
        if self.n_iter >= self.config.max_iter:
            return state
        second = em_step(state)
        x2, kept = self._parameters(), (self.log_theta, self.log_beta, copy.deepcopy(self.missing_model))
        r = [b - a for a, b in zip(x0, x1)]
        v = [c - 2 * b + a for a, b, c in zip(x0, x1, x2)]
        step = -np.sqrt(sum(np.sum(a ** 2) for a in r) / max(sum(np.sum(a ** 2) for a in v), 1e-300))
        for _ in range(_SQUAREM_TRIES):
            if step >= -1.0 or self.n_iter >= self.config.max_iter:
                break
            self._set_parameters([a - 2 * step * b + step ** 2 * c for a, b, c in zip(x0, r, v)])
            extrapolated = self._e_step(onehot)
            if np.isfinite(extrapolated[1]):
                stabilised = em_step(extrapolated)
                if stabilised[1] >= second[1]:
                    return stabilised
            step = (step - 1.0) / 2.0  # halfway back towards the plain two steps
        self.log_theta, self.log_beta, self.missing_model = kept  # exactly the state `second` was computed at
        return second

    def _parameters(self) -> list[np.ndarray]:
        """The unconstrained parameters SQUAREM extrapolates: log theta, log beta and the missing model's."""
        extra = [] if self.missing_model is None else self.missing_model.parameters()
        return [self.log_theta.copy(), self.log_beta.copy(), *extra]

    def _set_parameters(self, values: list[np.ndarray]) -> None:
        self.log_theta = values[0] - logsumexp(values[0])
        self.log_beta = values[1] - logsumexp(values[1], axis=0, keepdims=True)
        if self.missing_model is not None:
            self.missing_model.set_parameters(values[2:])

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """E[rating] of the (users[k], items[k]) cells as unobserved cells, clipped to ``rating_scale``."""
        check_fitted(self, "item_means")
        u, i = check_pairs(users, items, (self.responsibilities.shape[0], self.item_means.shape[0]))
        pred = np.einsum("nk,nk->n", self.responsibilities[u], self.item_means[i])
        return np.clip(pred, *self.config.rating_scale)

    def _check_config(self) -> np.ndarray:
        """Validate the config; return the rating levels low..high."""
        cfg = self.config
        for name in ("n_components", "m_step_iters", "max_iter"):
            check_positive_integer(f"MixtureConfig.{name}", getattr(cfg, name))
        for name in ("prior_strength", "omega_sd", "psi_sd", "tol"):
            check_positive_finite(f"MixtureConfig.{name}", getattr(cfg, name))
        if not isinstance(cfg.accelerate, bool):
            raise ValueError(f"MixtureConfig.accelerate must be True or False, got {cfg.accelerate!r}")
        check_positive_finite("MixtureConfig.alpha", cfg.alpha)
        if cfg.alpha <= 1:
            raise ValueError(f"MixtureConfig.alpha must exceed 1 (a MAP probability would be 0), got {cfg.alpha!r}")
        scale = cfg.rating_scale
        integers = scale is not None and len(scale) == 2 and all(
            isinstance(s, numbers.Real) and float(s).is_integer() for s in scale)
        if not integers or scale[0] >= scale[1]:
            raise ValueError(f"MixtureConfig.rating_scale must be integer (low, high) with low < high, got {scale!r}")
        return np.arange(int(scale[0]), int(scale[1]) + 1, dtype=np.float64)

    def _missing_model(self, train: sp.csr_matrix, levels: np.ndarray,
                       mcar_sample: sp.csr_matrix | None) -> CPTv | LogitVD | None:
        """The missing model at its prior centre: the train density per level, or the Naive-Bayes propensities."""
        cfg = self.config
        if self.missing == "none":
            if mcar_sample is not None:
                raise ValueError("mixture uses no MCAR data; do not pass mcar_sample")
            return None
        n_users, n_items = train.shape
        density = train.nnz / (n_users * n_items)
        centre = np.full(len(levels), density)
        if self.prior == "mcar":
            sample = check_mcar_sample(self.name, train, mcar_sample, self.mcar_sample)
            centre = _level_propensities(train, sample, levels)
        elif mcar_sample is not None:
            raise ValueError(f"{self.name} uses no MCAR data; do not pass mcar_sample")
        if self.missing == "cpt-v":
            return CPTv(centre, cfg.prior_strength * n_users * n_items, n_items)
        item_density = (np.bincount(train.indices, minlength=n_items) + 1.0) / (n_users + 2.0)
        return LogitVD(logit(centre), cfg.omega_sd, cfg.psi_sd, logit(item_density) - logit(density), cfg.m_step_iters)

    def _log_mu(self) -> tuple[np.ndarray, np.ndarray] | None:
        return None if self.missing_model is None else self.missing_model.log_mu()

    def _log_phi(self, log_g: np.ndarray | None) -> np.ndarray:
        """log P(x = v | k, r = 0), V x D x K (log beta for the MAR mixture)."""
        log_mu = self._log_mu()
        if log_mu is None:
            return self.log_beta
        return log_mu[1][:, :, None] + self.log_beta - log_g[None]

    def _e_step(self, onehot: sp.csr_matrix) -> _State:
        """Responsibilities q (N x K), the log posterior, and log g (D x K; None without a missing model)."""
        n_levels, n_items, k = self.log_beta.shape
        log_mu = self._log_mu()
        if log_mu is None:
            log_g, per_cell, base = None, self.log_beta, self.log_theta
        else:
            log_g = logsumexp(log_mu[1][:, :, None] + self.log_beta, axis=0)
            # observed cell (v, d): log(mu_vd beta_vdk) minus the log g_dk the all-items sum counted for it
            per_cell = log_mu[0][:, :, None] + self.log_beta - log_g[None]
            base = self.log_theta + log_g.sum(axis=0)
        joint = base + np.asarray(onehot @ per_cell.reshape(n_levels * n_items, k))
        norm = logsumexp(joint, axis=1, keepdims=True)
        log_prior = (self.config.alpha - 1.0) * (self.log_theta.sum() + self.log_beta.sum())
        if self.missing_model is not None:
            log_prior += self.missing_model.log_prior()
        return np.exp(joint - norm), float(norm.sum() + log_prior), log_g

    def _m_step(self, q: np.ndarray, onehot_t: sp.csr_matrix, observed: np.ndarray, log_g: np.ndarray | None) -> None:
        n_levels, n_items, k = self.log_beta.shape
        q_total = q.sum(axis=0)
        counts = np.asarray(onehot_t @ q).reshape(n_levels, n_items, k)
        if self.missing_model is not None:
            # expected unobserved cells per (item, component): all users' responsibility minus the raters'
            unobserved = np.maximum(q_total[None, :] - counts.sum(axis=0), 0.0)
            expected = np.exp(self._log_phi(log_g)) * unobserved[None]
            self.missing_model.m_step(observed, expected.sum(axis=2))
            counts = counts + expected
        self._m_step_mixture(q_total, counts)

    def _m_step_mixture(self, q_total: np.ndarray, counts: np.ndarray) -> None:
        """MAP theta and beta from the expected component sizes and V x D x K rating counts."""
        a = self.config.alpha - 1.0
        self.log_theta = np.log(q_total + a) - np.log(np.sum(q_total + a))
        self.log_beta = np.log(counts + a) - np.log(np.sum(counts + a, axis=0, keepdims=True))


def _onehot(train: sp.csr_matrix, levels: np.ndarray) -> sp.csr_matrix:
    """N x (V D) indicators: column v * D + d is 1 where the user rated item d with level v."""
    level = np.searchsorted(levels, train.data)
    n_items = train.shape[1]
    return sp.csr_matrix((np.ones(train.nnz), level * n_items + train.indices, train.indptr),
                         shape=(train.shape[0], len(levels) * n_items))


def _level_propensities(train: sp.csr_matrix, mcar_sample: sp.csr_matrix, levels: np.ndarray) -> np.ndarray:
    """Naive-Bayes P(o = 1 | v) for every level, clipped below 1 so that its logit is finite."""
    sample = check_ratings(mcar_sample, "mcar_sample")
    propensity = naive_bayes_propensities(train, sample)
    missing = np.setdiff1d(levels, propensity.ratings)
    if missing.size:
        raise ValueError(f"neither train nor mcar_sample holds rating levels {missing.tolist()}: they have no "
                         "propensity")
    return np.minimum(propensity(levels), 1.0 - 1e-6)
