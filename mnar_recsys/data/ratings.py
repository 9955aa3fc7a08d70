"""The container every ratings pipeline passes around: an MNAR train matrix and an MCAR test matrix."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp


@dataclass
class RatingsData:
    """User x item ratings with a self-selected (MNAR) train split and a random (MCAR) test split.

    Both matrices are CSR of the same shape; a stored entry is an observed rating (explicit zeros are
    not allowed), and ``item_ids[j]`` / ``user_ids[u]`` give the original identifiers of column j / row u.
    ``truth``, when known (the simulator), is the full dense rating matrix.
    """

    name: str
    train: sp.csr_matrix
    test: sp.csr_matrix
    rating_scale: tuple[int, int] = (1, 5)
    user_ids: np.ndarray | None = None
    item_ids: np.ndarray | None = None
    truth: np.ndarray | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.train.shape != self.test.shape:
            raise ValueError(f"{self.name}: train shape {self.train.shape} != test shape {self.test.shape}")

    @property
    def n_users(self) -> int:
        return self.train.shape[0]

    @property
    def n_items(self) -> int:
        return self.train.shape[1]

    def test_triples(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(users, items, ratings) of the MCAR test entries, in CSR order."""
        coo = self.test.tocoo()
        return coo.row.astype(np.int64), coo.col.astype(np.int64), coo.data.astype(np.float64)
