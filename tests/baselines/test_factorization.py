from functools import partial

import numpy as np
import pytest
import scipy.sparse as sp

from baselines.mf import MatrixFactorization, MFConfig
from baselines.pmf import PMFConfig, ProbabilisticMF
from mnar_recsys.evaluation.metrics import mse

MODELS = [MatrixFactorization, ProbabilisticMF, partial(ProbabilisticMF, biases=False)]


@pytest.mark.parametrize("model", MODELS)
def test_recovers_low_rank_better_than_global_mean(model, mcar_data):
    u, i, y = mcar_data.all_cells()
    train = mcar_data.train
    baseline = mse(y, np.full_like(y, train.data.mean()))
    assert mse(y, model().fit(train).predict(u, i)) < 0.3 * baseline


@pytest.mark.parametrize("model", MODELS)
def test_same_seed_same_fit_and_predictions_in_scale(model, mcar_data):
    u, i, _ = mcar_data.all_cells()
    a = model(seed=3).fit(mcar_data.train).predict(u, i)
    b = model(seed=3).fit(mcar_data.train).predict(u, i)
    np.testing.assert_array_equal(a, b)
    assert a.min() >= 1.0 and a.max() <= 5.0


def test_config_and_overrides_agree():
    assert MatrixFactorization(MFConfig(l2=0.5), seed=2).config == MFConfig(l2=0.5, seed=2)
    assert ProbabilisticMF(n_factors=4).config == PMFConfig(n_factors=4)
    with pytest.raises(TypeError):
        MatrixFactorization(not_a_field=1)


@pytest.mark.parametrize("model, penalty", [(MatrixFactorization, "l2"), (ProbabilisticMF, "lambda_u"),
                                            (ProbabilisticMF, "lambda_v")])
@pytest.mark.parametrize("value", [0.0, float("inf"), True])
def test_a_penalty_must_be_positive_and_finite(model, penalty, value):
    """An infinite penalty had fitted and predicted NaN everywhere; True had fitted as 1."""
    train = sp.csr_matrix(np.array([[1.0, 0.0, 3.0], [0.0, 5.0, 2.0]]))
    with pytest.raises(ValueError, match=f"{penalty} must be positive and finite"):
        model(**{penalty: value}).fit(train)


def test_sample_weight_changes_the_fit(mcar_data):
    train = mcar_data.train
    u, i, _ = mcar_data.all_cells()
    # Up-weighting the 5s must raise predictions on average.
    w = np.where(train.data == 5, 10.0, 1.0)
    plain = MatrixFactorization().fit(train).predict(u, i)
    weighted = MatrixFactorization().fit(train, sample_weight=w).predict(u, i)
    assert weighted.mean() > plain.mean() + 0.1


@pytest.mark.parametrize("model", MODELS)
def test_bad_input_is_refused(model):
    train = sp.csr_matrix(np.array([[1.0, 0.0, 3.0], [0.0, 5.0, 2.0]]))
    with pytest.raises(ValueError, match="not fitted"):
        model().predict(np.array([0]), np.array([0]))
    with pytest.raises(ValueError, match="no stored ratings"):
        model().fit(sp.csr_matrix((2, 3)))
    with pytest.raises(ValueError, match="sparse"):
        model().fit(train.toarray())
    fitted = model(n_factors=2).fit(train)
    with pytest.raises(ValueError, match="item index out of range"):
        fitted.predict(np.array([0]), np.array([3]))
    with pytest.raises(ValueError, match="user index out of range"):
        fitted.predict(np.array([-1]), np.array([0]))
    with pytest.raises(ValueError, match="users shape"):
        fitted.predict(np.array([0, 1]), np.array([0]))


def test_mf_refuses_misaligned_weights():
    train = sp.csr_matrix(np.array([[1.0, 0.0, 3.0], [0.0, 5.0, 2.0]]))
    with pytest.raises(ValueError, match="sample_weight must have shape"):
        MatrixFactorization().fit(train, sample_weight=np.ones(3))
    with pytest.raises(ValueError, match="strictly positive"):
        MatrixFactorization().fit(train, sample_weight=np.array([1.0, 0.0, 1.0, 1.0]))
    unsorted = sp.csr_matrix((np.array([3.0, 1.0]), np.array([2, 0]), np.array([0, 2])), shape=(1, 3))
    with pytest.raises(ValueError, match="canonical"):
        MatrixFactorization().fit(unsorted, sample_weight=np.ones(2))
    assert MatrixFactorization(n_factors=1).fit(unsorted).predict(np.array([0]), np.array([2])).shape == (1,)
    duplicated = sp.csr_matrix((np.array([3.0, 1.0]), np.array([2, 2]), np.array([0, 2])), shape=(1, 3))
    with pytest.raises(ValueError, match="duplicate"):
        MatrixFactorization().fit(duplicated)
    # in COO, scipy's conversion would add the two ratings into a 4, and reorder weighted ratings
    coo = sp.coo_matrix((np.array([3.0, 1.0, 2.0]), (np.array([0, 0, 1]), np.array([2, 2, 0]))), shape=(2, 3))
    with pytest.raises(ValueError, match="duplicate"):
        MatrixFactorization().fit(coo)
    listed_backwards = sp.coo_matrix((np.array([5.0, 1.0]), (np.array([1, 0]), np.array([0, 1]))), shape=(2, 2))
    with pytest.raises(ValueError, match="must be a CSR matrix when weights are given"):
        MatrixFactorization().fit(listed_backwards, sample_weight=np.array([100.0, 1.0]))


def test_validation_selection_uses_train_only(mcar_data):
    from baselines.selection import select_config, validation_split

    fit, val = validation_split(mcar_data.train, fraction=0.1, seed=0)
    assert fit.nnz + val.nnz == mcar_data.train.nnz and fit.multiply(val).nnz == 0
    grid = [{"lambda_u": lam, "lambda_v": lam} for lam in (1e4, 0.01, 5.0, 50.0)]
    fitted = []

    class Spy(ProbabilisticMF):
        def fit(self, train):
            fitted.append(train)
            return super().fit(train)

    best, scores = select_config(Spy, mcar_data.train, grid)
    # every score is the held-out MSE of a model fitted without the held-out ratings, and the best is chosen
    vc = val.tocoo()
    for (kwargs, score), seen in zip(scores, fitted):
        assert (seen != fit).nnz == 0
        expected = ProbabilisticMF(**kwargs).fit(fit).predict(vc.row, vc.col)
        assert score == pytest.approx(np.mean((expected - vc.data) ** 2))
    assert [kwargs for kwargs, _ in scores] == grid and best == min(scores, key=lambda s: s[1])[0]
    assert best != grid[0]  # the first entry is not the answer by default


def test_pmf_is_the_map_estimate_with_each_sides_own_prior():
    """At the optimum of sum_obs (r - mu - u.v)^2 + lambda_u |U|^2 + lambda_v |V|^2, E V = lambda_u U and
    E^T U = lambda_v V for the observed residuals E (measured: both within 3e-15 after 300 sweeps)."""
    rng = np.random.default_rng(0)
    ratings = sp.csr_matrix(rng.integers(1, 6, (30, 20)) * (rng.random((30, 20)) < 0.4))
    model = ProbabilisticMF(n_factors=3, lambda_u=2.0, lambda_v=8.0, biases=False, n_iters=300, seed=0).fit(ratings)
    U, V = model.user_factors, model.item_factors
    rows, cols = ratings.nonzero()
    residual = sp.csr_matrix((np.asarray(ratings[rows, cols]).ravel() - model.global_mean
                              - np.einsum("kf,kf->k", U[rows], V[cols]), (rows, cols)), shape=ratings.shape)
    np.testing.assert_allclose(residual @ V, 2.0 * U, atol=1e-8)
    np.testing.assert_allclose(residual.T @ U, 8.0 * V, atol=1e-8)


@pytest.mark.parametrize("model", MODELS)
def test_ratings_off_the_clipping_scale_are_refused(model):
    """Predictions are clipped to rating_scale: fitted to 1..10 ratings under the default 1..5, every prediction
    would have been capped at 5 without a word."""
    train = sp.csr_matrix(np.array([[1.0, 0.0, 7.0], [0.0, 10.0, 2.0]]))
    with pytest.raises(ValueError, match=r"2 ratings outside rating_scale \(1\.0, 5\.0\), the first 7 at \(user 0, "
                                         r"item 2\)"):
        model().fit(train)
    predicted = model(n_factors=2, rating_scale=(1.0, 10.0)).fit(train).predict(np.array([1]), np.array([1]))
    assert predicted[0] > 5
    for field in ("n_factors", "n_iters"):  # 2.0 had failed inside NumPy as a bare TypeError
        with pytest.raises(ValueError, match=f"Config.{field} must be a positive integer, got 2.0"):
            model(**{field: 2.0}).fit(train)


def test_pmf_with_biases_is_the_map_estimate_with_each_sides_own_prior():
    """With biases each side's prior covers its bias too: at the optimum, besides E V = lambda_u U and
    E^T U = lambda_v V, each user's residuals sum to lambda_u b_u and each item's to lambda_v b_i."""
    rng = np.random.default_rng(0)
    ratings = sp.csr_matrix(rng.integers(1, 6, (30, 20)) * (rng.random((30, 20)) < 0.4))
    model = ProbabilisticMF(n_factors=3, lambda_u=2.0, lambda_v=8.0, biases=True, n_iters=300, seed=0).fit(ratings)
    U, V, bu, bi = model.user_factors, model.item_factors, model.user_bias, model.item_bias
    rows, cols = ratings.nonzero()
    residual = sp.csr_matrix((np.asarray(ratings[rows, cols]).ravel() - model.global_mean - bu[rows] - bi[cols]
                              - np.einsum("kf,kf->k", U[rows], V[cols]), (rows, cols)), shape=ratings.shape)
    np.testing.assert_allclose(residual @ V, 2.0 * U, atol=1e-8)
    np.testing.assert_allclose(residual.T @ U, 8.0 * V, atol=1e-8)
    np.testing.assert_allclose(np.asarray(residual.sum(1)).ravel(), 2.0 * bu, atol=1e-8)
    np.testing.assert_allclose(np.asarray(residual.sum(0)).ravel(), 8.0 * bi, atol=1e-8)
    assert np.abs(bu).max() > 0.1 and np.abs(bi).max() > 0.1


def test_pmf_biases_help_where_users_and_items_differ_in_level(mcar_data):
    """The fixture's ratings carry user and item offsets (sd 0.6 each) that the factors alone must spend rank on
    (measured MSE over all cells at 2 factors: 0.50 with biases, 1.04 without)."""
    u, i, y = mcar_data.all_cells()
    plain = mse(y, ProbabilisticMF(n_factors=2, biases=False).fit(mcar_data.train).predict(u, i))
    biased = mse(y, ProbabilisticMF(n_factors=2, biases=True).fit(mcar_data.train).predict(u, i))
    assert biased < plain - 0.05
    without = ProbabilisticMF(n_factors=2, biases=False).fit(mcar_data.train)
    assert not without.user_bias.any() and not without.item_bias.any()
    with pytest.raises(ValueError, match="PMFConfig.biases must be True or False, got 1"):
        ProbabilisticMF(biases=1).fit(mcar_data.train)
