"""Probabilistic PCA with missing entries, fit by exact EM (Tipping & Bishop 1999; Ilin & Raiko 2010).

Model: x = W z + mu + eps, z ~ N(0, I_q), eps ~ N(0, s2 I_D). For each row only its observed entries
enter the E-step (posterior of z given x_o), so missing values are integrated out exactly and the
observed-data log-likelihood never decreases across iterations, in exact arithmetic. On data that q components
fit exactly it is unbounded: s2 runs towards 0 and rounding can then lower it by a step (by 1,339 at a value of
2,943 on rank-1 data with q = 4) while the imputations stay exact.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from baselines._dense_checks import check_missing_data, standardisation
from mnar_recsys.checks import check_positive_integer, is_positive_integer

_LOG_2PI = np.log(2.0 * np.pi)


class PPCAImputer(TransformerMixin, BaseEstimator):
    """Impute missing entries by their conditional mean E[x_m | x_o] under a PPCA model fit by EM.

    ``n_components`` is the latent size q (None: D - 1, as in the paper's PPCA). With ``standardize`` each
    feature is centred and scaled by its observed mean / sd before fitting, because the isotropic noise
    assumes comparable scales. EM stops after ``max_iter`` iterations or when the observed-data
    log-likelihood improves by less than ``tol`` times its magnitude; ``loglik_[k]`` records it at the
    parameters of the k-th E-step, i.e. before the k-th M-step (in the scaled units), so the fitted
    parameters' own log-likelihood is one step beyond its last entry.
    """

    def __init__(self, n_components: int | None = None, max_iter: int = 300, tol: float = 1e-7,
                 standardize: bool = True):
        self.n_components = n_components
        self.max_iter = max_iter
        self.tol = tol
        self.standardize = standardize

    def _prepare(self, X) -> tuple[np.ndarray, np.ndarray]:
        """Scaled data with missing entries zero-filled, and the observed indicator (float)."""
        observed = ~np.isnan(X)
        Xs = (X - self.center_) / self.scale_
        return np.where(observed, Xs, 0.0), observed.astype(np.float64)

    def fit(self, X: ArrayLike, y: object = None) -> "PPCAImputer":
        X = check_missing_data(X, "PPCAImputer", fitting=True)
        check_positive_integer("PPCAImputer: max_iter", self.max_iter)
        d = X.shape[1]
        if d < 2:
            raise ValueError(f"PPCAImputer: a latent factor model needs at least 2 features, got {d}")
        q = d - 1 if self.n_components is None else self.n_components
        if not (is_positive_integer(q) and q < d):
            raise ValueError(f"PPCAImputer: n_components must be in 1..{d - 1} for {d} features, got {q}")
        self.n_features_in_ = d
        self.center_, self.scale_ = standardisation(X, "PPCAImputer", self.standardize)
        X0, S = self._prepare(X)

        W, mu, s2 = self._init_params(X0, S, q)
        history: list[float] = []
        n_obs = S.sum()
        for _ in range(self.max_iter):
            Ez, Cov, loglik = _e_step(X0, S, W, mu, s2)
            history.append(loglik)
            W, mu, s2 = _m_step(X0, S, Ez, Cov, n_obs)
            if len(history) > 1 and history[-1] - history[-2] < self.tol * abs(history[-2]):
                break
        self.components_, self.mu_, self.noise_variance_ = W, mu, s2
        self.loglik_ = np.asarray(history)
        self.n_iter_ = len(history)
        return self

    @staticmethod
    def _init_params(X0: np.ndarray, S: np.ndarray, q: int) -> tuple[np.ndarray, np.ndarray, float]:
        """Start from PCA of the mean-filled data (deterministic, so no random_state is needed)."""
        mu = (X0 * S).sum(0) / S.sum(0)
        filled = np.where(S > 0, X0, mu)
        eigval, eigvec = np.linalg.eigh(np.cov(filled, rowvar=False, bias=True))
        eigval, eigvec = eigval[::-1], eigvec[:, ::-1]
        floor = 1e-3 * max(eigval.mean(), 1e-12)
        s2 = max(eigval[q:].mean(), floor)
        W = eigvec[:, :q] * np.sqrt(np.maximum(eigval[:q] - s2, floor))
        return W, mu, s2

    def transform(self, X: ArrayLike) -> np.ndarray:
        check_is_fitted(self)
        X = check_missing_data(X, "PPCAImputer", fitting=False, n_features=self.n_features_in_)
        X0, S = self._prepare(X)
        Ez, _, _ = _e_step(X0, S, self.components_, self.mu_, self.noise_variance_)
        conditional_mean = (Ez @ self.components_.T + self.mu_) * self.scale_ + self.center_
        return np.where(S > 0, X, conditional_mean)


def _e_step(X0: np.ndarray, S: np.ndarray, W: np.ndarray, mu: np.ndarray, s2: float):
    """Posterior moments of z given each row's observed entries, and the observed-data log-likelihood.

    Per row with observed set O: M = W_O^T W_O + s2 I, E[z] = M^-1 W_O^T (x_O - mu_O),
    Cov[z] = s2 M^-1; log N(x_O; mu_O, W_O W_O^T + s2 I) via the Woodbury identity.
    """
    q = W.shape[1]
    R = S * (X0 - mu)
    M = np.einsum("nj,jk,jl->nkl", S, W, W) + s2 * np.eye(q)
    b = R @ W
    Minv = np.linalg.inv(M)
    Ez = np.einsum("nkl,nl->nk", Minv, b)
    n_obs_row = S.sum(1)
    logdet_M = np.linalg.slogdet(M)[1]
    logdet_C = (n_obs_row - q) * np.log(s2) + logdet_M
    quad = ((R**2).sum(1) - (b * Ez).sum(1)) / s2
    loglik = -0.5 * float(np.sum(n_obs_row * _LOG_2PI + logdet_C + quad))
    return Ez, s2 * Minv, loglik


def _m_step(X0: np.ndarray, S: np.ndarray, Ez: np.ndarray, Cov: np.ndarray, n_obs: float):
    """Joint maximisation over (W, mu), then s2; each column j uses only the rows where it is observed.

    Augmenting z with a constant 1 makes [w_j; mu_j] one least-squares solve, so the update is the
    exact M-step rather than a coordinate step.
    """
    n, q = Ez.shape
    Zt = np.hstack([Ez, np.ones((n, 1))])
    Ezz = np.einsum("nk,nl->nkl", Zt, Zt)
    Ezz[:, :q, :q] += Cov
    A = np.einsum("nj,nkl->jkl", S, Ezz)
    rhs = np.einsum("nj,nk->jk", S * X0, Zt)
    Wt = np.linalg.solve(A, rhs[..., None])[..., 0]
    resid = (S * X0**2).sum() - 2.0 * (S * X0 * (Zt @ Wt.T)).sum() + np.einsum("jk,jkl,jl->", Wt, A, Wt)
    s2 = max(resid / n_obs, 1e-10)  # floor: keeps the E-step well posed if the fit becomes exact
    return Wt[:, :q], Wt[:, q], float(s2)
