"""Build any rating baseline by name: ``make_baseline("mf-ips", mcar_sample=sample, seed=1)``."""

from __future__ import annotations

from typing import Callable

from baselines.base import Recommender
from baselines.constant import ConstantPredictor, TrainMean
from baselines.ips import IPSMatrixFactorization
from baselines.mf import MatrixFactorization
from baselines.pmf import ProbabilisticMF

_FACTORIES: dict[str, Callable[..., Recommender]] = {
    "mf": MatrixFactorization,
    "pmf": ProbabilisticMF,
    "mf-ips": lambda **kw: IPSMatrixFactorization("naive-bayes", **kw),
    "mf-ips-mask": lambda **kw: IPSMatrixFactorization("mask", **kw),
    "constant-2": lambda **kw: ConstantPredictor(2.0, **kw),
    "train-mean": TrainMean,
}

BASELINES: tuple[str, ...] = tuple(_FACTORIES)


def make_baseline(name: str, **kwargs: object) -> Recommender:
    """Instantiate the baseline called ``name`` (one of ``BASELINES``) with keyword hyper-parameters.

    Keywords go to the model's constructor: config fields (``n_factors``, ``l2``, ``seed``, ...) for the
    factorisation models, ``mcar_sample`` for ``mf-ips``, ``rating_scale`` for the constants.
    """
    if name not in _FACTORIES:
        raise ValueError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")
    return _FACTORIES[name](**kwargs)
