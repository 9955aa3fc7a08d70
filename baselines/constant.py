"""Constant predictors: the floor every rating model must beat."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from mnar_recsys.checks.ratings import check_fitted, check_on_scale, check_pairs, check_ratings


class ConstantPredictor:
    """Predict one given ``value`` everywhere (e.g. 2, near the MCAR mean of 1..5 rating data).

    ``fit`` only records the matrix shape so ``predict`` can reject out-of-range indices.
    """

    def __init__(self, value: float = 2.0, rating_scale: tuple[float, float] | None = (1.0, 5.0),
                 name: str | None = None) -> None:
        self.value = float(value)
        self.rating_scale = rating_scale
        self.name = name or f"constant-{self.value:g}"
        self.shape: tuple[int, int] | None = None

    def fit(self, train: sp.csr_matrix) -> "ConstantPredictor":
        """Record the shape of ``train``; its ratings are only checked against ``rating_scale``."""
        train = check_ratings(train)
        check_on_scale(train, self.rating_scale)
        self.shape = train.shape
        return self

    def settings(self) -> dict[str, object]:
        """The constant (after fitting, for the train mean) and the scale, for a results record."""
        return {"value": self.value, "rating_scale": self.rating_scale}

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """The constant, clipped to ``rating_scale``, once per (user, item) pair."""
        check_fitted(self, "shape")
        u, _ = check_pairs(users, items, self.shape)
        value = self.value
        if self.rating_scale is not None:
            value = float(np.clip(value, *self.rating_scale))
        return np.full(u.shape, value)


class TrainMean(ConstantPredictor):
    """Predict the mean of the observed (MNAR) train ratings everywhere."""

    def __init__(self, rating_scale: tuple[float, float] | None = (1.0, 5.0)) -> None:
        super().__init__(np.nan, rating_scale, name="train-mean")

    def fit(self, train: sp.csr_matrix) -> "TrainMean":
        """Record the shape and the mean stored rating of ``train``."""
        train = check_ratings(train)
        check_on_scale(train, self.rating_scale)
        self.shape, self.value = train.shape, float(train.data.mean())
        return self
