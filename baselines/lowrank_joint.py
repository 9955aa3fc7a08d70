"""Low-rank joint model of data and mask (Sportisse, Boyer & Josse, Statistics and Computing 2020).

MNAR missingness is modelled by completing the concatenated matrix [X, M] (M the observed indicator,
fully known) with soft-impute (Mazumder, Hastie & Tibshirani 2010): the mask columns carry the
information about which values tend to go missing into the low-rank fit of the data columns.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from numpy.typing import ArrayLike
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from mnar_recsys.checks import check_positive_integer
from mnar_recsys.checks.dense import check_missing_data, standardisation


class LowRankJointImputer(TransformerMixin, BaseEstimator):
    """Soft-impute of [data, centred mask], with lambda chosen by hold-out.

    With ``standardize`` (default) each data column is centred and scaled by its observed mean / sd, so
    soft-impute shrinks towards the observed mean. With ``standardize=False`` the data are used as given
    and shrunk towards 0: this is how the not-MIWAE paper's protocol feeds pre-standardised data, where 0
    is the full-data mean, which the observed entries alone do not reveal under MNAR.

    ``fit`` hides a further ``holdout`` fraction of the observed data entries (at random, by
    ``random_state``), runs the soft-impute path over ``n_lambdas`` values of lambda from the largest
    singular value of the zero-filled matrix down to ``lambda_min_ratio`` times it (warm starts), and
    keeps the lambda, as a ratio to that largest singular value, with the lowest RMSE on the hidden
    entries. ``transform`` completes the matrix it is given with all its observed entries, running the
    same path down to the chosen ratio: soft-impute is transductive, and the ratio makes the penalty
    independent of the number of rows.
    """

    def __init__(
        self,
        standardize: bool = True,
        n_lambdas: int = 20,
        lambda_min_ratio: float = 1e-3,
        holdout: float = 0.05,
        max_iter: int = 3_000,
        tol: float = 1e-10,
        random_state: int | None = None,
    ):
        self.standardize = standardize
        self.n_lambdas = n_lambdas
        self.lambda_min_ratio = lambda_min_ratio
        self.holdout = holdout
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state

    def _joint(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The scaled joint matrix (missing entries 0) and its observed indicator."""
        observed = ~np.isnan(X)
        data = np.where(observed, (X - self.center_) / self.scale_, 0.0)
        mask = observed - self.mask_mean_
        return np.hstack([data, mask]), np.hstack([observed, np.ones_like(observed)])

    def _ratios(self) -> np.ndarray:
        return np.geomspace(1.0, self.lambda_min_ratio, self.n_lambdas)

    def fit(self, X: ArrayLike, y: object = None) -> "LowRankJointImputer":
        X = check_missing_data(X, "LowRankJointImputer", fitting=True)
        if not 0.0 < self.holdout < 1.0:
            raise ValueError(f"LowRankJointImputer: holdout must lie in (0, 1), got {self.holdout}")
        for name in ("n_lambdas", "max_iter"):
            check_positive_integer(f"LowRankJointImputer: {name}", getattr(self, name))
        d = X.shape[1]
        self.n_features_in_ = d
        self.center_, self.scale_ = standardisation(X, "LowRankJointImputer", self.standardize)
        self.mask_mean_ = (~np.isnan(X)).mean(axis=0)

        Y, observed = self._joint(X)
        rng = np.random.default_rng(self.random_state)
        rows, cols = np.nonzero(observed[:, :d])
        n_hide = max(1, int(round(self.holdout * rows.size)))
        pick = rng.choice(rows.size, size=n_hide, replace=False)
        hidden = (rows[pick], cols[pick])
        train = observed.copy()
        train[hidden] = False

        errors = []
        for Z in _soft_impute_path(np.where(train, Y, 0.0), train, self._ratios(), self.max_iter, self.tol):
            errors.append(np.sqrt(np.mean((Z[hidden] - Y[hidden]) ** 2)))
        self.cv_rmse_ = np.asarray(errors)
        self.best_index_ = int(np.argmin(errors))
        self.lambda_ratio_ = float(self._ratios()[self.best_index_])
        return self

    def transform(self, X: ArrayLike) -> np.ndarray:
        check_is_fitted(self)
        X = check_missing_data(X, "LowRankJointImputer", fitting=False, n_features=self.n_features_in_)
        Y, observed = self._joint(X)
        path = _soft_impute_path(Y, observed, self._ratios()[: self.best_index_ + 1], self.max_iter, self.tol)
        Z = deque(path, maxlen=1)[0]  # warm starts along the path; only the last completion is wanted
        completed = Z[:, : self.n_features_in_] * self.scale_ + self.center_
        return np.where(np.isnan(X), completed, X)


def _soft_impute_path(Y: np.ndarray, observed: np.ndarray, ratios: np.ndarray, max_iter: int, tol: float):
    """Yield the soft-impute completion of Y for lambda = ratio * sigma_max(Y zero-filled), warm-started.

    Each lambda iterates Z <- SVT_lambda(P_obs(Y) + P_miss(Z)) until ||Z_new - Z||^2 / ||Z||^2, the squared
    relative change that R's softImpute measures too, falls below ``tol``. At R's default of 1e-5 the warm
    started path took one or two steps a lambda at its small end and stopped 0.01 to 0.025 above the
    converged imputation RMSE on five of the six UCI sets of the not-MIWAE paper's protocol.
    """
    Y = np.where(observed, Y, 0.0)
    lambda_max = np.linalg.norm(Y, ord=2)
    Z = np.zeros_like(Y)
    for ratio in ratios:
        lam = ratio * lambda_max
        for _ in range(max_iter):
            U, d, Vt = np.linalg.svd(np.where(observed, Y, Z), full_matrices=False)
            Z_new = (U * np.maximum(d - lam, 0.0)) @ Vt
            change = np.sum((Z_new - Z) ** 2) / max(np.sum(Z**2), 1e-12)
            Z = Z_new
            if change < tol:
                break
        yield Z
