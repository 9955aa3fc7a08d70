import numpy as np
import pytest
import scipy.sparse as sp

from baselines.dr import DR_L2, DoublyRobustMF
from baselines.ips import IPSMatrixFactorization
from baselines.mf import MatrixFactorization, MFConfig
from mnar_recsys.evaluation.metrics import mse


def _low_rank_model(n_users: int, n_items: int, seed: int, spread: float = 0.5) -> MatrixFactorization:
    """An MF on the 1..5 scale whose parameters are set by hand: its unclipped predictions are a known
    low-rank matrix."""
    rng = np.random.default_rng(seed)
    model = MatrixFactorization(n_factors=3)
    model.global_mean = 3.0
    model.user_bias, model.item_bias = rng.normal(0, 0.3, n_users), rng.normal(0, 0.3, n_items)
    model.user_factors = rng.normal(0, spread, (n_users, 3))
    model.item_factors = rng.normal(0, spread, (n_items, 3))
    return model


def _dense(model: MatrixFactorization) -> np.ndarray:
    return (model.global_mean + model.user_bias[:, None] + model.item_bias[None]
            + model.user_factors @ model.item_factors.T)


def test_the_prediction_fit_is_als_on_the_dense_dr_targets():
    """fit_prediction never forms the users x items targets; the same sweeps on the dense matrix agree. r̃
    reaches off the rating scale, where the targets take it unclipped, as its low-rank form does."""
    rng = np.random.default_rng(0)
    n_users, n_items, l2, sweeps = 40, 25, 0.3, 4
    train = sp.csr_matrix(np.where(rng.random((n_users, n_items)) < 0.2, rng.integers(1, 6, (n_users, n_items)), 0.0))
    imputation = _low_rank_model(n_users, n_items, seed=1, spread=1.2)
    assert ((_dense(imputation) < 1) | (_dense(imputation) > 5))[train.toarray() > 0].sum() > 5
    weight = rng.uniform(0.5, 20.0, train.nnz)
    model = DoublyRobustMF("given", propensities=np.full(train.shape, 0.2), n_factors=3, l2=l2, n_iters=sweeps)
    model.fit_prediction(train, imputation, weight)

    targets = _dense(imputation)
    observed = train.toarray() > 0
    targets[observed] += weight * (train.data - targets[observed])  # boolean indexing is row-major, as CSR
    mu = targets.mean()
    q, bi = np.random.default_rng(model.config.seed).normal(0.0, model.config.init_std, (n_items, 3)), np.zeros(n_items)
    for _ in range(sweeps):
        items = np.column_stack([q, np.ones(n_items)])
        x = np.linalg.solve(items.T @ items + l2 * n_items * np.eye(4), items.T @ (targets - mu - bi).T).T
        p, bu = x[:, :-1], x[:, -1]
        users = np.column_stack([p, np.ones(n_users)])
        y = np.linalg.solve(users.T @ users + l2 * n_users * np.eye(4), users.T @ (targets - mu - bu[:, None])).T
        q, bi = y[:, :-1], y[:, -1]
    assert model.global_mean == pytest.approx(mu, abs=1e-12)
    for fitted, expected in ((model.user_factors, p), (model.user_bias, bu), (model.item_factors, q),
                             (model.item_bias, bi)):
        np.testing.assert_allclose(fitted, expected, atol=1e-10)


def test_an_exact_imputation_makes_any_propensities_harmless():
    """One half of double robustness: with r̃ equal to the truth, every correction o (r - r̃) / p vanishes, so
    every target is the truth whatever the propensities: wild weights fit what unit ones fit, close to the
    truth however the ratings were selected."""
    n_users, n_items = 300, 200
    truth_model = _low_rank_model(n_users, n_items, seed=2)
    truth = _dense(truth_model)
    rng = np.random.default_rng(3)
    # self-selection on the value: high ratings observed far more often
    observed = rng.random(truth.shape) < np.where(truth > 3.0, 0.3, 0.03)
    train = sp.csr_matrix(np.where(observed, truth, 0.0))
    fits = []
    for weight in (rng.uniform(0.1, 100.0, train.nnz), np.ones(train.nnz)):
        model = DoublyRobustMF("given", propensities=np.ones(truth.shape), n_factors=3, l2=1e-4, rating_scale=None)
        model.fit_prediction(train, truth_model, weight)
        fits.append(_dense(model))
    np.testing.assert_allclose(fits[0], fits[1], atol=1e-9)
    assert np.abs(fits[0] - truth).max() < 0.1


def test_with_true_propensities_a_poor_imputation_is_corrected(mnar_data):
    """The other half: r̃ a constant far from the truth, the propensities right; the DR fit's mean over all
    cells comes back to the truth's where r̃'s is off by 1.5 (and naive MF's by over 0.5)."""
    u, i, y = mnar_data.all_cells()
    train = mnar_data.train
    constant = _low_rank_model(*train.shape, seed=0)
    constant.user_factors[:], constant.item_factors[:], constant.user_bias[:], constant.item_bias[:] = 0, 0, 0, 0
    constant.global_mean = y.mean() + 1.5
    inverse = 1.0 / mnar_data.true_propensities_of_train()
    model = DoublyRobustMF("given", propensities=mnar_data.propensity)
    model.fit_prediction(train, constant, inverse * (y.size / inverse.sum()))
    assert abs(model.predict_unclipped(u, i).mean() - y.mean()) < 0.1
    assert MatrixFactorization().fit(train).predict(u, i).mean() > y.mean() + 0.5


def test_mf_dr_starts_from_mf_ips_and_beats_it_here(mnar_data):
    """r̃ is the MF-IPS model of the same seed. Here selection depends on the rating value alone, as the
    Naive-Bayes propensities assume, and MF-DR with l2 0.1 improves on it: 0.439 against 0.522 (naive MF
    0.996; Coat's l2 0.3 over-smooths these ratings, 0.642)."""
    u, i, y = mnar_data.all_cells()
    sample = mnar_data.mcar_test(0.02, seed=0)
    model = DoublyRobustMF(mcar_sample=sample, seed=3, l2=0.1).fit(mnar_data.train)
    assert model.name == "mf-dr" and DoublyRobustMF().config.l2 == DR_L2
    ips = IPSMatrixFactorization("naive-bayes", mcar_sample=sample, seed=3).fit(mnar_data.train)
    np.testing.assert_array_equal(model.imputation.predict(u, i), ips.predict(u, i))
    np.testing.assert_array_equal(model.train_propensities, ips.train_propensities)
    assert mse(y, model.predict(u, i)) < mse(y, ips.predict(u, i)) - 0.05
    assert mse(y, model.predict(u, i)) < 0.5 * mse(y, MatrixFactorization(seed=3).fit(mnar_data.train).predict(u, i))
    again = DoublyRobustMF(mcar_sample=sample, seed=3, l2=0.1).fit(mnar_data.train)
    np.testing.assert_array_equal(again.predict(u, i), model.predict(u, i))


def test_the_propensities_scale_does_not_matter(mnar_data):
    """Self-normalised: propensities half as large everywhere fit the same model (raw 1/p would double every
    correction)."""
    u, i, _ = mnar_data.all_cells()
    fits = [DoublyRobustMF("given", propensities=mnar_data.propensity * scale, l2=0.1).fit(mnar_data.train)
            for scale in (1.0, 0.5)]
    np.testing.assert_allclose(fits[0].predict(u, i), fits[1].predict(u, i), atol=1e-9)


def test_the_variants_and_their_refusals(mnar_data):
    assert DoublyRobustMF("mask").name == "mf-dr-mask"
    assert DoublyRobustMF("given", propensities=mnar_data.propensity).name == "mf-dr-given"
    with pytest.raises(ValueError, match="mf-dr needs an MCAR sample"):
        DoublyRobustMF().fit(mnar_data.train)
    with pytest.raises(ValueError, match="uses no MCAR data"):
        DoublyRobustMF("mask", mcar_sample=mnar_data.mcar_test(0.02, seed=0))
    with pytest.raises(ValueError, match="outside rating_scale"):
        DoublyRobustMF("mask", rating_scale=(1.0, 4.0)).fit(mnar_data.train)
    with pytest.raises(ValueError, match="MFConfig.n_iters must be a positive integer, got 0"):
        DoublyRobustMF("mask", n_iters=0).fit(mnar_data.train)
    # both models' settings are checked before the propensities, which here would need an MCAR sample
    with pytest.raises(ValueError, match="MFConfig.l2 must be positive and finite, got inf"):
        DoublyRobustMF(l2=float("inf")).fit(mnar_data.train)
    with pytest.raises(ValueError, match="outside rating_scale"):
        DoublyRobustMF(imputation_config=MFConfig(rating_scale=(1.0, 4.0))).fit(mnar_data.train)
    # r̂'s settings are its own, r̃'s MF-IPS's
    fitted = DoublyRobustMF("given", propensities=mnar_data.propensity, n_factors=2).fit(mnar_data.train)
    assert fitted.user_factors.shape[1] == 2 and fitted.imputation.user_factors.shape[1] == 20
