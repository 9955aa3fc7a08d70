"""Rows in, one model path: sparse CSR ratings and dense NaN tables become the same `RowBatch`.

A `RowSource` validates its input once and cuts batches of rows. A batch carries the coordinates and
values of the observed entries, so the set encoder works with segment sums whose cost grows with the
number of observed entries; the dense values and mask are derived from them when a path needs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp
import torch

from mnar_recsys.checks.ratings import csr_keeping_duplicates


@dataclass
class RowBatch:
    """A batch of `n_rows` rows over `n_features` features, held as its observed entries.

    obs_row / obs_col / obs_value: (nnz,) coordinates and values of the observed entries.
    `values` ((B, p), 0 where missing) and `mask` ((B, p), 1 = observed) are built on first use on
    the batch's device, so a path that needs only the observed entries never forms a (B, p) tensor.
    """

    obs_row: torch.Tensor
    obs_col: torch.Tensor
    obs_value: torch.Tensor
    n_rows: int
    n_features: int

    @cached_property
    def values(self) -> torch.Tensor:
        dense = self.obs_value.new_zeros(self.n_rows, self.n_features)
        dense[self.obs_row, self.obs_col] = self.obs_value
        return dense

    @cached_property
    def mask(self) -> torch.Tensor:
        dense = self.obs_value.new_zeros(self.n_rows, self.n_features)
        dense[self.obs_row, self.obs_col] = 1.0
        return dense

    def to(self, device: torch.device | str) -> "RowBatch":
        return RowBatch(self.obs_row.to(device), self.obs_col.to(device), self.obs_value.to(device),
                        self.n_rows, self.n_features)


def _batch_from_coordinates(n_rows: int, n_features: int, rows: np.ndarray, cols: np.ndarray,
                            vals: np.ndarray) -> RowBatch:
    return RowBatch(torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)),
                    torch.from_numpy(np.ascontiguousarray(cols, dtype=np.int64)),
                    torch.from_numpy(np.ascontiguousarray(vals, dtype=np.float32)), n_rows, n_features)


def batch_from_csr(sub: sp.csr_matrix) -> RowBatch:
    """The batch holding every row of a (small, in-memory) CSR matrix; stored entries are observed."""
    rows = np.repeat(np.arange(sub.shape[0]), np.diff(sub.indptr))
    return _batch_from_coordinates(sub.shape[0], sub.shape[1], rows, sub.indices, sub.data)


SUMMARY_ROWS = 4096  # rows per batch read by RowSource.observed_summary


class RowSource:
    """Validated rows that can be cut into batches; build one with :func:`as_rows`."""

    n_rows: int
    n_features: int

    def batch(self, index: np.ndarray) -> RowBatch:
        raise NotImplementedError

    def observed_values(self) -> np.ndarray:
        """All observed values (for range checks)."""
        raise NotImplementedError

    def observed_summary(self, index: np.ndarray) -> tuple[np.ndarray, float]:
        """Over the rows `index`: the per-feature fraction where the feature is observed, shape (p,), and the
        mean observed value (0 without any), which the missing model starts from. Read SUMMARY_ROWS rows
        at a time, so that rows on disk stay there."""
        counts = np.zeros(self.n_features, dtype=np.int64)
        total, n_values = 0.0, 0
        for start in range(0, len(index), SUMMARY_ROWS):
            batch = self.batch(index[start:start + SUMMARY_ROWS])
            counts += np.bincount(batch.obs_col.numpy(), minlength=self.n_features)
            total += float(batch.obs_value.double().sum())
            n_values += batch.obs_value.numel()
        return counts / max(len(index), 1), total / n_values if n_values else 0.0


class CSRRows(RowSource):
    """Sparse rows: the stored entries of a CSR matrix are the observed ones."""

    def __init__(self, matrix: sp.csr_matrix):
        self.matrix = matrix
        self.n_rows, self.n_features = matrix.shape

    def batch(self, index: np.ndarray) -> RowBatch:
        return batch_from_csr(self.matrix[np.asarray(index)])

    def observed_values(self) -> np.ndarray:
        return self.matrix.data


class DenseRows(RowSource):
    """Dense rows: NaN marks a missing entry."""

    def __init__(self, array: np.ndarray):
        self.array = array
        self.observed = ~np.isnan(array)
        self.n_rows, self.n_features = array.shape

    def batch(self, index: np.ndarray) -> RowBatch:
        sub = self.array[np.asarray(index)]
        rows, cols = np.nonzero(~np.isnan(sub))
        return _batch_from_coordinates(sub.shape[0], self.n_features, rows, cols, sub[rows, cols])

    def observed_values(self) -> np.ndarray:
        return self.array[self.observed]


def _check_csr(matrix: sp.spmatrix) -> sp.csr_matrix:
    csr = csr_keeping_duplicates(matrix, np.float32)
    csr.sort_indices()
    row_of = np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))
    same = np.flatnonzero((np.diff(csr.indices) == 0) & (np.diff(row_of) == 0))
    if same.size:
        k = same[0]
        raise ValueError(f"sparse matrix has duplicate entries, first at row {row_of[k]}, column {csr.indices[k]}: "
                         "sum or drop them before passing the ratings")
    bad = np.flatnonzero(~np.isfinite(csr.data))
    if bad.size:
        k = bad[0]
        raise ValueError(f"observed values must be finite: entry (row {row_of[k]}, column {csr.indices[k]}) "
                         f"is {csr.data[k]}")
    zeros = np.flatnonzero(csr.data == 0)
    if zeros.size:
        k = zeros[0]
        raise ValueError(f"CSR matrix stores an explicit zero at (row {row_of[k]}, column {csr.indices[k]}): stored "
                         "entries are the observed ones, so a zero cannot mean 'missing'; call eliminate_zeros() "
                         "if that is what it means, or shift the rating scale")
    return csr


def as_rows(data: "np.ndarray | sp.spmatrix | RowSource") -> RowSource:
    """Validate rows given as a CSR matrix (stored = observed) or a dense array (NaN = missing)."""
    if isinstance(data, RowSource):
        return data
    if sp.issparse(data):
        return CSRRows(_check_csr(data))
    array = _as_float64(data)
    if array.ndim != 2:
        raise ValueError(f"rows must be a 2-d array (rows x features), got shape {array.shape}")
    inf = np.argwhere(np.isinf(array))
    if inf.size:
        r, c = inf[0]
        raise ValueError(f"observed values must be finite: entry (row {r}, column {c}) is {array[r, c]}")
    too_large = np.argwhere(np.abs(array) > np.finfo(np.float32).max)
    if too_large.size:
        r, c = too_large[0]
        raise ValueError(f"entry (row {r}, column {c}) is {array[r, c]}, beyond float32's range, which the models "
                         "compute in: rescale the data")
    return DenseRows(array.astype(np.float32))


def _as_float64(data: object) -> np.ndarray:
    """The rows as float64, or an error naming the first entry that is not a number."""
    try:
        return np.asarray(data, dtype=np.float64)
    except (TypeError, ValueError):
        entries = np.asarray(data, dtype=object)
        for index in np.ndindex(entries.shape):
            try:
                float(entries[index])
            except (TypeError, ValueError):
                where = f"(row {index[0]}, column {index[1]})" if len(index) == 2 else str(index)
                raise ValueError(f"rows must be numbers (NaN for missing): entry {where} is "
                                 f"{entries[index]!r}") from None
        raise
