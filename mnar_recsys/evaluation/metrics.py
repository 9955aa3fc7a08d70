"""Rating and imputation metrics (pure NumPy, kept apart from evaluation protocols as in cornac).

Every function takes plain arrays, validates their shapes and raises ``ValueError`` on mismatch or
empty input, so protocols can call them on whatever subset of entries they score.
"""

from __future__ import annotations

from typing import Literal

import numpy as np


def _paired(y_true: np.ndarray, y_pred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y_true = np.asarray(y_true, dtype=np.float64)
    y_pred = np.asarray(y_pred, dtype=np.float64)
    if y_true.shape != y_pred.shape:
        raise ValueError(f"y_true shape {y_true.shape} != y_pred shape {y_pred.shape}")
    if y_true.size == 0:
        raise ValueError("cannot score an empty set of ratings")
    return y_true.ravel(), y_pred.ravel()


def mse(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Mean squared error."""
    t, p = _paired(y_true, y_pred)
    return float(np.mean((t - p) ** 2))


def mae(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Mean absolute error."""
    t, p = _paired(y_true, y_pred)
    return float(np.mean(np.abs(t - p)))


def rmse(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Root mean squared error."""
    return float(np.sqrt(mse(y_true, y_pred)))


def per_rating_errors(y_true: np.ndarray, y_pred: np.ndarray) -> dict[int, dict[str, float]]:
    """MSE, MAE and count of the predictions for each true rating value.

    Returns ``{rating: {"mse": ..., "mae": ..., "count": n}}`` with keys sorted ascending; this is
    where MNAR bias shows (models trained on self-selected data over-predict the low ratings).
    """
    t, p = _paired(y_true, y_pred)
    if not np.all(t == np.round(t)):
        raise ValueError("per_rating_errors needs integer-valued true ratings")
    out: dict[int, dict[str, float]] = {}
    for r in np.unique(t):
        sel = t == r
        err = p[sel] - r
        out[int(r)] = {"mse": float(np.mean(err**2)), "mae": float(np.mean(np.abs(err))), "count": int(sel.sum())}
    return out


def _dcg_per_user(users: np.ndarray, order_key: np.ndarray, gains: np.ndarray, k: int, n_groups: int) -> np.ndarray:
    """Sum of gain / log2(rank + 2) over each user's top-k entries when sorted by ``order_key`` descending.

    Entries tied in ``order_key`` share their tie group's mean gain (McSherry & Najork, 2008; scikit-learn's
    ``ndcg_score``), so a tie is not broken by the input order: a constant predictor would otherwise score by
    how the items happen to be numbered."""
    order = np.lexsort((-order_key, users))
    u_sorted, key_sorted = users[order], order_key[order]
    starts = np.searchsorted(u_sorted, u_sorted, side="left")
    rank = np.arange(len(u_sorted)) - starts
    disc = np.where(rank < k, 1.0 / np.log2(rank + 2.0), 0.0)
    new_tie = np.ones(len(u_sorted), dtype=bool)
    new_tie[1:] = (u_sorted[1:] != u_sorted[:-1]) | (key_sorted[1:] != key_sorted[:-1])
    tie = np.cumsum(new_tie) - 1
    mean_gain = np.bincount(tie, weights=gains[order]) / np.bincount(tie)
    return np.bincount(u_sorted, weights=mean_gain[tie] * disc, minlength=n_groups)


def ndcg_at_k(
    users: np.ndarray,
    y_true: np.ndarray,
    y_pred: np.ndarray,
    k: int = 5,
    gain: Literal["exponential", "linear"] = "exponential",
) -> float:
    """Mean over users of NDCG@k, ranking each user's own test items by ``y_pred``.

    Gain is ``2**r - 1`` (``gain="exponential"``, the default, as in Järvelin & Kekäläinen / most
    recsys papers) or ``r`` (``"linear"``); discount ``1 / log2(rank + 2)`` with rank 0 at the top. The
    ideal DCG orders the same items by true rating. Users with fewer than 2 test items are skipped
    (any ranking of one item is perfect, so they would only inflate the mean), as are users whose
    ideal DCG is 0. Items tied in ``y_pred`` share their mean gain (as scikit-learn's ``ndcg_score``).
    Returns NaN when no user qualifies.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    t, p = _paired(y_true, y_pred)
    users = np.asarray(users)
    if users.shape != np.shape(y_true):
        raise ValueError(f"users shape {users.shape} != y_true shape {np.shape(y_true)}")
    if gain not in ("exponential", "linear"):
        raise ValueError(f"gain must be 'exponential' or 'linear', got {gain!r}")
    _, u = np.unique(users.ravel(), return_inverse=True)
    n_groups = int(u.max()) + 1
    g = np.power(2.0, t) - 1.0 if gain == "exponential" else t
    dcg = _dcg_per_user(u, p, g, k, n_groups)
    idcg = _dcg_per_user(u, t, g, k, n_groups)
    keep = (np.bincount(u, minlength=n_groups) >= 2) & (idcg > 0)
    if not keep.any():
        return float("nan")
    return float(np.mean(dcg[keep] / idcg[keep]))


def imputation_rmse(x_true: np.ndarray, x_imputed: np.ndarray, mask: np.ndarray) -> float:
    """RMSE over the missing entries (``mask == 0``; ``mask == 1`` marks observed entries)."""
    x_true = np.asarray(x_true, dtype=np.float64)
    x_imputed = np.asarray(x_imputed, dtype=np.float64)
    mask = np.asarray(mask)
    if not (x_true.shape == x_imputed.shape == mask.shape):
        raise ValueError(f"shapes differ: x_true {x_true.shape}, x_imputed {x_imputed.shape}, mask {mask.shape}")
    if not np.isin(mask, (0, 1)).all():
        raise ValueError("mask must contain only 0 (missing) and 1 (observed)")
    missing = mask == 0
    if not missing.any():
        raise ValueError("mask has no missing entries to score")
    return float(np.sqrt(np.mean((x_true[missing] - x_imputed[missing]) ** 2)))
