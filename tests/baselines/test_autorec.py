"""I-AutoRec: what its objective implies (per-user biases, penalised weights, capacity) and its input checks."""

import numpy as np
import pytest
import scipy.sparse as sp

from baselines.autorec import AutoRec, AutoRecConfig
from mnar_recsys.evaluation.metrics import mse


def test_recovers_low_rank_ratings_better_than_the_global_mean(mcar_data):
    """Measured: MSE over all cells 0.25 with 100 hidden units against 1.85 for the train mean."""
    u, i, y = mcar_data.all_cells()
    train = mcar_data.train
    baseline = mse(y, np.full_like(y, train.data.mean()))
    assert mse(y, AutoRec(hidden=100, l2=10.0).fit(train).predict(u, i)) < 0.25 * baseline


def test_same_seed_same_fit_and_predictions_on_the_scale(mcar_data):
    u, i, _ = mcar_data.all_cells()
    a = AutoRec(hidden=32, seed=3).fit(mcar_data.train).predict(u, i)
    b = AutoRec(hidden=32, seed=3).fit(mcar_data.train).predict(u, i)
    np.testing.assert_array_equal(a, b)
    assert a.min() >= 1.0 and a.max() <= 5.0
    assert not np.array_equal(a, AutoRec(hidden=32, seed=4).fit(mcar_data.train).predict(u, i))


def test_a_heavy_penalty_leaves_each_users_mean_rating(mcar_data):
    """Only the weights are penalised: as l2 grows they vanish and each output unit's bias, one per user
    (the item-based form), fits that user's mean rating, whatever the item. At l2 = 1e8 L-BFGS stops after
    a few steps, the float32 loss no longer changing, so this also checks the closing exact bias step
    (without it this test fails; on a 12 x 9 example the biases ended 2.0 from the means)."""
    train = mcar_data.train[:60, :40]
    model = AutoRec(hidden=8, l2=1e8).fit(train)
    rated = np.diff(train.indptr) > 0
    users, items = np.nonzero(np.ones(train.shape, dtype=bool))
    user_means = np.asarray(train.sum(1)).ravel()[rated] / np.diff(train.indptr)[rated]
    np.testing.assert_allclose(model.predict(users, items).reshape(train.shape)[rated],
                               np.repeat(user_means[:, None], 40, axis=1), atol=1e-4)


def test_a_light_penalty_fits_the_train_ratings_closely(mcar_data):
    """Measured: train MSE 1e-7 with 64 hidden units and l2 = 0.001, against 1.12 at the default l2."""
    train = mcar_data.train[:60, :40]
    model = AutoRec(hidden=64, l2=1e-3, n_iters=500).fit(train)
    fitted = train.tocoo()
    assert mse(fitted.data, model.predict(fitted.row, fitted.col)) < 0.05


def test_a_user_without_train_ratings_is_predicted_the_train_mean(mcar_data):
    """Its decoder row feels the penalty alone, so its optimum is zero, which the fit sets once L-BFGS stops
    (measured before that: 0.044 off the train mean at l2 = 0.01), and its bias keeps its start."""
    train = mcar_data.train[:60, :40].tolil()
    train[5, :] = 0
    train = train.tocsr()
    train.eliminate_zeros()
    model = AutoRec(hidden=16, l2=0.01).fit(train)
    np.testing.assert_allclose(model.predict(np.full(40, 5), np.arange(40)), train.data.mean(), rtol=1e-6)


def test_bad_input_is_refused():
    train = sp.csr_matrix(np.array([[1.0, 0.0, 3.0], [0.0, 5.0, 2.0]]))
    with pytest.raises(ValueError, match="not fitted"):
        AutoRec().predict(np.array([0]), np.array([0]))
    with pytest.raises(ValueError, match="no stored ratings"):
        AutoRec().fit(sp.csr_matrix((2, 3)))
    with pytest.raises(ValueError, match="sparse"):
        AutoRec().fit(train.toarray())
    with pytest.raises(ValueError, match=r"outside rating_scale \(1.0, 5.0\), the first 7 at \(user 1, item 1\)"):
        AutoRec().fit(sp.csr_matrix(np.array([[1.0, 0.0, 3.0], [0.0, 7.0, 2.0]])))
    for l2 in (0.0, float("inf"), True):  # inf gave NaN predictions, True trained as 1
        with pytest.raises(ValueError, match="AutoRecConfig.l2 must be positive and finite"):
            AutoRec(l2=l2).fit(train)
    with pytest.raises(ValueError, match="AutoRecConfig.hidden"):
        AutoRec(hidden=8.0).fit(train)
    with pytest.raises(TypeError):
        AutoRec(n_factors=3)
    fitted = AutoRec(hidden=4, n_iters=5).fit(train)
    with pytest.raises(ValueError, match="item index out of range"):
        fitted.predict(np.array([0]), np.array([3]))
    assert AutoRec(AutoRecConfig(l2=3.0), seed=2).config == AutoRecConfig(l2=3.0, seed=2)
