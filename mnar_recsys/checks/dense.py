"""Checks of dense data with NaN for a missing entry, shared by the dense imputers and the not-MIWAE imputer."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike
from sklearn.utils import check_array


def pandas_missing_as_nan(X: object) -> object:
    """X with pandas' missing markers (None, pd.NA) read as NaN, in object and extension (e.g. string) columns
    too, which would put pd.NA back; other input as it is."""
    if not (hasattr(X, "isna") and hasattr(X, "mask")):
        return X
    dtypes = X.dtypes if X.ndim == 2 else [X.dtype]
    # NumPy's numeric columns hold no marker but NaN, and boxing them as objects costs a copy of every value
    if all(isinstance(dtype, np.dtype) and dtype.kind in "biuf" for dtype in dtypes):
        return X
    return X.astype(object).mask(X.isna(), np.nan)


def column_name(names: Sequence[object] | None, j: int) -> str:
    """'column j', with its name when the data came with column names."""
    return f"column {j} ({names[j]!r})" if names is not None else f"column {j}"


def non_numeric_entry(X: ArrayLike) -> tuple[int, object] | None:
    """(column, value) of the first entry that is not a number (strings, objects), or None."""
    array = np.asarray(X, dtype=object)
    if array.ndim != 2:
        return None
    for j in range(array.shape[1]):
        for value in array[:, j]:
            if isinstance(value, numbers.Number):  # complex too: scikit-learn's own message covers it
                continue
            try:
                float(value)
            except (TypeError, ValueError):
                return j, value
    return None


def non_numeric_error(X: ArrayLike, name: str) -> ValueError | None:
    """A ValueError naming the column (and its name) of X's first non-numeric entry, or None."""
    bad = non_numeric_entry(X)
    if bad is None:
        return None
    j, value = bad
    return ValueError(f"{name}: {column_name(getattr(X, 'columns', None), j)} holds the non-numeric value "
                      f"{value!r}; encode it as a number, or as NaN when missing")


def check_missing_data(X: ArrayLike, name: str, *, fitting: bool, n_features: int | None = None) -> np.ndarray:
    """X as a float64 2-d array (pandas' missing values become NaN); infinities and non-numeric entries are
    rejected, and when ``fitting`` so is an all-missing column."""
    X = pandas_missing_as_nan(X)
    try:  # a copy: imputers never modify the caller's array
        array = check_array(X, dtype=np.float64, copy=True, ensure_all_finite=False, ensure_2d=False,
                            allow_nd=True, ensure_min_samples=0, ensure_min_features=0)
    except (TypeError, ValueError) as error:
        named = non_numeric_error(X, name)
        if named is None:
            raise
        raise named from error
    if array.ndim != 2:
        raise ValueError(f"{name}: expected a 2-d array (rows x features), got shape {array.shape}")
    if array.shape[0] == 0:
        raise ValueError(f"{name}: X has no rows")
    if np.isinf(array).any():
        raise ValueError(f"{name}: X contains infinite values (use NaN to mark missing entries)")
    if n_features is not None and array.shape[1] != n_features:
        raise ValueError(f"{name}: X has {array.shape[1]} features, but the imputer was fitted on {n_features}")
    if fitting:
        empty = np.flatnonzero(np.isnan(array).all(axis=0))
        if empty.size:
            raise ValueError(
                f"{name}: column(s) {empty.tolist()} are entirely missing; nothing can be learnt about them "
                f"(drop them before imputing)"
            )
    return array


def standardisation(X: np.ndarray, name: str, standardize: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(centre, scale) per column: the observed mean and sd (1 for a constant column) with ``standardize``,
    else zeros and ones. A column whose spread overflows float64 (values beyond about 1e154) is refused:
    its sd would be inf and every imputation NaN."""
    d = X.shape[1]
    if not standardize:
        return np.zeros(d), np.ones(d)
    sd = np.nanstd(X, axis=0)
    overflowed = np.flatnonzero(~np.isfinite(sd))
    if overflowed.size:
        raise ValueError(f"{name}: column(s) {overflowed.tolist()} hold values too large to standardise (their "
                         "variance overflows float64); rescale them first")
    return np.nanmean(X, axis=0), np.where(sd > 0, sd, 1.0)
