"""The interface every rating predictor shares (cornac-style fit / predict)."""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp


class Recommender(Protocol):
    """Fit on the MNAR train matrix, predict ratings for (user, item) pairs."""

    name: str

    def fit(self, train: sp.csr_matrix) -> "Recommender": ...

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray: ...


def settings_of(model: Recommender) -> dict[str, Any]:
    """A fitted model's own configuration for a results record: what its ``settings()`` says where it has one
    (what its config alone leaves out, such as how its propensities were estimated), else its dataclass config."""
    settings = getattr(model, "settings", None)
    if callable(settings):
        return settings()
    config = getattr(model, "config", None)
    return asdict(config) if is_dataclass(config) else {}
