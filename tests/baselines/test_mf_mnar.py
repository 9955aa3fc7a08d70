"""MF-MNAR: it recovers its own missingness mechanism, its loss and posterior match dense hand computations, and it
refuses bad input."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from scipy.special import expit, log_expit, logsumexp
from scipy.stats import norm

from baselines.mf_mnar import (
    MF_MNAR_GRID,
    MFMNAR,
    MFMNARConfig,
    _CellSet,
    log_level_probs,
    log_ndtr,
)
from baselines.pmf import ProbabilisticMF
from mnar_recsys.evaluation.metrics import mse

TRUE_OMEGA = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
TRUE_THRESHOLDS = np.array([-1.0, 0.0, 1.0, 2.0])


def draw_from_the_model(n_users: int, n_items: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Full ratings and mask from MF-MNAR's generative process: rank-2 probit ratings, rank-1 logistic mask
    with omega strongly increasing in the rating."""
    rng = np.random.default_rng(seed)
    a = (rng.normal(0, 1, (n_users, 2)) @ rng.normal(0, 1, (n_items, 2)).T
         + rng.normal(0, 0.5, n_users)[:, None] + rng.normal(0, 0.5, n_items))
    ratings = 1.0 + np.searchsorted(TRUE_THRESHOLDS, a + rng.normal(0, 1, a.shape))
    eta = (-2.5 + rng.normal(0, 0.5, (n_users, 1)) @ rng.normal(0, 0.5, (1, n_items))
           + rng.normal(0, 0.5, n_users)[:, None] + rng.normal(0, 0.5, n_items))
    observed = rng.random(a.shape) < expit(eta + TRUE_OMEGA[ratings.astype(int) - 1])
    return ratings, observed


@pytest.fixture(scope="module")
def own_process():
    ratings, observed = draw_from_the_model(300, 100, seed=0)
    train = sp.csr_matrix(np.where(observed, ratings, 0.0))
    users, items = np.nonzero(~observed)
    # priors matching the generating scales: u, v ~ N(0, 1) is precision 1 = 2 * l2

    def fit(**kw) -> MFMNAR:
        return MFMNAR(rank=2, mask_rank=1, l2=0.5, l2_mask=2.0, n_iters=300, **kw).fit(train)

    return train, users, items, ratings[~observed], fit(), fit(mnar=False)


def test_recovers_omega_differences_on_its_own_process(own_process):
    """omega is identified up to an offset. Measured errors of omega - omega_1 against the true (0, 1, 2, 3, 4):
    (0, 0.15, -0.07, 0.10, 0.54) here; at most 0.54 on data seeds 0, 1, 2."""
    omega = own_process[4].params.omega
    np.testing.assert_allclose(omega - omega[0], TRUE_OMEGA - TRUE_OMEGA[0], atol=0.75)


def test_beats_pmf_and_its_own_mar_model_on_the_unobserved_cells(own_process):
    """Measured MSE on every unobserved cell: 0.95 for MF-MNAR, 2.45 for its MAR model, 3.83 for PMF (data seeds
    1, 2: 0.95 / 2.32 / 3.75 and 0.98 / 2.33 / 3.83)."""
    train, users, items, truth, mnar, mar = own_process
    errors = {name: mse(truth, model.predict(users, items))
              for name, model in (("mnar", mnar), ("mar", mar), ("pmf", ProbabilisticMF().fit(train)))}
    assert errors["mnar"] < 0.5 * errors["mar"] and errors["mnar"] < 0.5 * errors["pmf"]
    np.testing.assert_array_equal(np.diff(mar.params.omega), 0.0)


def tiny() -> sp.csr_matrix:
    rng = np.random.default_rng(4)
    dense = np.where(rng.random((7, 5)) < 0.4, rng.integers(1, 6, (7, 5)), 0).astype(float)
    return sp.csr_matrix(dense)


def dense_terms(model: MFMNAR) -> tuple[np.ndarray, np.ndarray]:
    """log P(l|a) and log P(o=1|l) for every cell and level, from the fitted parameters in float64 SciPy."""
    p = model.params
    a = p.user_factors @ p.item_factors.T + p.user_bias[:, None] + p.item_bias
    eta = p.mask_user_factors @ p.mask_item_factors.T + p.mask_user_bias[:, None] + p.mask_item_bias
    cuts = np.concatenate([[-np.inf], p.thresholds, [np.inf]])
    log_rating = np.log(norm.cdf(cuts[None, None, 1:] - a[..., None]) - norm.cdf(cuts[None, None, :-1] - a[..., None]))
    return log_rating, eta[..., None] + p.omega


def test_loss_equals_a_dense_computation():
    train = tiny()
    model = MFMNAR(rank=2, mask_rank=2, n_iters=20, lr=0.1).fit(train)
    log_rating, logit = dense_terms(model)
    dense = train.toarray()
    seen = dense > 0
    level = dense.astype(int) - 1
    rows, cols = np.nonzero(seen)
    observed = (log_rating[rows, cols, level[seen]] + log_expit(logit[rows, cols, level[seen]])).sum()
    unobserved = logsumexp(log_rating + log_expit(-logit), axis=-1)[~seen].sum()
    p, cfg = model.params, model.config
    penalty = (cfg.l2 * sum(np.sum(x ** 2) for x in (p.user_factors, p.item_factors, p.user_bias, p.item_bias,
                                                         p.mask_user_bias, p.mask_item_bias))
               + cfg.l2_mask * (np.sum(p.mask_user_factors ** 2) + np.sum(p.mask_item_factors ** 2)))
    assert model.objective(train) == pytest.approx(penalty - observed - unobserved, rel=1e-5)


def test_sampled_unobserved_term_is_unbiased():
    """The mean of many sampled o=0 terms lies within 4 standard errors of the exact sum."""
    train = tiny()
    model = MFMNAR(rank=2, n_iters=10, unobserved_sample=20, seed=1).fit(train)
    tensors, obs = model._tensors(), model._observed(train)
    cells = _CellSet(obs[0] * train.shape[1] + obs[1], train.shape[0] * train.shape[1])
    exact = sum(float(model._chunk_unobserved(tensors, rows, mask)) for rows, mask in model._row_chunks(train))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        draws = np.array([float(model._sampled_unobserved(tensors, cells, train.shape, generator)) for _ in range(500)])
    assert abs(draws.mean() - exact) < 4 * draws.std() / np.sqrt(len(draws))
    assert draws.std() > 0


def test_posterior_and_prediction_match_a_hand_computation():
    train = tiny()
    model = MFMNAR(rank=2, mask_rank=2, n_iters=20, lr=0.1).fit(train)
    log_rating, logit = dense_terms(model)
    users, items = np.nonzero(train.toarray() == 0)
    q = np.exp(log_rating) * (1 - expit(logit))
    q = (q / q.sum(-1, keepdims=True))[users, items]
    np.testing.assert_allclose(model.posterior(users, items), q, atol=1e-5)
    np.testing.assert_allclose(model.predict(users, items), np.clip(q @ np.arange(1, 6), 1, 5), atol=1e-4)
    prior = np.exp(log_rating[users, items]) @ np.arange(1, 6)
    np.testing.assert_allclose(model.expected_rating(users, items), prior, atol=1e-4)


def test_log_ndtr_and_level_probabilities_match_float64_references():
    x = torch.linspace(-40, 12, 5001)
    reference = torch.special.log_ndtr(x.double())
    got = log_ndtr(x.requires_grad_())
    got.sum().backward()
    np.testing.assert_allclose(got.detach().double(), reference, rtol=2e-5, atol=1e-30)
    slope = torch.exp(-0.5 * x.detach().double() ** 2 - 0.5 * np.log(2 * np.pi) - reference)
    np.testing.assert_allclose(x.grad.double(), slope, rtol=1e-4, atol=1e-30)
    a = np.array([-9.0, -3.0, 0.0, 0.4, 3.0, 9.0])
    cuts = np.array([-1.0, 0.0, 0.7, 2.0])
    got = log_level_probs(torch.tensor(a, dtype=torch.float32), torch.tensor(cuts, dtype=torch.float32)).double()
    edges = np.concatenate([[-np.inf], cuts, [np.inf]])
    lo, hi = edges[None, :-1] - a[:, None], edges[None, 1:] - a[:, None]
    # the tail that keeps both cdfs away from 1, in float64
    with np.errstate(divide="ignore"):  # the branch not taken underflows
        exact = np.where(lo + hi > 0, np.log(norm.sf(lo) - norm.sf(hi)), np.log(norm.cdf(hi) - norm.cdf(lo)))
    np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-6)


def test_same_seed_same_fit():
    train = tiny()
    users, items = np.nonzero(train.toarray() == 0)
    a = MFMNAR(n_iters=5, seed=3, unobserved_sample=10).fit(train).predict(users, items)
    b = MFMNAR(n_iters=5, seed=3, unobserved_sample=10).fit(train).predict(users, items)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, MFMNAR(n_iters=5, seed=4, unobserved_sample=10).fit(train).predict(users, items))


def test_grid_points_are_config_fields():
    fields = MFMNARConfig.__dataclass_fields__
    assert MF_MNAR_GRID and all(set(point) <= set(fields) for point in MF_MNAR_GRID)


@pytest.mark.parametrize("bad, message", [
    (np.ones((3, 3)), "scipy sparse"),
    (sp.csr_matrix(np.array([[1.0, 6.0], [2.0, 0.0]])), "outside rating_scale"),
    (sp.csr_matrix(np.array([[1.0, 2.5], [2.0, 0.0]])), "non-integer"),
])
def test_refuses_bad_ratings(bad, message):
    with pytest.raises(ValueError, match=message):
        MFMNAR(n_iters=1).fit(bad)


@pytest.mark.parametrize("override, message", [
    ({"rank": 0}, "rank"), ({"mask_rank": 2.0}, "mask_rank"), ({"lr": -1.0}, "lr"), ({"l2_mask": 0.0}, "l2_mask"),
    ({"unobserved_sample": 0}, "unobserved_sample"), ({"observed_batch": 1.5}, "observed_batch"),
    ({"omega_init_slope": float("nan")}, "omega_init_slope"), ({"mnar": "yes"}, "mnar"),
    ({"rating_scale": (1.0, 4.5)}, "rating_scale"), ({"rating_scale": None}, "rating_scale"),
])
def test_refuses_bad_config(override, message):
    with pytest.raises(ValueError, match=message):
        MFMNAR(n_iters=1, **override).fit(tiny())


def test_predict_before_fit_and_out_of_range_pairs():
    with pytest.raises(ValueError, match="not fitted"):
        MFMNAR().predict(np.array([0]), np.array([0]))
    model = MFMNAR(n_iters=1).fit(tiny())
    with pytest.raises(ValueError, match="item index out of range"):
        model.predict(np.array([0]), np.array([5]))
    with pytest.raises(ValueError, match="differs from the fitted"):
        model.objective(sp.csr_matrix(np.ones((2, 2))))
