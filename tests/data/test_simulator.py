"""Synthetic MNAR simulator: Yahoo! R3-like aggregates on defaults, truth/oracle consistency, seeding."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit, ndtr

from mnar_recsys.data.simulator import SimulatorConfig, simulate_ratings

YAHOO_TRAIN_SHARES = [0.314, 0.127, 0.158, 0.156, 0.246]
YAHOO_MCAR_SHARES = [0.526, 0.242, 0.144, 0.062, 0.026]
SMALL = dict(n_users=1_500, n_items=400, n_test_users=500)


def shares(values: np.ndarray) -> np.ndarray:
    return np.bincount(values.astype(np.int64), minlength=6)[1:] / len(values)


@pytest.fixture(scope="module")
def default_data():
    return simulate_ratings(SimulatorConfig())


def test_default_rating_shares_look_like_yahoo(default_data):
    np.testing.assert_allclose(shares(default_data.train.data), YAHOO_TRAIN_SHARES, atol=0.03)
    np.testing.assert_allclose(shares(default_data.test.data), YAHOO_MCAR_SHARES, atol=0.03)
    assert default_data.train.data.mean() == pytest.approx(2.89, abs=0.1)
    assert default_data.test.data.mean() == pytest.approx(1.82, abs=0.1)


def test_default_sizes_and_activity_look_like_yahoo(default_data):
    assert default_data.train.shape == (15_400, 1_000)
    per_user = np.diff(default_data.train.indptr)
    assert per_user.min() == 10 and np.median(per_user) == 15
    assert per_user.mean() == pytest.approx(20.2, abs=0.5)
    assert 100 <= per_user.max() <= 1_000
    per_item = np.bincount(default_data.train.indices, minlength=1_000)
    assert 5 <= per_item.min() <= 40 and 120 <= np.median(per_item) <= 200 and per_item.max() >= 1_000
    test_users = np.diff(default_data.test.indptr)
    assert np.all(test_users[:5_400] == 10) and np.all(test_users[5_400:] == 0)


def test_truth_matches_observed_entries(default_data):
    for matrix in (default_data.train, default_data.test):
        rows, cols = matrix.nonzero()
        np.testing.assert_array_equal(default_data.truth[rows, cols], matrix[rows, cols].A1)
    assert default_data.truth.min() == 1 and default_data.truth.max() == 5
    # The truth itself is MCAR-distributed: a random cell has the MCAR shares.
    np.testing.assert_allclose(shares(default_data.truth.ravel()), YAHOO_MCAR_SHARES, atol=0.01)


def test_oracle_is_the_conditional_mean(default_data):
    params = default_data.meta["params"]
    signal = (
        params["user_factors"][:50] @ params["item_factors"].T
        + params["user_bias"][:50, None]
        + params["item_bias"][None, :]
    )
    exact = 1 + ndtr((signal[..., None] - params["thresholds"]) / params["noise_sd"]).sum(axis=-1)
    np.testing.assert_allclose(default_data.meta["oracle"][:50], exact, atol=1e-4)
    # Being E[r | u, i], it beats the best constant on the MCAR test set.
    users, items, ratings = default_data.test_triples()
    oracle_mse = np.mean((default_data.meta["oracle"][users, items] - ratings) ** 2)
    assert oracle_mse < 0.8 * np.var(ratings)


def test_selection_favours_high_ratings(default_data):
    propensity = default_data.meta["params"]["propensity"]
    assert np.all(np.diff(propensity) > 0)


def test_deterministic_given_seed():
    first, second = (simulate_ratings(SimulatorConfig(**SMALL, seed=7)) for _ in range(2))
    assert (first.train != second.train).nnz == 0 and (first.test != second.test).nnz == 0
    np.testing.assert_array_equal(first.truth, second.truth)
    np.testing.assert_array_equal(first.meta["oracle"], second.meta["oracle"])
    other = simulate_ratings(SimulatorConfig(**SMALL, seed=8))
    assert not np.array_equal(first.truth, other.truth)


def test_small_config_keeps_guarantees():
    data = simulate_ratings(SimulatorConfig(**SMALL, test_items_per_user=5, seed=3))
    assert data.train.shape == (1_500, 400)
    assert np.diff(data.train.indptr).min() == 10
    assert data.test.nnz == 500 * 5
    np.testing.assert_allclose(shares(data.train.data), YAHOO_TRAIN_SHARES, atol=0.03)
    # the MCAR items spread over the catalogue (measured: 399 of 400 items, at most 14 users on one; 2,500
    # uniform draws over 400 items put about 6.25 on each)
    assert np.unique(data.test.indices).size > 350 and np.bincount(data.test.indices).max() < 30


def test_a_user_drawn_to_rate_nothing_rates_nothing():
    """With min_ratings_per_user 0 some users draw 0 ratings; the race's cut-off at index n - 1 had then taken the
    largest key, and each of them had rated every item."""
    config = SimulatorConfig(n_users=200, n_items=50, n_test_users=20, min_ratings_per_user=0,
                             median_ratings_per_user=1.0, mean_ratings_per_user=2.0, seed=0)
    data = simulate_ratings(config)
    drawn = data.meta["params"]["ratings_per_user"]
    assert (drawn == 0).sum() > 10
    np.testing.assert_array_equal(np.diff(data.train.indptr), drawn)
    with pytest.raises(ValueError, match="min_ratings_per_user must be >= 0, got -1"):
        SimulatorConfig(min_ratings_per_user=-1)


@pytest.mark.parametrize("selection", ["race", "independent"])
def test_too_few_cells_for_every_rating_level_is_named(selection):
    """One user x 30 items often holds no 5: no propensity can select it (the race had raised a TypeError, the
    independent draw had put all the selection weight on the absent level)."""
    config = SimulatorConfig(n_users=1, n_items=30, n_test_users=1, test_items_per_user=3, selection=selection,
                             min_ratings_per_user=2, median_ratings_per_user=3.0, mean_ratings_per_user=4.0, seed=0)
    with pytest.raises(ValueError, match="no simulated cell has rating 5: 1 x 30 cells are too few"):
        simulate_ratings(config)
    nobody = SimulatorConfig(n_users=3, n_items=50, n_test_users=1, min_ratings_per_user=0,
                             median_ratings_per_user=0.1, mean_ratings_per_user=0.2, selection=selection, seed=0)
    with pytest.raises(ValueError, match="every simulated user drew 0 ratings"):
        simulate_ratings(nobody)


def test_independent_selection_is_the_stated_logistic_model():
    """Each cell is rated with Pr = sigmoid(intercept + log popularity_i + log propensity_r), solved so that
    the train shares are Yahoo's and the expected number of ratings is that of the race's budgets."""
    data = simulate_ratings(SimulatorConfig(**SMALL, selection="independent", seed=3))
    params = data.meta["params"]
    np.testing.assert_allclose(shares(data.train.data), YAHOO_TRAIN_SHARES, atol=0.03)
    assert data.train.nnz == pytest.approx(params["ratings_per_user"].sum(), rel=0.03)
    assert params["propensity"].sum() == pytest.approx(1.0) and np.all(np.diff(params["propensity"][1:]) > 0)
    probability = expit(params["selection_intercept"] + np.log(params["popularity"])[None, :]
                        + np.log(params["propensity"])[data.truth - 1])
    rated = np.zeros(data.truth.shape, dtype=bool)
    rated[data.train.nonzero()] = True
    for level in range(1, 6):
        cells = data.truth == level
        assert rated[cells].sum() == pytest.approx(probability[cells].sum(), rel=0.05)
    assert np.diff(data.train.indptr).min() < 10  # no per-user budget: counts vary freely
    np.testing.assert_allclose(shares(data.test.data), YAHOO_MCAR_SHARES, atol=0.03)


def test_invalid_config():
    with pytest.raises(ValueError, match="selection must be one of"):
        SimulatorConfig(selection="lottery")
    with pytest.raises(ValueError, match="train_shares must be positive and sum to 1"):
        SimulatorConfig(train_shares=(0.5, 0.5, 0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="min_ratings_per_user < median_ratings_per_user"):
        SimulatorConfig(median_ratings_per_user=25.0)
    with pytest.raises(ValueError, match=r"n_items \(5\) must exceed mean_ratings_per_user \(20\.2\)"):
        SimulatorConfig(n_items=5)
    with pytest.raises(ValueError, match=r"n_test_users must lie in 0\.\.n_users \(10\), got 11"):
        SimulatorConfig(n_users=10, n_test_users=11)
    with pytest.raises(ValueError, match=r"test_items_per_user must lie in 1\.\.n_items \(30\), got 31"):
        SimulatorConfig(n_items=30, test_items_per_user=31)
    with pytest.raises(ValueError, match="rank must be at least 1, got 0"):
        SimulatorConfig(rank=0)
    with pytest.raises(ValueError, match="n_users must be at least 1, got 0"):
        SimulatorConfig(n_users=0, n_test_users=0)
    with pytest.raises(ValueError, match="user_bias_var must be >= 0, got -1"):
        SimulatorConfig(user_bias_var=-1)
    with pytest.raises(ValueError, match="popularity_floor must be >= 0, got -1.0"):
        SimulatorConfig(popularity_floor=-1.0)
    with pytest.raises(ValueError, match="noise_var must be > 0, got 0"):
        SimulatorConfig(noise_var=0)
    with pytest.raises(ValueError, match=r"selection='logistic' needs n_items >= 20 x mean_ratings_per_user \(404\), "
                                         "got 200"):
        SimulatorConfig(n_items=200, selection="logistic")
    with pytest.raises(ValueError, match=r"activity_bias_correlation must lie in \(-1, 1\), got 1.0"):
        SimulatorConfig(activity_bias_correlation=1.0)


LOGISTIC = {"n_users": 1_500, "n_items": 1_000, "n_test_users": 500, "selection": "logistic"}


@pytest.fixture(scope="module")
def logistic_data():
    """The logistic selection at Yahoo! R3's density (1,000 items, about 2% rated), with fewer users."""
    return simulate_ratings(SimulatorConfig(**LOGISTIC, seed=1))


def test_logistic_selection_keeps_yahoos_shares(logistic_data):
    np.testing.assert_allclose(shares(logistic_data.train.data), YAHOO_TRAIN_SHARES, atol=0.02)
    # dropping light users favours users with high ratings; the thresholds are placed so that the kept users'
    # cells, and so their MCAR test ratings, still have Yahoo's MCAR shares
    np.testing.assert_allclose(shares(logistic_data.truth.ravel()), YAHOO_MCAR_SHARES, atol=0.02)
    np.testing.assert_allclose(shares(logistic_data.test.data), YAHOO_MCAR_SHARES, atol=0.03)
    assert logistic_data.train.data.mean() == pytest.approx(2.89, abs=0.1)


def test_logistic_selection_keeps_yahoos_counts(logistic_data):
    per_user = np.diff(logistic_data.train.indptr)
    assert per_user.min() == 10 and 14 <= np.median(per_user) <= 16  # light users dropped, as Yahoo! R3's were
    assert per_user.mean() == pytest.approx(20.2, abs=1.0) and per_user.max() >= 100
    assert logistic_data.train.nnz / np.prod(logistic_data.train.shape) == pytest.approx(0.02, abs=0.002)
    per_item = np.bincount(logistic_data.train.indices, minlength=1_000)
    assert per_item.max() > 10 * np.median(per_item)  # skewed by popularity
    params = logistic_data.meta["params"]
    assert params["users_drawn"] > 2 * 1_500 and params["activity"].shape == (1_500,)
    # Yahoo's shares rate a 1 a little more often than a 2 (0.314 / 0.526 against 0.127 / 0.242), then rising
    assert params["activity_sd"] > 0.3 and np.all(np.diff(params["propensity"][1:]) > 0)
    test_users = np.diff(logistic_data.test.indptr)
    assert np.all(test_users[:500] == 10) and np.all(test_users[500:] == 0)


def test_logistic_selection_is_consistent_with_its_truth_and_oracle(logistic_data):
    rows, cols = logistic_data.train.nonzero()
    np.testing.assert_array_equal(logistic_data.truth[rows, cols], logistic_data.train[rows, cols].A1)
    params = logistic_data.meta["params"]
    signal = (params["user_factors"][:50] @ params["item_factors"].T + params["user_bias"][:50, None]
              + params["item_bias"][None, :])
    exact = 1 + ndtr((signal[..., None] - params["thresholds"]) / params["noise_sd"]).sum(axis=-1)
    np.testing.assert_allclose(logistic_data.meta["oracle"][:50], exact, atol=1e-4)
    # the kept users' activity is the upper part of its normal distribution: they rate more than average;
    # and it goes with the rating bias (activity_bias_correlation 0.6 in the pool; 0.16 measured among the kept,
    # whose activity the dropping narrows)
    assert params["activity"].mean() > 0.3 * params["activity_sd"]
    assert np.corrcoef(params["activity"], params["user_bias"])[0, 1] > 0.08


@pytest.mark.slow  # two solves of the selection, 7 s
def test_logistic_selection_is_reproducible(logistic_data):
    again = simulate_ratings(SimulatorConfig(**LOGISTIC, seed=1))
    assert (again.train != logistic_data.train).nnz == 0 and (again.test != logistic_data.test).nnz == 0
    np.testing.assert_array_equal(again.truth, logistic_data.truth)
    assert again.meta["params"]["users_drawn"] == logistic_data.meta["params"]["users_drawn"]
    other = simulate_ratings(SimulatorConfig(**{**LOGISTIC, "n_users": 100, "n_items": 500, "n_test_users": 10},
                                             seed=2))
    assert not np.allclose(other.meta["params"]["user_bias"], logistic_data.meta["params"]["user_bias"][:100])
