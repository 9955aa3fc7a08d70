import numpy as np
import pytest
import scipy.sparse as sp

from baselines.propensities import MaskPropensityConfig, mask_propensities, naive_bayes_propensities


def test_naive_bayes_propensities_ordered_and_close_to_truth(mnar_data):
    nb = naive_bayes_propensities(mnar_data.train, mnar_data.mcar_test(0.05, seed=0))
    np.testing.assert_array_equal(nb.ratings, [1, 2, 3, 4, 5])
    assert ((nb.propensity > 0) & (nb.propensity <= 1)).all()
    assert (np.diff(nb.propensity) > 0).all()  # users select high ratings more
    np.testing.assert_allclose(nb.propensity, [0.03, 0.06, 0.12, 0.24, 0.48], rtol=0.3)
    np.testing.assert_allclose(nb(np.array([5.0, 1.0])), nb.propensity[[4, 0]])
    with pytest.raises(ValueError, match="no propensity estimate"):
        nb(np.array([6.0]))


@pytest.mark.filterwarnings("ignore::baselines.propensities.SmallMCARSampleWarning")  # a sample small by design
def test_naive_bayes_hand_computed_and_clipped():
    train = sp.csr_matrix(np.array([[1.0, 2.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]]))  # density 3/8
    sample = sp.csr_matrix(np.array([[0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 2.0, 1.0]]))
    nb = naive_bayes_propensities(train, sample, pseudo_count=0.0)
    # P(Y=1|O)=1/3, P(Y=2|O)=2/3; P(Y=1)=4/5, P(Y=2)=1/5.
    np.testing.assert_allclose(nb.propensity, [1 / 3 * 3 / 8 / (4 / 5), 1.0])  # 2/3*3/8*5 = 1.25 -> clipped to 1
    floor = naive_bayes_propensities(train, sample, pseudo_count=0.0, min_relative=1.0)
    assert floor.propensity.min() == pytest.approx(3 / 8)
    with pytest.raises(ValueError, match="lacks rating levels"):
        naive_bayes_propensities(train, sp.csr_matrix(np.array([[1.0, 0.0]])), pseudo_count=0.0)


def test_mask_propensities_follow_item_popularity():
    rng = np.random.default_rng(0)
    n_users, n_items = 400, 100
    p_item = np.where(np.arange(n_items) < 50, 0.3, 0.03)  # first half popular
    mask = rng.random((n_users, n_items)) < p_item
    train = sp.csr_matrix(np.where(mask, rng.integers(1, 6, mask.shape), 0).astype(float))
    p = mask_propensities(train, MaskPropensityConfig(factors=5, iterations=20))
    assert p.shape == (train.nnz,)
    assert ((p > 0) & (p <= 1)).all()
    col = train.tocoo().col
    popular, rare = p[col < 50].mean(), p[col >= 50].mean()
    assert popular > 2 * rare
    # Calibrated: about right on average for the popular half, where the truth is 0.3.
    assert 0.15 < popular < 0.6


def test_a_fully_observed_matrix_is_named_not_passed_to_the_mask_model():
    """Every cell observed leaves the mask model no negatives (scikit-learn's calibration had said it needs
    samples of at least 2 classes)."""
    full = sp.csr_matrix(np.arange(1.0, 13.0).reshape(3, 4) % 5 + 1)
    with pytest.raises(ValueError, match="every cell of train is observed"):
        mask_propensities(full)


def test_the_same_mask_is_fitted_once(monkeypatch):
    """Tuning mf-ips-mask weighs its held-out ratings with the whole train's propensities and the final fit
    asks for them again: one fit serves both. The ratings' values do not enter, the mask and settings do."""
    import baselines.propensities as propensities

    calls = []
    fit = propensities._fit_mask_propensities
    monkeypatch.setattr(propensities, "_fit_mask_propensities", lambda *args: calls.append(1) or fit(*args))
    rng = np.random.default_rng(0)
    train = sp.csr_matrix(np.where(rng.random((60, 30)) < 0.2, rng.integers(1, 6, (60, 30)), 0).astype(float))
    config = MaskPropensityConfig(factors=3, iterations=5, seed=4)
    first = mask_propensities(train, config)
    first[:] = 0  # the caller's copy
    other_values = train.copy()
    other_values.data = 6 - other_values.data
    again = mask_propensities(other_values, config)
    assert len(calls) == 1 and (again > 0).all()
    fewer = train.copy()
    fewer.data[0] = 0
    fewer.eliminate_zeros()
    mask_propensities(fewer, config)  # as tuning fits its fit part
    mask_propensities(train, config)  # and the final fit the whole train again
    assert len(calls) == 2
    mask_propensities(train, MaskPropensityConfig(factors=3, iterations=5, seed=5))
    mask_propensities(fewer, config)  # evicted by then: two are kept
    assert len(calls) == 4
