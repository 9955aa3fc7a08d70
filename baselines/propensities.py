"""Propensity estimators P(O_ui = 1) for inverse-propensity scoring (Schnabel et al., ICML 2016).

Clipping: every estimate is clipped to [min_relative * density, 1], where density = nnz / (users x
items) is the overall observed fraction. With the default ``min_relative = 0.1`` no observed rating
weighs more than 10x what a uniformly observed cell would, which bounds the variance of the IPS loss;
it rarely binds for the Naive-Bayes estimate and guards against the mask model's outliers.
"""

from __future__ import annotations

import hashlib
import warnings
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression

from mnar_recsys.checks.ratings import check_ratings

DEFAULT_MIN_RELATIVE = 0.1
MIN_MCAR_PER_LEVEL = 10  # MCAR ratings per rating level below which P(Y = r) is too noisy to weight by


class SmallMCARSampleWarning(UserWarning):
    """The MCAR sample is too small for its rating shares, and so the propensities, to be trusted."""


def _clip(p: np.ndarray, density: float, min_relative: float) -> np.ndarray:
    if not 0.0 < min_relative <= 1.0:
        raise ValueError(f"min_relative must be in (0, 1], got {min_relative}")
    return np.clip(p, min_relative * density, 1.0)


@dataclass(frozen=True)
class RatingPropensities:
    """P(O = 1 | Y = r) for each rating value r in ``ratings`` (sorted)."""

    ratings: np.ndarray
    propensity: np.ndarray

    def __call__(self, y: np.ndarray) -> np.ndarray:
        """Propensity of each rating in ``y``; raises on a value that has no estimate."""
        y = np.asarray(y)
        pos = np.searchsorted(self.ratings, y)
        pos_c = np.minimum(pos, len(self.ratings) - 1)
        if (self.ratings[pos_c] != y).any():
            raise ValueError(f"ratings {np.setdiff1d(y, self.ratings)} have no propensity estimate")
        return self.propensity[pos_c]


def naive_bayes_propensities(
    train: sp.csr_matrix,
    mcar_sample: sp.csr_matrix,
    pseudo_count: float = 1.0,
    min_relative: float = DEFAULT_MIN_RELATIVE,
) -> RatingPropensities:
    """Naive-Bayes propensities P(O=1 | Y=r) = P(Y=r | O=1) P(O=1) / P(Y=r).

    P(Y=r | O=1) and P(O=1) come from the MNAR ``train``; P(Y=r) from the small ``mcar_sample`` (e.g.
    5% of the MCAR test, see ``mnar_recsys.data.splits.split_mcar_sample``). Both rating distributions get
    ``pseudo_count`` added per level so that a level absent from the small sample cannot divide by 0.
    Levels are the rating values seen in either matrix. Clipped as described in the module docstring.
    Warns (``SmallMCARSampleWarning``) when the sample holds fewer than ``MIN_MCAR_PER_LEVEL`` ratings a level on
    average.
    """
    train = check_ratings(train)
    mcar_sample = check_ratings(mcar_sample, "mcar_sample")
    if pseudo_count < 0:
        raise ValueError(f"pseudo_count must be >= 0, got {pseudo_count}")
    levels = np.union1d(train.data, mcar_sample.data)
    if mcar_sample.nnz < MIN_MCAR_PER_LEVEL * levels.size:
        warnings.warn(f"the MCAR sample holds {mcar_sample.nnz} ratings for {levels.size} rating levels, fewer than "
                      f"{MIN_MCAR_PER_LEVEL} a level on average: the Naive-Bayes propensities rest on a handful of "
                      "ratings and may be far off; give a larger MCAR sample", SmallMCARSampleWarning, stacklevel=2)

    def dist(values: np.ndarray, what: str) -> np.ndarray:
        counts = np.array([(values == r).sum() for r in levels], dtype=np.float64) + pseudo_count
        if (counts == 0).any():
            raise ValueError(f"{what} lacks rating levels {levels[counts == 0]}; use pseudo_count > 0")
        return counts / counts.sum()

    density = train.nnz / (train.shape[0] * train.shape[1])
    p = dist(train.data, "train") * density / dist(mcar_sample.data, "mcar_sample")
    return RatingPropensities(levels, _clip(p, density, min_relative))


@dataclass
class MaskPropensityConfig:
    """Logistic MF of the observation mask (``implicit.cpu.lmf``, Johnson 2014), then calibration.

    Attributes follow ``implicit``'s defaults (factors 30, lr 1.0, 30 iterations, 30 negatives per
    positive) except ``regularization``: 3.0 rather than 0.6, chosen by the AUC of held-out observed
    cells (10% of the Coat train mask) against never-observed ones (0.774 vs 0.690); the default
    memorises the mask and calls most observed cells certain. One thread keeps the Hogwild updates
    reproducible.
    ``calibration_cells`` caps the uniformly sampled cells used to calibrate the scores.
    """

    factors: int = 30
    learning_rate: float = 1.0
    regularization: float = 3.0
    iterations: int = 30
    neg_prop: int = 30
    calibration_cells: int = 2_000_000
    min_relative: float = DEFAULT_MIN_RELATIVE
    seed: int = 0


def _platt(scores: np.ndarray, labels: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Fit P(label=1) = sigmoid(a * score + b); return the fitted map from scores to probabilities."""
    # Standardised scores keep the (nearly unpenalised) fit well conditioned whatever the LMF scale.
    loc, scale = scores.mean(), scores.std() + 1e-12
    lr = LogisticRegression(C=1e6).fit(((scores - loc) / scale)[:, None], labels)
    return lambda s: lr.predict_proba(((s - loc) / scale)[:, None])[:, 1]


def _pair_scores(user_factors: np.ndarray, item_factors: np.ndarray, users: np.ndarray, items: np.ndarray,
                 block: int = 65_536) -> np.ndarray:
    """user_factors[users[k]] · item_factors[items[k]] for every k, a block of pairs at a time: gathering all
    2,000,000 calibration cells' factors at once took two 490 MB copies at the Yahoo! R3 size."""
    scores = np.empty(len(users))
    for start in range(0, len(users), block):
        stop = start + block
        scores[start:stop] = np.einsum("kf,kf->k", user_factors[users[start:stop]], item_factors[items[start:stop]])
    return scores


# the last masks' propensities, by pattern and settings: tuning mf-ips-mask fits the whole train's (to weigh
# the held-out ratings) and its fit part's, then the final fit asks for the whole train's again (a fit takes
# 5 to 15 s at the Yahoo! R3 size)
_RECENT_FITS: OrderedDict[tuple, np.ndarray] = OrderedDict()
_KEPT_FITS = 2


def mask_propensities(train: sp.csr_matrix, config: MaskPropensityConfig | None = None) -> np.ndarray:
    """P(O_ui = 1) for each stored entry of ``train`` (aligned with ``train.data``), from the mask alone.

    ``implicit``'s logistic MF is trained with negative sampling, so its scores rank cells but are not
    calibrated probabilities; a Platt scaling sigmoid(a * score + b), fitted on uniformly sampled cells
    (whose labels are the mask itself), maps them to the probability scale. Needs no MCAR data. Clipped as
    described in the module docstring.

    The observed cells are scored by the model fitted to them, so their estimates run high: on Coat the
    median is 0.29 where the density is 0.08 (in-sample AUC 0.92, 0.77 on held-out observed cells), and
    the sum of 1/p over them is about half the number of cells. Read them as relative weights, which is all
    the IPS loss uses (it rescales the weights to mean 1), not as probabilities.

    The last two results are kept, by the mask's pattern and the settings: a call for one of those masks
    returns a copy rather than fitting the same model again.
    """
    cfg = config or MaskPropensityConfig()
    train = check_ratings(train)
    pattern = hashlib.sha256(train.indptr.tobytes() + train.indices.tobytes()).hexdigest()
    key = (train.shape, pattern, tuple(asdict(cfg).items()))
    if key not in _RECENT_FITS:
        _RECENT_FITS[key] = _fit_mask_propensities(train, cfg)
        while len(_RECENT_FITS) > _KEPT_FITS:
            _RECENT_FITS.popitem(last=False)
    _RECENT_FITS.move_to_end(key)
    return _RECENT_FITS[key].copy()


def _fit_mask_propensities(train: sp.csr_matrix, cfg: MaskPropensityConfig) -> np.ndarray:
    from implicit.cpu.lmf import LogisticMatrixFactorization

    if train.nnz == train.shape[0] * train.shape[1]:
        raise ValueError("every cell of train is observed: the mask model has no unobserved cell to contrast them "
                         "with (with no selection, MF is the model to use)")
    mask = train.copy()
    mask.data[:] = 1.0
    lmf = LogisticMatrixFactorization(
        factors=cfg.factors,
        learning_rate=cfg.learning_rate,
        regularization=cfg.regularization,
        iterations=cfg.iterations,
        neg_prop=cfg.neg_prop,
        num_threads=1,
        random_state=cfg.seed,
    )
    lmf.fit(mask.astype(np.float32), show_progress=False)
    uf, itf = np.asarray(lmf.user_factors, dtype=np.float64), np.asarray(lmf.item_factors, dtype=np.float64)

    n_users, n_items = train.shape
    n_cells = n_users * n_items
    rng = np.random.default_rng(cfg.seed)
    cells = rng.choice(n_cells, size=min(n_cells, cfg.calibration_cells), replace=False)
    cu, ci = np.divmod(cells, n_items)
    labels = np.asarray(mask[cu, ci]).ravel()
    calibrate = _platt(_pair_scores(uf, itf, cu, ci), labels)

    coo = train.tocoo()
    p = calibrate(_pair_scores(uf, itf, coo.row, coo.col))
    return _clip(p, train.nnz / n_cells, cfg.min_relative)
