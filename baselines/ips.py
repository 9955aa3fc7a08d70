"""MF-IPS (Schnabel et al., ICML 2016): biased MF whose squared loss weighs each observed rating by
1 / P(O_ui = 1), making the training loss an unbiased estimate of the loss over all cells.

Three named variants:
- ``mf-ips``: Naive-Bayes propensities P(O=1 | Y=r), which need a small MCAR sample. The sample is
  passed explicitly, to the constructor or to ``fit(train, mcar_sample=...)``; split it off the MCAR
  test with ``mnar_recsys.data.splits.split_mcar_sample`` and score on the rest only.
- ``mf-ips-mask``: propensities from a logistic MF of the observation mask alone; needs no MCAR data.
- ``mf-ips-given``: a users x items matrix of propensities estimated elsewhere, such as those Schnabel et
  al. ship with Coat (``mnar_recsys.data.coat.load_coat_propensities``), behind their published MSE.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from baselines.mf import MatrixFactorization, MFConfig
from baselines.propensities import (
    DEFAULT_MIN_RELATIVE,
    MaskPropensityConfig,
    mask_propensities,
    naive_bayes_propensities,
)
from mnar_recsys.checks.ratings import check_mcar_sample, check_on_scale, check_ratings


class IPSMatrixFactorization(MatrixFactorization):
    """MF trained with inverse-propensity weights (Recommender protocol).

    Args:
        propensity: ``"naive-bayes"`` (name ``mf-ips``), ``"mask"`` (name ``mf-ips-mask``) or ``"given"``
            (name ``mf-ips-given``).
        config: MF hyper-parameters (``MFConfig``; same defaults as plain MF, so the two differ only
            in the weights), or keyword overrides of its fields.
        mcar_sample: MCAR ratings for the Naive-Bayes variant; may instead be given to ``fit``.
        min_relative: propensity clip, see ``baselines.propensities``.
        mask_config: settings of the mask model (``mask`` variant); its seed follows ``config.seed``
            unless given.
        propensities: P(O_ui = 1) for every cell, users x items, each in (0, 1] (``given`` variant).
    """

    NAMES = {"naive-bayes": "mf-ips", "mask": "mf-ips-mask", "given": "mf-ips-given"}

    def __init__(
        self,
        propensity: Literal["naive-bayes", "mask", "given"] = "naive-bayes",
        config: MFConfig | None = None,
        mcar_sample: sp.csr_matrix | None = None,
        min_relative: float = DEFAULT_MIN_RELATIVE,
        mask_config: MaskPropensityConfig | None = None,
        propensities: np.ndarray | None = None,
        **overrides: object,
    ) -> None:
        if propensity not in self.NAMES:
            raise ValueError(f"propensity must be one of {', '.join(map(repr, self.NAMES))}, got {propensity!r}")
        if propensity != "naive-bayes" and mcar_sample is not None:
            raise ValueError(f"the {propensity!r} variant uses no MCAR data; do not pass mcar_sample")
        if (propensity == "given") != (propensities is not None):
            raise ValueError("pass propensities with the 'given' variant, and only with it")
        if propensities is not None:
            propensities = np.asarray(propensities, dtype=np.float64)
            if propensities.ndim != 2:
                raise ValueError(f"propensities must be a users x items matrix, got shape {propensities.shape}")
            if not ((propensities > 0) & (propensities <= 1)).all():
                raise ValueError(f"propensities must lie in (0, 1], got values in [{np.min(propensities)}, "
                                 f"{np.max(propensities)}]")
        if mask_config is not None and mask_config.min_relative != min_relative:
            raise ValueError(f"min_relative {min_relative} and mask_config.min_relative {mask_config.min_relative} "
                             "differ: the mask model clips by its config's; give one")
        super().__init__(config, **overrides)
        self.propensity = propensity
        self.name = self.NAMES[propensity]
        self.mcar_sample = mcar_sample
        self.propensities = propensities
        self.min_relative = min_relative
        self.mask_config = mask_config or MaskPropensityConfig(min_relative=min_relative, seed=self.config.seed)
        self.train_propensities: np.ndarray | None = None

    def settings(self) -> dict[str, Any]:
        """The MF config and how the propensities are estimated, for a results record."""
        return {**asdict(self.config), "propensities": self.propensity_settings()}

    def propensity_settings(self) -> dict[str, Any]:
        """How the propensities are estimated, for a results record."""
        if self.propensity == "naive-bayes":
            return {"estimator": "naive-bayes", "min_relative": self.min_relative}
        if self.propensity == "given":
            return {"estimator": "given", "mean": float(self.propensities.mean())}
        return {"estimator": "mask", **asdict(self.mask_config)}

    def fit(self, train: sp.csr_matrix, *, mcar_sample: sp.csr_matrix | None = None) -> "IPSMatrixFactorization":
        """Estimate a propensity for every stored rating of ``train``, then fit MF with weights 1 / p.

        ``mcar_sample`` (Naive-Bayes variant only) overrides the one given to the constructor; it must
        have ``train``'s shape and should be disjoint from the ratings later scored. The mask variant's
        propensities come from ``mask_propensities``, which keeps its last fits: tuning's grid points, all
        fitted to the same ratings, share one mask model.
        """
        train = check_ratings(train)
        check_on_scale(train, self.config.rating_scale)  # before the propensity model, the slow part
        self.train_propensities = self._estimate_propensities(train, mcar_sample)
        return super().fit(train, sample_weight=1.0 / self.train_propensities)

    def _estimate_propensities(self, train: sp.csr_matrix, mcar_sample: sp.csr_matrix | None) -> np.ndarray:
        """P(O_ui = 1) of each stored rating of ``train`` (checked CSR), aligned with ``train.data``."""
        if mcar_sample is not None and self.propensity != "naive-bayes":
            raise ValueError(f"the {self.propensity!r} variant uses no MCAR data; do not pass mcar_sample")
        if self.propensity == "naive-bayes":
            sample = check_mcar_sample(self.name, train, mcar_sample, self.mcar_sample)
            return naive_bayes_propensities(train, sample, min_relative=self.min_relative)(train.data)
        if self.propensity == "given":
            if self.propensities.shape != train.shape:
                raise ValueError(f"propensities shape {self.propensities.shape} != train shape {train.shape}")
            entries = train.tocoo()
            return self.propensities[entries.row, entries.col]  # CSR order, as train.data
        return mask_propensities(train, self.mask_config)
