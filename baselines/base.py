"""The interface every rating predictor shares (cornac-style fit / predict)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import scipy.sparse as sp


class Recommender(Protocol):
    """Fit on the MNAR train matrix, predict ratings for (user, item) pairs."""

    name: str

    def fit(self, train: sp.csr_matrix) -> "Recommender": ...

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray: ...
