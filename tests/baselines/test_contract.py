"""The contract every registered baseline keeps, checked over every entry of the registry: it fits and predicts
on the rating scale, a seed repeats it, a pickled fit predicts the same, and bad input is refused clearly.

The slowest fits run at their defaults in the slow tier; the fast tier checks the same contract on a short fit of
each (fewer steps, the same code)."""

import pickle

import numpy as np
import pytest
import scipy.sparse as sp

from baselines.registry import BASELINES, SPECS, make_baseline

# keyword overrides that cut each slow baseline's fit to a fraction of a second
SHORT = {"mf-mnar": {"n_iters": 20}, "gaussian-vae": {"epochs": 10}, "autorec": {"n_iters": 20},
         **{name: {"n_steps": 100, "init_iters": 3} for name in ("mf-dr-jl", "mf-dr-jl-mask", "nfm-dr-jl",
                                                                   "nfm-dr-jl-mask")}}
CASES = ([pytest.param(name, marks=pytest.mark.slow if name in SHORT else ()) for name in BASELINES]
         + [pytest.param(f"{name}:short") for name in SHORT])


def build(case: str, data, seed: int = 1):
    """The baseline of `case`: a registry name, or `name:short` for that baseline with its SHORT overrides."""
    name, _, short = case.partition(":")
    spec = SPECS[name]
    kwargs = dict(SHORT[name]) if short else {}
    if spec.seeded:
        kwargs["seed"] = seed
    if spec.uses_mcar_sample:
        kwargs["mcar_sample"] = data.mcar_test(0.02, seed=0)
    if spec.given_propensities:
        kwargs["propensities"] = data.propensity
    return make_baseline(name, **kwargs)


@pytest.fixture(scope="module")
def fitted(mnar_data):
    """Each baseline fitted once with seed 1, built lazily so a failing one names itself."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = build(name, mnar_data).fit(mnar_data.train)
        return cache[name]
    return get


@pytest.mark.parametrize("name", CASES)
def test_it_fits_and_predicts_on_the_rating_scale_under_its_name(name, mnar_data, fitted):
    model = fitted(name)
    assert model.name == name.partition(":")[0]
    u, i, _ = mnar_data.all_cells()
    predicted = model.predict(u[::7], i[::7])
    assert predicted.shape == (u[::7].size,) and np.isfinite(predicted).all()
    assert predicted.min() >= 1.0 and predicted.max() <= 5.0


@pytest.mark.parametrize("name", CASES)
def test_a_seed_repeats_the_fit_and_a_pickled_fit_predicts_the_same(name, mnar_data, fitted):
    u, i, _ = mnar_data.all_cells()
    first = fitted(name).predict(u[::11], i[::11])
    again = build(name, mnar_data).fit(mnar_data.train).predict(u[::11], i[::11])
    np.testing.assert_array_equal(first, again)
    restored = pickle.loads(pickle.dumps(fitted(name)))
    np.testing.assert_array_equal(restored.predict(u[::11], i[::11]), first)


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_refused_naming_what_is_wrong(name, mnar_data, fitted):
    train = mnar_data.train
    with pytest.raises(ValueError, match="is not fitted; call fit"):
        build(name, mnar_data).predict(np.array([0]), np.array([0]))
    with pytest.raises(ValueError, match="train must be a scipy sparse matrix"):
        build(name, mnar_data).fit(train.toarray())
    off_scale = train.copy()
    off_scale.data[3] = 7.0
    with pytest.raises(ValueError, match="ratings outside rating_scale"):
        build(name, mnar_data).fit(off_scale)
    with pytest.raises(ValueError, match="non-finite ratings"):
        broken = train.copy()
        broken.data[0] = np.nan
        build(name, mnar_data).fit(broken)
    model = fitted(name)
    with pytest.raises(ValueError, match=r"item index out of range \[0, 300\)"):
        model.predict(np.array([0, 1]), np.array([0, 300]))
    with pytest.raises(ValueError, match="user indices must be integers"):
        model.predict(np.array([0.5]), np.array([1]))
    assert sp.issparse(train)
