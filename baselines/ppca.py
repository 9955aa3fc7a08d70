"""Probabilistic PCA with missing entries, fit by maximum likelihood (Tipping & Bishop 1999; Ilin & Raiko 2010).

Model: x = W z + mu + eps, z ~ N(0, I_q), eps ~ N(0, s2 I_D). Each row's observed entries are
N(mu_O, W_O W_O^T + s2 I), so missing values are integrated out exactly. Two solvers maximise that
observed-data log-likelihood: L-BFGS on its gradient (the default) and exact EM, whose log-likelihood never
decreases, in exact arithmetic. EM crawls where much is missing: on Breast under the paper's masks it
needed 22,353 iterations (466 s) to meet tol = 1e-7, and had imputed at RMSE 1.144 after 300, 0.966 after
3,000 and 0.853 at the end; L-BFGS meets it after 955 iterations (14 s in the `uci` pipeline), at RMSE
0.850 and log-likelihood -784.36. On data that q components fit exactly the likelihood is
unbounded: s2 runs towards 0 and EM's rounding can then lower it by a step (by 1,339 at a value of 2,943 on
rank-1 data with q = 4) while the imputations stay exact.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import minimize
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.validation import check_is_fitted

from mnar_recsys.checks import check_positive_integer, is_positive_integer
from mnar_recsys.checks.dense import check_missing_data, standardisation

_LOG_2PI = np.log(2.0 * np.pi)


class PPCAImputer(TransformerMixin, BaseEstimator):
    """Impute missing entries by their conditional mean E[x_m | x_o] under a PPCA model fit by maximum
    likelihood.

    ``n_components`` is the latent size q (None: D - 1, as in the paper's PPCA). With ``standardize`` each
    feature is centred and scaled by its observed mean / sd before fitting, because the isotropic noise
    assumes comparable scales. ``solver`` "lbfgs" or "em" (module docstring) stops after ``max_iter``
    iterations, with a ConvergenceWarning, or once an iteration improves the observed-data log-likelihood
    by less than ``tol`` times its magnitude. ``loglik_`` records it (in the scaled units) at each iterate:
    for EM at the parameters of each E-step, i.e. before that iteration's M-step, so the fitted parameters'
    own log-likelihood is one step beyond its last entry.
    """

    def __init__(self, n_components: int | None = None, max_iter: int = 30_000, tol: float = 1e-7,
                 standardize: bool = True, solver: str = "lbfgs"):
        self.n_components = n_components
        self.max_iter = max_iter
        self.tol = tol
        self.standardize = standardize
        self.solver = solver

    def _prepare(self, X) -> tuple[np.ndarray, np.ndarray]:
        """Scaled data with missing entries zero-filled, and the observed indicator (float)."""
        observed = ~np.isnan(X)
        Xs = (X - self.center_) / self.scale_
        return np.where(observed, Xs, 0.0), observed.astype(np.float64)

    def fit(self, X: ArrayLike, y: object = None) -> "PPCAImputer":
        X = check_missing_data(X, "PPCAImputer", fitting=True)
        check_positive_integer("PPCAImputer: max_iter", self.max_iter)
        if self.solver not in _SOLVERS:
            raise ValueError(f"PPCAImputer: solver must be one of {', '.join(_SOLVERS)}, got {self.solver!r}")
        d = X.shape[1]
        if d < 2:
            raise ValueError(f"PPCAImputer: a latent factor model needs at least 2 features, got {d}")
        q = d - 1 if self.n_components is None else self.n_components
        if not (is_positive_integer(q) and q < d):
            raise ValueError(f"PPCAImputer: n_components must be in 1..{d - 1} for {d} features, got {q}")
        self.n_features_in_ = d
        self.center_, self.scale_ = standardisation(X, "PPCAImputer", self.standardize)
        X0, S = self._prepare(X)
        patterns = _patterns(S)

        start = self._init_params(X0, S, q)
        (W, mu, s2), history, converged = _SOLVERS[self.solver](X0, S, patterns, start, self.max_iter, self.tol)
        if not converged:
            warnings.warn(f"PPCAImputer: the {self.solver} solver stopped after max_iter={self.max_iter} iterations "
                          f"before an iteration gained less than tol={self.tol} of the log-likelihood; raise "
                          "max_iter", ConvergenceWarning, stacklevel=2)
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
        Ez, _, _ = _e_step(X0, S, self.components_, self.mu_, self.noise_variance_, _patterns(S))
        conditional_mean = (Ez @ self.components_.T + self.mu_) * self.scale_ + self.center_
        return np.where(S > 0, X, conditional_mean)


class _Patterns(NamedTuple):
    """The distinct rows of the observed indicator, which row has which, and how many rows each has:
    the posterior covariance of z depends on a row through its pattern alone, and the paper's masks leave
    few (4 to 32 on five of the six UCI sets, 261 for Breast's 569 rows)."""
    observed: np.ndarray
    of_row: np.ndarray
    counts: np.ndarray


def _patterns(S: np.ndarray) -> _Patterns:
    observed, of_row, counts = np.unique(S, axis=0, return_inverse=True, return_counts=True)
    return _Patterns(observed, of_row.ravel(), counts)


def _sum_over_observing_rows(patterns: _Patterns, per_pattern: np.ndarray) -> np.ndarray:
    """For each feature j, the sum of a per-pattern (q x q) matrix over the rows that observe j:
    Σ_p count_p O_pj X_p, (D, q, q)."""
    q = per_pattern.shape[-1]
    return ((patterns.observed * patterns.counts[:, None]).T @ per_pattern.reshape(len(per_pattern), -1)
            ).reshape(-1, q, q)


def _e_step(X0: np.ndarray, S: np.ndarray, W: np.ndarray, mu: np.ndarray, s2: float, patterns: _Patterns):
    """Posterior moments of z given each row's observed entries, and the observed-data log-likelihood:
    E[z] per row, Cov[z] per pattern.

    Per row with observed set O: M = W_O^T W_O + s2 I, E[z] = M^-1 W_O^T (x_O - mu_O),
    Cov[z] = s2 M^-1; log N(x_O; mu_O, W_O W_O^T + s2 I) via the Woodbury identity.
    """
    q = W.shape[1]
    R = S * (X0 - mu)
    # Σ_j O_j w_j w_j^T for every pattern as one matrix product
    outer = (W[:, :, None] * W[:, None, :]).reshape(len(W), q * q)
    M = (patterns.observed @ outer).reshape(-1, q, q) + s2 * np.eye(q)
    b = R @ W
    Minv = np.linalg.inv(M)
    Ez = (Minv[patterns.of_row] @ b[..., None])[..., 0]
    n_obs_row = S.sum(1)
    logdet_M = np.linalg.slogdet(M)[1][patterns.of_row]
    logdet_C = (n_obs_row - q) * np.log(s2) + logdet_M
    quad = ((R**2).sum(1) - (b * Ez).sum(1)) / s2
    loglik = -0.5 * float(np.sum(n_obs_row * _LOG_2PI + logdet_C + quad))
    return Ez, s2 * Minv, loglik


def _m_step(X0: np.ndarray, S: np.ndarray, Ez: np.ndarray, Cov: np.ndarray, n_obs: float, patterns: _Patterns):
    """Joint maximisation over (W, mu), then s2; each column j uses only the rows where it is observed.
    Cov holds the posterior covariance of z per pattern.

    Augmenting z with a constant 1 makes [w_j; mu_j] one least-squares solve, so the update is the
    exact M-step rather than a coordinate step.
    """
    n, q = Ez.shape
    Zt = np.hstack([Ez, np.ones((n, 1))])
    A = (S.T @ (Zt[:, :, None] * Zt[:, None, :]).reshape(n, -1)).reshape(-1, q + 1, q + 1)
    A[:, :q, :q] += _sum_over_observing_rows(patterns, Cov)  # each row's Cov[z] once per observed column
    rhs = (S * X0).T @ Zt
    Wt = np.linalg.solve(A, rhs[..., None])[..., 0]
    resid = (S * X0**2).sum() - 2.0 * (S * X0 * (Zt @ Wt.T)).sum() + np.einsum("jk,jkl,jl->", Wt, A, Wt)
    s2 = max(resid / n_obs, 1e-10)  # floor: keeps the E-step well posed if the fit becomes exact
    return Wt[:, :q], Wt[:, q], float(s2)


Params = tuple[np.ndarray, np.ndarray, float]


def _fit_em(X0: np.ndarray, S: np.ndarray, patterns: _Patterns, start: Params, max_iter: int,
            tol: float) -> tuple[Params, list[float], bool]:
    """EM from `start`: (the parameters, the log-likelihood at each E-step, whether tol was met)."""
    W, mu, s2 = start
    history: list[float] = []
    n_obs = S.sum()
    for _ in range(max_iter):
        Ez, Cov, loglik = _e_step(X0, S, W, mu, s2, patterns)
        history.append(loglik)
        W, mu, s2 = _m_step(X0, S, Ez, Cov, n_obs, patterns)
        if len(history) > 1 and history[-1] - history[-2] < tol * abs(history[-2]):
            return (W, mu, s2), history, True
    return (W, mu, s2), history, False


def _loglik_and_gradient(W: np.ndarray, mu: np.ndarray, s2: float, X0: np.ndarray, S: np.ndarray,
                         patterns: _Patterns) -> tuple[float, np.ndarray, np.ndarray, float]:
    """The observed-data log-likelihood and its gradient in (W, mu, s2), from the E-step's moments.

    For a row with observed set O, C = W_O W_O^T + s2 I and g = C^-1 (x_O - mu_O), which is
    (x_O - mu_O - W_O E[z]) / s2 by Woodbury. The row's log N(x_O; mu_O, C) then has gradient g in mu_O,
    (g g^T - C^-1) W_O = g g^T W_O - W_O M^-1 in W_O, and (|g|² - tr C^-1) / 2 in s2, with
    tr C^-1 = (|O| - q + s2 tr M^-1) / s2.
    """
    q = W.shape[1]
    Ez, Cov, loglik = _e_step(X0, S, W, mu, s2, patterns)
    Minv = Cov / s2
    g = S * (X0 - mu - Ez @ W.T) / s2
    grad_W = g.T @ (g @ W) - np.einsum("jkl,jl->jk", _sum_over_observing_rows(patterns, Minv), W)
    trace_Cinv = (patterns.observed.sum(1) - q + s2 * np.trace(Minv, axis1=1, axis2=2)) / s2
    grad_s2 = 0.5 * ((g ** 2).sum() - patterns.counts @ trace_Cinv)
    return loglik, grad_W, g.sum(0), float(grad_s2)


def _fit_lbfgs(X0: np.ndarray, S: np.ndarray, patterns: _Patterns, start: Params, max_iter: int,
               tol: float) -> tuple[Params, list[float], bool]:
    """L-BFGS on the negative log-likelihood in (W, mu, log s2) from `start`: (the parameters, the
    log-likelihood at each iterate, whether tol was met)."""
    W, mu, s2 = start
    n_W = W.size

    def unpack(v: np.ndarray) -> Params:
        return v[:n_W].reshape(W.shape), v[n_W:-1], float(np.exp(v[-1]))

    last: dict = {}

    def objective(v: np.ndarray) -> tuple[float, np.ndarray]:
        W_, mu_, s2_ = unpack(v)
        loglik, grad_W, grad_mu, grad_s2 = _loglik_and_gradient(W_, mu_, s2_, X0, S, patterns)
        last.update(v=v.copy(), loglik=loglik)
        return -loglik, -np.concatenate([grad_W.ravel(), grad_mu, [grad_s2 * s2_]])

    history: list[float] = []

    def record(v: np.ndarray) -> None:  # the iterate is the line search's last evaluation
        history.append(last["loglik"] if np.array_equal(v, last["v"]) else
                       _e_step(X0, S, *unpack(v), patterns)[2])

    # scipy's ftol is the relative gain per iteration, as tol is for EM; gtol 0 leaves the stop to it
    result = minimize(objective, np.concatenate([W.ravel(), mu, [np.log(s2)]]), jac=True, method="L-BFGS-B",
                      callback=record, options={"maxiter": max_iter, "maxfun": 2 * max_iter, "ftol": tol,
                                                "gtol": 0.0})
    # status 1: stopped by the iteration or evaluation cap; 2, a line search that rounding stalls, is the end
    return unpack(result.x), history, result.status != 1


_SOLVERS = {"lbfgs": _fit_lbfgs, "em": _fit_em}
