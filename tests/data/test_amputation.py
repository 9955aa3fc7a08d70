"""Amputation mechanisms: shapes, rates, what each conditions on, seeding, validation."""

import numpy as np
import pytest

from mnar_recsys.data import amputation as amp

MECHANISMS = [amp.mcar, amp.mar_logistic, amp.mnar_logistic, amp.self_masking_logistic]


@pytest.fixture(scope="module")
def X():
    rng = np.random.default_rng(0)
    return rng.standard_normal((4000, 6)) @ rng.standard_normal((6, 6))


def test_standardize(X):
    Xs, mean, sd = amp.standardize(X)
    np.testing.assert_allclose(Xs.mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(Xs.std(0), 1)
    np.testing.assert_allclose(Xs * sd + mean, X)


def test_standardize_constant_column():
    Xs, _, sd = amp.standardize(np.array([[1.0, 2.0], [1.0, 4.0]]))
    assert sd[0] == 1.0 and np.all(Xs[:, 0] == 0)


def test_paper_self_masking(X):
    Xs, _, _ = amp.standardize(X)
    mask = amp.paper_self_masking(Xs)
    assert mask.shape == X.shape
    assert np.all(mask[:, 3:] == 1)
    np.testing.assert_array_equal(mask[:, :3] == 0, Xs[:, :3] > 0)
    stricter = amp.paper_self_masking(Xs, offset=0.5)
    np.testing.assert_array_equal(stricter[:, :3] == 0, Xs[:, :3] > 0.5)
    # on raw data each masked feature's own mean and sd set its cut-off (standardised, every column's are 0 and 1)
    raw = amp.paper_self_masking(X, offset=0.5)
    np.testing.assert_array_equal(raw[:, :3] == 0, X[:, :3] > X[:, :3].mean(0) + 0.5 * X[:, :3].std(0))
    assert np.all(raw[:, 3:] == 1)
    # NaN compares False everywhere, which had masked the whole first half; one feature has no first half
    with pytest.raises(ValueError, match="offset must be a finite number of sd, got nan"):
        amp.paper_self_masking(Xs, offset=float("nan"))
    with pytest.raises(ValueError, match="needs at least 2, got 1"):
        amp.paper_self_masking(Xs[:, :1])


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_rate_shape_and_seed(X, mechanism):
    mask = mechanism(X, 0.3, seed=1)
    assert mask.shape == X.shape and set(np.unique(mask)) <= {0, 1}
    missing = 1 - mask.mean(0)
    amputed = missing[missing > 0]
    np.testing.assert_allclose(amputed, 0.3, atol=0.04)
    np.testing.assert_array_equal(mask, mechanism(X, 0.3, seed=1))
    assert not np.array_equal(mask, mechanism(X, 0.3, seed=2))


def _perturb(X, cols, seed=0):
    """X with the given columns replaced by unrelated noise."""
    Y = X.copy()
    Y[:, cols] = np.random.default_rng(seed).standard_normal((len(X), len(cols)))
    return Y


def test_mar_conditions_only_on_always_observed(X):
    mask = amp.mar_logistic(X, 0.3, seed=3, p_obs=0.5)
    always = np.flatnonzero(mask.all(0))
    amputed = np.flatnonzero(~mask.all(0))
    assert always.size == 3
    np.testing.assert_array_equal(mask, amp.mar_logistic(_perturb(X, amputed), 0.3, seed=3, p_obs=0.5))
    assert not np.array_equal(mask, amp.mar_logistic(_perturb(X, always), 0.3, seed=3, p_obs=0.5))


def test_mnar_logistic_inputs_are_masked_and_drive_missingness(X):
    """The amputed features' missingness follows the input features' values, not their own."""
    mask = amp.mnar_logistic(X, 0.3, seed=5, p_params=0.5)
    assert (mask == 0).any(axis=0).all()  # inputs are masked too
    inputs = np.random.default_rng(5).permutation(X.shape[1])[:3]  # the function's first draw picks them
    amputed = np.setdiff1d(np.arange(X.shape[1]), inputs)
    np.testing.assert_array_equal(mask, amp.mnar_logistic(_perturb(X, amputed), 0.3, seed=5, p_params=0.5))
    changed = amp.mnar_logistic(_perturb(X, inputs), 0.3, seed=5, p_params=0.5)
    assert not np.array_equal(mask[:, amputed], changed[:, amputed])


def test_self_masking_conditions_only_on_own_value(X):
    mask = amp.self_masking_logistic(X, 0.4, seed=4)
    other = amp.self_masking_logistic(_perturb(X, [1]), 0.4, seed=4)
    np.testing.assert_array_equal(np.delete(mask, 1, axis=1), np.delete(other, 1, axis=1))
    assert not np.array_equal(mask[:, 1], other[:, 1])
    corr = [abs(np.corrcoef(X[:, j], mask[:, j])[0, 1]) for j in range(X.shape[1])]
    assert np.mean(corr) > 0.15


def test_extreme_rates(X):
    assert amp.self_masking_logistic(X, 0.0, seed=0).all()
    assert not amp.self_masking_logistic(X, 1.0, seed=0).any()
    assert amp.mcar(X, 0.0, seed=0).all()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_validation(mechanism):
    with pytest.raises(ValueError, match=r"p must lie in \[0, 1\], got 1.5"):
        mechanism(np.zeros((3, 2)), 1.5, seed=0)
    with pytest.raises(ValueError, match="NaN or infinite"):
        mechanism(np.array([[1.0, np.nan], [0.0, 1.0]]), 0.2, seed=0)
    with pytest.raises(ValueError, match="2-d array"):
        mechanism(np.zeros(3), 0.2, seed=0)


def test_apply_mask():
    X = np.arange(6.0).reshape(2, 3)
    out = amp.apply_mask(X, np.array([[1, 0, 1], [0, 1, 1]]))
    np.testing.assert_array_equal(np.isnan(out), [[False, True, False], [True, False, False]])
    with pytest.raises(ValueError, match="mask shape"):
        amp.apply_mask(X, np.ones((3, 2)))
