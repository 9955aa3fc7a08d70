"""Random splits of a rating matrix's stored entries: the MCAR sample some models train with, held-out ratings."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from mnar_recsys.checks.ratings import check_ratings


def split_entries(ratings: sp.csr_matrix, fraction: float, seed: int) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Draw round(fraction * nnz) stored entries (at least 1) uniformly without replacement.

    Returns (drawn, rest): two CSR matrices of ``ratings``' shape that partition its entries.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    ratings = check_ratings(ratings, "ratings")
    drawn = np.zeros(ratings.nnz, dtype=bool)
    n_drawn = max(1, int(round(fraction * ratings.nnz)))
    drawn[np.random.default_rng(seed).choice(ratings.nnz, size=n_drawn, replace=False)] = True
    coo = ratings.tocoo()

    def part(sel: np.ndarray) -> sp.csr_matrix:
        return sp.csr_matrix((coo.data[sel], (coo.row[sel], coo.col[sel])), shape=ratings.shape)

    return part(drawn), part(~drawn)


def split_mcar_sample(test: sp.csr_matrix, fraction: float = 0.05,
                      seed: int = 0) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Split the MCAR test ratings uniformly at random into (sample, rest), both of the test's shape.

    ``sample`` holds round(fraction * nnz) ratings (at least 1) for estimating P(Y=r); ``rest`` is what
    should be scored, so the propensity model never sees a scored rating.
    """
    return split_entries(test, fraction, seed)
