"""Checks of rating matrices and (user, item) pairs, shared by every rating model: one place for the error messages."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def csr_keeping_duplicates(matrix: sp.spmatrix, dtype: type) -> sp.csr_matrix:
    """A CSR copy of a sparse matrix in `dtype`; scipy's own conversion from other formats would add up
    repeated entries, which a check for duplicates must still see."""
    if matrix.format == "csr":
        return sp.csr_matrix(matrix, dtype=dtype, copy=True)
    coo = matrix.tocoo()
    order = np.lexsort((coo.col, coo.row))
    indptr = np.concatenate([[0], np.cumsum(np.bincount(coo.row, minlength=coo.shape[0]))])
    return sp.csr_matrix((coo.data[order].astype(dtype), coo.col[order], indptr), shape=coo.shape)


def check_ratings(train: sp.spmatrix, what: str = "train", keep_order: bool = False) -> sp.csr_matrix:
    """Return ``train`` as float64 CSR in canonical form (sorted indices), refusing empty or non-finite
    rating matrices, duplicate entries and explicit zeros (a stored entry is an observed rating).

    With ``keep_order`` a matrix whose indices are unsorted is refused rather than reordered: per-rating
    ``sample_weight`` arrays are aligned with ``train.data`` and reordering would misalign them.
    """
    if not sp.issparse(train):
        raise ValueError(f"{what} must be a scipy sparse matrix, got {type(train).__name__}")
    if train.format != "csr" and keep_order:  # converting reorders the entries
        raise ValueError(f"{what} must be a CSR matrix when weights are given: they follow its stored order")
    csr = csr_keeping_duplicates(train, np.float64)
    if not csr.has_canonical_format:
        if keep_order:
            raise ValueError(f"{what} must be in canonical CSR form (sorted indices) when weights are given")
        nnz = csr.nnz
        csr.sum_duplicates()
        if csr.nnz != nnz:
            raise ValueError(f"{what} stores duplicate (user, item) entries")
    if csr.nnz == 0:
        raise ValueError(f"{what} has no stored ratings")
    bad = np.flatnonzero(~np.isfinite(csr.data))
    if bad.size:
        first = bad[0]
        user = int(np.searchsorted(csr.indptr, first, side="right") - 1)
        raise ValueError(f"{what} contains {bad.size} non-finite ratings, the first {csr.data[first]} at (user {user}, "
                         f"item {csr.indices[first]})")
    if (csr.data == 0).any():
        raise ValueError(f"{what} stores explicit zeros; call .eliminate_zeros() (a stored entry is a rating)")
    return csr


def check_on_scale(ratings: sp.csr_matrix, rating_scale: tuple[float, float] | None, what: str = "train") -> None:
    """Refuse stored ratings outside ``rating_scale``, which predictions are clipped to: on another scale
    (1..10, say) clipping at the default 5 would cap every prediction silently. None allows any value."""
    if rating_scale is None:
        return
    low, high = rating_scale
    outside = np.flatnonzero((ratings.data < low) | (ratings.data > high))
    if outside.size:
        first = outside[0]
        user = int(np.searchsorted(ratings.indptr, first, side="right") - 1)
        raise ValueError(f"{what} holds {outside.size} ratings outside rating_scale {rating_scale}, the first "
                         f"{ratings.data[first]:g} at (user {user}, item {ratings.indices[first]}): pass the data's "
                         "rating_scale (None for no clipping)")


def check_pairs(users: np.ndarray, items: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Validate (user, item) index arrays against a fitted ``shape``; return them as int64."""
    users = np.asarray(users)
    items = np.asarray(items)
    if users.shape != items.shape:
        raise ValueError(f"users shape {users.shape} != items shape {items.shape}")
    for arr, n, label in ((users, shape[0], "user"), (items, shape[1], "item")):
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{label} indices must be integers, got dtype {arr.dtype}")
        if arr.size and (arr.min() < 0 or arr.max() >= n):
            raise ValueError(f"{label} index out of range [0, {n}): min {arr.min()}, max {arr.max()}")
    return users.astype(np.int64), items.astype(np.int64)


def check_sample_weight(sample_weight: np.ndarray | None, nnz: int) -> np.ndarray:
    """Per-rating weights aligned with ``train.data`` (CSR order), rescaled to mean 1 (ones if None)."""
    if sample_weight is None:
        return np.ones(nnz)
    w = np.asarray(sample_weight, dtype=np.float64)
    if w.shape != (nnz,):
        raise ValueError(f"sample_weight must have shape ({nnz},) to match the stored ratings, got {w.shape}")
    if not np.isfinite(w).all() or (w <= 0).any():
        raise ValueError("sample_weight must be finite and strictly positive")
    # Only relative weights matter; mean 1 keeps the L2 strength comparable with unweighted fits.
    return w / w.mean()


def check_fitted(obj: object, attr: str) -> None:
    """Raise if ``obj.fit`` has not run yet."""
    if getattr(obj, attr, None) is None:
        raise ValueError(f"{type(obj).__name__} is not fitted; call fit(train) first")


def check_mcar_sample(name: str, train: sp.csr_matrix, passed: sp.csr_matrix | None,
                      stored: sp.csr_matrix | None) -> sp.csr_matrix:
    """The MCAR sample model `name` fits with: the one `passed` to fit, else the one `stored` by its constructor;
    refused when neither was given or when its shape is not `train`'s."""
    sample = passed if passed is not None else stored
    if sample is None:
        raise ValueError(f"{name} needs an MCAR sample: pass mcar_sample to the constructor or fit()")
    if sample.shape != train.shape:
        raise ValueError(f"mcar_sample shape {sample.shape} != train shape {train.shape}")
    return sample
