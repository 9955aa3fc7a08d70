"""CPT-v (Marlin & Zemel, RecSys 2009; Marlin, Zemel, Roweis & Slaney, UAI 2007): a mixture of multinomials
over each user's ratings, with a missing model in which whether a rating is observed depends on its value
alone.

Each user belongs to one of K clusters, z ~ Discrete(theta); given z, their rating of item i is v with
probability beta[z, i, v], independently over items; a rating of value v is observed with probability
mu[v] ("CPT-v": a conditional probability table over the values). The likelihood of a user's train row
takes every item: the observed ratings, and for each unrated item the probability of leaving it unrated,
m[z, i] = sum_v beta[z, i, v] (1 - mu[v]). So the model reads the mask as evidence about the ratings, as
the not-MIWAE does, and with a value-dependent mu it can learn that low ratings go unreported.

Fitted by EM to the MAP estimate under symmetric Dirichlet priors on theta and each beta[z, i] and Beta
priors on each mu[v]. A step costs O(ratings x K + K x items x levels): the sum over a user's unrated items
is the sum over all items less the rated ones, and the expected rating counts of the unrated cells come
per (cluster, item) from the cluster's total responsibility less that of the item's raters.

A prediction is the posterior mean of the rating given the user's train row, including whether the cell
itself was rated: sum_z q(z) E[x | z, that cell's response], the response an unrated cell's 0 for MCAR
test cells.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.special import logsumexp

from baselines._checks import check_fitted, check_on_scale, check_pairs, check_ratings
from mnar_recsys.checks import check_positive_finite, check_positive_integer


@dataclass
class CPTvConfig:
    """Hyper-parameters of CPT-v.

    Attributes:
        n_clusters: K, the number of user clusters.
        n_iters: EM iterations, at most.
        tol: EM stops once an iteration raises the MAP objective by less than this per rating.
        cluster_prior: the symmetric Dirichlet parameter of theta (> 1 for a MAP estimate inside the simplex).
        rating_prior: the symmetric Dirichlet parameter of each beta[z, i].
        observe_prior: the Beta parameters (a, b) of each mu[v].
        rating_scale: the integer rating values lo..hi; ratings must be integers on it.
        seed: seeds the random start of beta.
    """

    n_clusters: int = 20
    n_iters: int = 200
    tol: float = 1e-6
    cluster_prior: float = 2.0
    rating_prior: float = 2.0
    observe_prior: tuple[float, float] = (2.0, 2.0)
    rating_scale: tuple[int, int] = (1, 5)
    seed: int = 0


class CPTv:
    """CPT-v recommender (Recommender protocol). After ``fit``: ``theta`` (K,), ``beta`` (K, items, levels),
    ``mu`` (levels,), the users' cluster posteriors ``responsibilities`` and the MAP objective at each EM
    iteration, ``objective_trace``."""

    name = "cpt-v"

    def __init__(self, config: CPTvConfig | None = None, **overrides: object) -> None:
        """Build from a ``CPTvConfig``, or from keyword overrides of its fields (``CPTv(n_clusters=10)``)."""
        base = config or CPTvConfig()
        self.config = CPTvConfig(**{**base.__dict__, **overrides})
        self.theta: np.ndarray | None = None
        self.beta: np.ndarray | None = None
        self.mu: np.ndarray | None = None
        self.responsibilities: np.ndarray | None = None
        self.objective_trace: list[float] = []
        self._rated: sp.csr_matrix | None = None

    def fit(self, train: sp.csr_matrix) -> "CPTv":
        """Fit by EM to the stored ratings of ``train`` (users x items CSR) and to which cells are stored."""
        cfg = self.config
        check_positive_integer("CPTvConfig.n_clusters", cfg.n_clusters)
        check_positive_integer("CPTvConfig.n_iters", cfg.n_iters)
        check_positive_finite("CPTvConfig.tol", cfg.tol)
        for name, value in (("cluster_prior", cfg.cluster_prior), ("rating_prior", cfg.rating_prior),
                            ("observe_prior[0]", cfg.observe_prior[0]), ("observe_prior[1]", cfg.observe_prior[1])):
            if not (isinstance(value, (int, float)) and np.isfinite(value) and value >= 1):
                raise ValueError(f"CPTvConfig.{name} must be a number >= 1 (a MAP estimate needs it), got {value!r}")
        train = check_ratings(train)
        check_on_scale(train, cfg.rating_scale)
        low, high = cfg.rating_scale
        if not (float(low).is_integer() and float(high).is_integer() and np.all(train.data == np.round(train.data))):
            raise ValueError(f"CPT-v models discrete rating values: rating_scale {cfg.rating_scale} and every rating "
                             "must be integers")
        data = _Data(train, int(low), int(high))
        rng = np.random.default_rng(cfg.seed)
        n_levels = int(high - low + 1)
        self.theta = np.full(cfg.n_clusters, 1.0 / cfg.n_clusters)
        self.beta = rng.dirichlet(np.ones(n_levels), size=(cfg.n_clusters, train.shape[1]))
        self.mu = np.full(n_levels, train.nnz / (train.shape[0] * train.shape[1]))
        self.objective_trace = []
        for _ in range(cfg.n_iters):
            log_joint = self._log_joint(data)
            self.responsibilities = np.exp(log_joint - logsumexp(log_joint, axis=1, keepdims=True))
            self.objective_trace.append(float(logsumexp(log_joint, axis=1).sum()) + self._log_prior())
            if len(self.objective_trace) > 1 and self.objective_trace[-1] - self.objective_trace[-2] < cfg.tol * train.nnz:
                break
            self._maximise(data)
        log_joint = self._log_joint(data)  # the posteriors that predictions use, under the final parameters
        self.responsibilities = np.exp(log_joint - logsumexp(log_joint, axis=1, keepdims=True))
        self._rated = data.rated
        return self

    def _log_joint(self, data: "_Data") -> np.ndarray:
        """log p(z, the user's ratings and mask) for every user and cluster, (users, K)."""
        log_unrated = np.log(self.beta @ (1 - self.mu))  # (K, items): log m[z, i]
        # per rating: log beta[z, i, v] + log mu[v] - log m[z, i], the rated item's term less its unrated one
        per_rating = np.log(self.beta[:, data.items, data.levels]) + np.log(self.mu)[data.levels] - log_unrated[:, data.items]
        return np.log(self.theta) + log_unrated.sum(1) + (data.by_user @ per_rating.T)

    def _log_prior(self) -> float:
        cfg = self.config
        a, b = cfg.observe_prior
        return float((cfg.cluster_prior - 1) * np.log(self.theta).sum() + (cfg.rating_prior - 1) * np.log(self.beta).sum()
                     + (a - 1) * np.log(self.mu).sum() + (b - 1) * np.log1p(-self.mu).sum())

    def _maximise(self, data: "_Data") -> None:
        """The MAP M-step from the current responsibilities and parameters."""
        cfg = self.config
        q = self.responsibilities
        n_levels = self.mu.size
        total = q.sum(0)  # (K,)
        rated = np.stack([(level.T @ q).T for level in data.level_masks], axis=-1)  # (K, items, levels)
        # expected counts at the unrated cells: each unrated user's posterior rating given the cell is unrated
        unrated_share = self.beta * (1 - self.mu)
        unrated_share /= unrated_share.sum(-1, keepdims=True)
        counts = rated + (total[:, None] - rated.sum(-1))[..., None] * unrated_share
        self.beta = (counts + cfg.rating_prior - 1) / (counts.sum(-1, keepdims=True) + n_levels * (cfg.rating_prior - 1))
        self.theta = (total + cfg.cluster_prior - 1) / (total.sum() + total.size * (cfg.cluster_prior - 1))
        a, b = cfg.observe_prior
        self.mu = (data.level_counts + a - 1) / (counts.sum((0, 1)) + a + b - 2)

    def predict(self, users: np.ndarray, items: np.ndarray, block: int = 65_536) -> np.ndarray:
        """The posterior mean rating of each (users[k], items[k]) pair given the user's train row, the cell's
        own response included (unrated: the value distribution tilted by 1 - mu; rated: by mu)."""
        check_fitted(self, "responsibilities")
        u, i = check_pairs(users, items, (self.responsibilities.shape[0], self.beta.shape[1]))
        values = np.arange(self.config.rating_scale[0], self.config.rating_scale[1] + 1, dtype=np.float64)
        rated = np.asarray(self._rated[u, i]).ravel().astype(bool)
        predictions = np.empty(u.size)
        for start in range(0, u.size, block):
            part = slice(start, start + block)
            tilt = np.where(rated[part, None], self.mu, 1 - self.mu)  # (n, levels)
            share = self.beta[:, i[part], :] * tilt  # (K, n, levels)
            share /= share.sum(-1, keepdims=True)
            predictions[part] = np.einsum("nk,knv,v->n", self.responsibilities[u[part]], share, values)
        return predictions


class _Data:
    """The train ratings as EM reads them: each rating's item and level, the user-sum matrix, and per level
    a users x items indicator of the ratings at that level."""

    def __init__(self, train: sp.csr_matrix, low: int, high: int):
        n_users, _ = train.shape
        self.items = train.indices
        self.levels = (train.data - low).astype(np.int64)
        rows = np.repeat(np.arange(n_users), np.diff(train.indptr))
        self.by_user = sp.csr_matrix((np.ones(train.nnz), (rows, np.arange(train.nnz))), shape=(n_users, train.nnz))
        self.level_masks = [sp.csr_matrix(((self.levels == v).astype(np.float64), train.indices, train.indptr),
                                          shape=train.shape) for v in range(high - low + 1)]
        self.level_counts = np.bincount(self.levels, minlength=high - low + 1).astype(np.float64)
        self.rated = sp.csr_matrix((np.ones(train.nnz, dtype=bool), train.indices, train.indptr), shape=train.shape)
