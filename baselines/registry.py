"""Build any rating baseline by name, ``make_baseline("mf-ips", mcar_sample=sample, seed=1)``, and choose its
hyper-parameters on the train ratings, ``tune_baseline("mf", train, seed=1)``."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import scipy.sparse as sp

from baselines._checks import check_ratings
from baselines.autorec import AUTOREC_GRID, AutoRec
from baselines.base import Recommender
from baselines.constant import ConstantPredictor, TrainMean
from baselines.dr import DoublyRobustMF
from baselines.ips import IPSMatrixFactorization
from baselines.mf import MF_GRID, MatrixFactorization
from baselines.pmf import PMF_GRID, ProbabilisticMF
from baselines.propensities import mask_propensities, naive_bayes_propensities
from baselines.selection import select_config

_FACTORIES: dict[str, Callable[..., Recommender]] = {
    "mf": MatrixFactorization,
    "pmf": ProbabilisticMF,
    "autorec": AutoRec,
    "mf-ips": lambda **kw: IPSMatrixFactorization("naive-bayes", **kw),
    "mf-ips-mask": lambda **kw: IPSMatrixFactorization("mask", **kw),
    "mf-ips-given": lambda **kw: IPSMatrixFactorization("given", **kw),
    "mf-dr": lambda **kw: DoublyRobustMF("naive-bayes", **kw),
    "mf-dr-mask": lambda **kw: DoublyRobustMF("mask", **kw),
    "mf-dr-given": lambda **kw: DoublyRobustMF("given", **kw),
    "constant-2": lambda **kw: ConstantPredictor(2.0, **kw),
    "train-mean": TrainMean,
}

BASELINES: tuple[str, ...] = tuple(_FACTORIES)


def make_baseline(name: str, **kwargs: object) -> Recommender:
    """Instantiate the baseline called ``name`` (one of ``BASELINES``) with keyword hyper-parameters.

    Keywords go to the model's constructor: config fields (``n_factors``, ``l2``, ``seed``, ...) for the
    factorisation models and AutoRec, ``mcar_sample`` for ``mf-ips`` and ``mf-dr``, ``propensities`` for
    ``mf-ips-given`` and ``mf-dr-given``, ``rating_scale`` for the constants.
    """
    if name not in _FACTORIES:
        raise ValueError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")
    return _FACTORIES[name](**kwargs)


# the grid each tunable baseline's hyper-parameters are chosen from; the MF-IPS and MF-DR models share MF's
GRIDS: dict[str, tuple[dict[str, float], ...]] = {
    "mf": MF_GRID, "pmf": PMF_GRID, "autorec": AUTOREC_GRID,
    **{name: MF_GRID for name in ("mf-ips", "mf-ips-mask", "mf-ips-given", "mf-dr", "mf-dr-mask", "mf-dr-given")}}


def tune_baseline(name: str, train: sp.csr_matrix, *, seed: int = 0, mcar_sample: sp.csr_matrix | None = None,
                  fraction: float = 0.1, **kwargs: Any) -> tuple[dict, list[tuple[dict, float]]]:
    """Choose baseline `name`'s hyper-parameters from ``GRIDS[name]`` on a held-out `fraction` of the
    `train` ratings (drawn with `seed`), never on MCAR test ratings beyond the `mcar_sample` that mf-ips and
    mf-dr train with: (the chosen keywords, every (keywords, validation score) tried). Other `kwargs` (e.g.
    rating_scale, min_relative) go to every model built.

    MF, PMF and AutoRec are scored by their held-out MSE, as their defaults were chosen. The held-out ratings are
    MNAR like the rest, so the MF-IPS and MF-DR models are scored by its IPS estimate, each held-out squared
    error weighted by 1 / the propensity the model trains with (Naive-Bayes from the train ratings and the
    MCAR sample; the mask model's, fitted to the whole train mask, for the -mask variants; the given
    matrix's, passed as ``propensities``, for the -given ones), as Schnabel et al. (2016) select them.
    """
    if name not in _FACTORIES:
        raise ValueError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")
    if name not in GRIDS:
        raise ValueError(f"baseline {name!r} has no hyper-parameters to tune; tunable: {', '.join(GRIDS)}")
    train = check_ratings(train)
    model = make_baseline(name, seed=seed, **kwargs)  # its propensity settings weigh the held-out ratings
    fit_kwargs, weigh = {}, None
    kind = getattr(model, "propensity", None)
    if kind == "naive-bayes":
        if mcar_sample is None:
            raise ValueError(f"tuning {name} needs the MCAR sample it trains with: pass mcar_sample")
        fit_kwargs = {"mcar_sample": mcar_sample}
        propensity = naive_bayes_propensities(train, mcar_sample, min_relative=model.min_relative)

        def weigh_by_rating(held: sp.csr_matrix) -> np.ndarray:
            return 1.0 / propensity(held.data)
        weigh = weigh_by_rating
    elif kind in ("mask", "given"):
        if kind == "mask":  # mask_propensities keeps this fit for the final model's
            propensities = train.copy()
            propensities.data = mask_propensities(train, model.mask_config)
        else:
            propensities = model.propensities

        def weigh_by_cell(held: sp.csr_matrix) -> np.ndarray:
            entries = held.tocoo()
            return 1.0 / np.asarray(propensities[entries.row, entries.col]).ravel()
        weigh = weigh_by_cell
    return select_config(lambda **grid: make_baseline(name, seed=seed, **kwargs, **grid), train, GRIDS[name],
                         fraction, seed, fit_kwargs=fit_kwargs, weigh=weigh)
