"""Every rating baseline as one spec, built by name and tuned on the train ratings.

``make_baseline("mf-ips", mcar_sample=sample, seed=1)`` builds one; ``tune_baseline("mf", train, seed=1)`` chooses
its hyper-parameters. Adding a baseline is its class plus one ``BaselineSpec`` entry in ``SPECS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import scipy.sparse as sp

from baselines.autorec import AUTOREC_GRID, AutoRec
from baselines.base import Recommender
from baselines.constant import ConstantPredictor, TrainMean
from baselines.dr import DoublyRobustMF
from baselines.dr_jl import DRJL_GRID, DoublyRobustJointMF, DoublyRobustJointNFM
from baselines.ips import IPSMatrixFactorization
from baselines.mf import MF_GRID, MatrixFactorization
from baselines.mf_mnar import MF_MNAR_GRID, MFMNAR
from baselines.mixture import MIXTURE_GRID, MultinomialMixture
from baselines.pmf import PMF_GRID, ProbabilisticMF
from baselines.propensities import mask_propensities, naive_bayes_propensities
from baselines.selection import select_config
from baselines.vae_cf import VAE_GRID, GaussianVAE
from mnar_recsys.checks.ratings import check_ratings


@dataclass(frozen=True)
class BaselineSpec:
    """What the pipelines need to know of a baseline besides its class.

    Attributes:
        factory: builds the unfitted model from keyword hyper-parameters.
        grid: the points ``tune_baseline`` chooses from on held-out train ratings; empty: nothing to tune.
        seeded: whether the factory takes ``seed`` (deterministic constants do not).
        uses_mcar_sample: whether ``fit`` takes the seed's 5% MCAR sample (``fit(train, mcar_sample=...)``).
        given_propensities: whether it reads propensities estimated elsewhere (Coat's file), ``propensities=``.
        reference: a reference row (a constant predictor), not a method under comparison.
        published: its MCAR MSE in the not-MIWAE paper's Yahoo! R3 table, where it has a row.
    """

    factory: Callable[..., Recommender]
    grid: tuple[dict[str, Any], ...] = ()
    seeded: bool = True
    uses_mcar_sample: bool = False
    given_propensities: bool = False
    reference: bool = False
    published: float | None = None


SPECS: dict[str, BaselineSpec] = {
    "mf": BaselineSpec(MatrixFactorization, MF_GRID, published=1.891),
    "pmf": BaselineSpec(ProbabilisticMF, PMF_GRID, published=1.709),
    "autorec": BaselineSpec(AutoRec, AUTOREC_GRID, published=1.438),
    "gaussian-vae": BaselineSpec(GaussianVAE, VAE_GRID, published=1.381),
    "mf-ips": BaselineSpec(lambda **kw: IPSMatrixFactorization("naive-bayes", **kw), MF_GRID, uses_mcar_sample=True,
                           published=0.989),
    "mf-ips-mask": BaselineSpec(lambda **kw: IPSMatrixFactorization("mask", **kw), MF_GRID),
    "mf-ips-given": BaselineSpec(lambda **kw: IPSMatrixFactorization("given", **kw), MF_GRID,
                                 given_propensities=True),
    "mf-dr": BaselineSpec(lambda **kw: DoublyRobustMF("naive-bayes", **kw), MF_GRID, uses_mcar_sample=True),
    "mf-dr-mask": BaselineSpec(lambda **kw: DoublyRobustMF("mask", **kw), MF_GRID),
    "mf-dr-given": BaselineSpec(lambda **kw: DoublyRobustMF("given", **kw), MF_GRID, given_propensities=True),
    "mf-dr-jl": BaselineSpec(lambda **kw: DoublyRobustJointMF("naive-bayes", **kw), DRJL_GRID, uses_mcar_sample=True,
                             published=0.966),
    "mf-dr-jl-mask": BaselineSpec(lambda **kw: DoublyRobustJointMF("mask", **kw), DRJL_GRID),
    "nfm-dr-jl": BaselineSpec(lambda **kw: DoublyRobustJointNFM("naive-bayes", **kw), DRJL_GRID,
                              uses_mcar_sample=True, published=0.957),
    "nfm-dr-jl-mask": BaselineSpec(lambda **kw: DoublyRobustJointNFM("mask", **kw), DRJL_GRID),
    "mf-mnar": BaselineSpec(MFMNAR, MF_MNAR_GRID, published=2.199),
    "mixture": BaselineSpec(lambda **kw: MultinomialMixture("none", **kw), MIXTURE_GRID),
    "cpt-v": BaselineSpec(lambda **kw: MultinomialMixture("cpt-v", **kw), MIXTURE_GRID, published=1.115),
    "cpt-v-mcar": BaselineSpec(lambda **kw: MultinomialMixture("cpt-v", prior="mcar", **kw), MIXTURE_GRID,
                               uses_mcar_sample=True, published=1.115),
    "logit-vd": BaselineSpec(lambda **kw: MultinomialMixture("logit-vd", **kw), MIXTURE_GRID, published=1.301),
    "logit-vd-mcar": BaselineSpec(lambda **kw: MultinomialMixture("logit-vd", prior="mcar", **kw), MIXTURE_GRID,
                                  uses_mcar_sample=True, published=1.301),
    "constant-2": BaselineSpec(lambda **kw: ConstantPredictor(2.0, **kw), seeded=False, reference=True),
    "train-mean": BaselineSpec(TrainMean, seeded=False, reference=True),
}

BASELINES: tuple[str, ...] = tuple(SPECS)
# the grid each tunable baseline's hyper-parameters are chosen from
GRIDS: dict[str, tuple[dict[str, Any], ...]] = {name: spec.grid for name, spec in SPECS.items() if spec.grid}


def spec_of(name: str) -> BaselineSpec:
    """The spec of baseline ``name``; an unknown name is refused with the list of known ones."""
    if name not in SPECS:
        raise ValueError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")
    return SPECS[name]


def make_baseline(name: str, **kwargs: object) -> Recommender:
    """Instantiate the baseline called ``name`` (one of ``BASELINES``) with keyword hyper-parameters.

    Keywords go to the model's constructor: config fields (``n_factors``, ``l2``, ``seed``, ...), ``mcar_sample``
    for the models that use it, ``propensities`` for the -given ones, ``rating_scale`` for all.
    """
    return spec_of(name).factory(**kwargs)


def tune_baseline(name: str, train: sp.csr_matrix, *, seed: int = 0, mcar_sample: sp.csr_matrix | None = None,
                  fraction: float = 0.1, **kwargs: Any) -> tuple[dict, list[tuple[dict, float]]]:
    """Choose baseline `name`'s hyper-parameters from its grid on a held-out `fraction` of the `train` ratings
    (drawn with `seed`), never on MCAR test ratings beyond the `mcar_sample` the model trains with: (the chosen
    keywords, every (keywords, validation score) tried). Other `kwargs` (e.g. rating_scale) go to every model.

    Models without propensities are scored by their held-out MSE. The held-out ratings are MNAR like the rest,
    so a model with propensities (attribute ``propensity``) is scored by the IPS estimate, each held-out squared
    error weighted by 1 / the propensity it trains with, as Schnabel et al. (2016) select them.
    """
    spec = spec_of(name)
    if not spec.grid:
        raise ValueError(f"baseline {name!r} has no hyper-parameters to tune; tunable: {', '.join(GRIDS)}")
    train = check_ratings(train)
    model = make_baseline(name, seed=seed, **kwargs)  # its propensity settings weigh the held-out ratings
    fit_kwargs: dict[str, Any] = {}
    if spec.uses_mcar_sample:
        if mcar_sample is None:
            raise ValueError(f"tuning {name} needs the MCAR sample it trains with: pass mcar_sample")
        fit_kwargs = {"mcar_sample": mcar_sample}
    weigh = _inverse_propensity_weights(model, train, mcar_sample)
    return select_config(lambda **grid: make_baseline(name, seed=seed, **kwargs, **grid), train, spec.grid,
                         fraction, seed, fit_kwargs=fit_kwargs, weigh=weigh)


def _inverse_propensity_weights(model: Recommender, train: sp.csr_matrix, mcar_sample: sp.csr_matrix | None
                                ) -> Callable[[sp.csr_matrix], np.ndarray] | None:
    """1 / the propensity `model` trains with, per held-out rating; None for a model without propensities."""
    kind = getattr(model, "propensity", None)
    if kind == "naive-bayes":
        propensity = naive_bayes_propensities(train, mcar_sample, min_relative=model.min_relative)
        return lambda held: 1.0 / propensity(held.data)
    if kind not in ("mask", "given"):
        return None
    if kind == "mask":  # mask_propensities keeps this fit for the final model's
        propensities = train.copy()
        propensities.data = mask_propensities(train, model.mask_config)
    else:
        propensities = model.propensities

    def weigh_by_cell(held: sp.csr_matrix) -> np.ndarray:
        entries = held.tocoo()
        return 1.0 / np.asarray(propensities[entries.row, entries.col]).ravel()
    return weigh_by_cell
