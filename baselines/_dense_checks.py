"""Input checks shared by the dense imputers (NaN marks a missing entry)."""

from __future__ import annotations

import numpy as np


def check_missing_data(X, name: str, *, fitting: bool, n_features: int | None = None) -> np.ndarray:
    """X as a float64 2-d array; infinities are rejected, and when ``fitting`` so is an all-missing column."""
    X = np.array(X, dtype=np.float64)  # a copy: imputers never modify the caller's array
    if X.ndim != 2:
        raise ValueError(f"{name}: expected a 2-d array (rows x features), got shape {X.shape}")
    if X.shape[0] == 0:
        raise ValueError(f"{name}: X has no rows")
    if np.isinf(X).any():
        raise ValueError(f"{name}: X contains infinite values (use NaN to mark missing entries)")
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"{name}: X has {X.shape[1]} features, but the imputer was fitted on {n_features}")
    if fitting:
        empty = np.flatnonzero(np.isnan(X).all(axis=0))
        if empty.size:
            raise ValueError(
                f"{name}: column(s) {empty.tolist()} are entirely missing; nothing can be learnt about them "
                f"(drop them before imputing)"
            )
    return X
