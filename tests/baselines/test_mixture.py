"""The multinomial mixture with CPT-v and Logit-vd missing models: recovery on its own generative process,
EM's monotone objective, the vectorised E/M-step against dense brute force, the M-step gradient, bad input."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import expit, logsumexp
from sklearn.exceptions import ConvergenceWarning

from baselines.mixture import MultinomialMixture, _onehot
from baselines.mixture_missing import logit_vd_objective
from baselines.propensities import naive_bayes_propensities

TRUE_MU = np.array([0.02, 0.04, 0.08, 0.16, 0.32])
TRUE_OMEGA = np.array([-4.0, -3.3, -2.6, -1.9, -1.2])


def draw(n_users: int, n_items: int, n_components: int, seed: int, selection: str) -> tuple[np.ndarray, np.ndarray]:
    """Ratings of every cell from a multinomial mixture and the train mask from CPT-v or Logit-vd selection."""
    rng = np.random.default_rng(seed)
    theta = rng.dirichlet(np.full(n_components, 5.0))
    beta = rng.dirichlet(np.full(5, 0.5), size=(n_items, n_components))  # items x components x levels
    z = rng.choice(n_components, size=n_users, p=theta)
    cdf = np.cumsum(beta[:, z].transpose(1, 0, 2), axis=2)
    truth = 1 + np.minimum((rng.random((n_users, n_items, 1)) > cdf).sum(axis=2), 4)
    if selection == "cpt-v":
        p = TRUE_MU[truth - 1]
    else:
        p = expit(TRUE_OMEGA[truth - 1] + rng.normal(0.0, 0.5, n_items)[None, :])
    return truth, rng.random(truth.shape) < p


def fit_both(truth: np.ndarray, mask: np.ndarray, missing: str, seed: int) -> tuple[MultinomialMixture, float, float]:
    """The MNAR fit and the MCAR MSE of it and of the MAR mixture on a uniformly random 5% of the cells,
    which are held out of train as the MCAR test cells of Yahoo! R3 are (so train keeps 0.95 mu of each level)."""
    test = np.random.default_rng(seed + 100).random(truth.shape) < 0.05
    train = sp.csr_matrix(np.where(mask & ~test, truth, 0).astype(float))
    users, items = np.nonzero(test)
    model = MultinomialMixture(missing, n_components=3, seed=seed).fit(train)
    mar = MultinomialMixture("none", n_components=3, seed=seed).fit(train)
    mse = lambda m: float(np.mean((m.predict(users, items) - truth[users, items]) ** 2))  # noqa: E731
    return model, mse(model), mse(mar)


def test_cpt_v_recovers_mu_and_beats_the_mar_mixture():
    # seeds 0-3 measured: largest relative error of mu 0.14; MCAR MSE 1.42-1.54, 0.75-0.94 below the MAR fit's
    truth, mask = draw(3000, 100, 3, seed=1, selection="cpt-v")
    model, mnar, mar = fit_both(truth, mask, "cpt-v", seed=1)
    np.testing.assert_allclose(model.missing_model.mu, 0.95 * TRUE_MU, rtol=0.25)
    assert mnar < mar - 0.4


def test_logit_vd_recovers_omega_and_beats_the_mar_mixture():
    # seeds 0-3 measured: largest error of the centred omega 0.14; MCAR MSE 1.44-1.55, 0.64-0.97 below the MAR
    # fit's. Holding out 5% shifts the centred logits of the train selection by at most 0.02
    truth, mask = draw(3000, 100, 3, seed=1, selection="logit-vd")
    model, mnar, mar = fit_both(truth, mask, "logit-vd", seed=1)
    omega = model.missing_model.omega
    np.testing.assert_allclose(omega - omega.mean(), TRUE_OMEGA - TRUE_OMEGA.mean(), atol=0.25)
    assert mnar < mar - 0.4


@pytest.fixture(scope="module")
def small() -> tuple[sp.csr_matrix, sp.csr_matrix]:
    truth, mask = draw(300, 30, 3, seed=5, selection="cpt-v")
    sample = np.random.default_rng(6).random(truth.shape) < 0.05
    return (sp.csr_matrix(np.where(mask, truth, 0).astype(float)),
            sp.csr_matrix(np.where(sample & ~mask, truth, 0).astype(float)))


@pytest.mark.parametrize("accelerate", [True, False])
@pytest.mark.parametrize("missing, prior", [("none", "train"), ("cpt-v", "train"), ("logit-vd", "train"),
                                            ("cpt-v", "mcar"), ("logit-vd", "mcar")])
def test_log_posterior_never_falls(small, missing, prior, accelerate):
    train, sample = small
    model = MultinomialMixture(missing, prior, n_components=4, tol=1e-10, max_iter=150, accelerate=accelerate)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(train, **({"mcar_sample": sample} if prior == "mcar" else {}))
    history = np.array(model.history)
    assert len(history) > 5 and np.isfinite(history).all()
    assert (np.diff(history) >= -1e-9 * np.abs(history[1:])).all()
    assert history[-1] > history[0] + 1.0


def dense_e_step(model: MultinomialMixture, train: np.ndarray) -> tuple[np.ndarray, float]:
    """Responsibilities and log posterior by a loop over every cell."""
    theta, beta = np.exp(model.log_theta), np.exp(model.log_beta)
    n_levels, n_items, k = beta.shape
    mu = np.ones((n_levels, n_items)) if model.missing_model is None else np.exp(model.missing_model.log_mu()[0])
    joint = np.zeros((train.shape[0], k))
    for n in range(train.shape[0]):
        for c in range(k):
            joint[n, c] = np.log(theta[c])
            for d in range(n_items):
                if train[n, d]:
                    v = int(train[n, d]) - 1
                    joint[n, c] += np.log(mu[v, d] * beta[v, d, c])
                elif model.missing_model is not None:
                    joint[n, c] += np.log(np.sum((1 - mu[:, d]) * beta[:, d, c]))
    log_prior = (model.config.alpha - 1) * (model.log_theta.sum() + model.log_beta.sum())
    if model.missing_model is not None:
        log_prior += model.missing_model.log_prior()
    norm = logsumexp(joint, axis=1, keepdims=True)
    return np.exp(joint - norm), float(norm.sum() + log_prior)


@pytest.mark.parametrize("missing", ["none", "cpt-v", "logit-vd"])
def test_vectorised_e_step_equals_dense_computation(missing):
    rng = np.random.default_rng(0)
    dense = np.where(rng.random((7, 5)) < 0.4, rng.integers(1, 4, (7, 5)), 0).astype(float)
    dense[:, 0] = 1 + np.arange(7) % 3  # every level present
    dense[3] = 0  # a user with no ratings
    train = sp.csr_matrix(dense)
    model = MultinomialMixture(missing, n_components=2, rating_scale=(1, 3), max_iter=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(train)
    q, log_post, _ = model._e_step(_onehot(train, np.arange(1.0, 4.0)))
    q_dense, log_post_dense = dense_e_step(model, dense)
    np.testing.assert_allclose(q, q_dense, rtol=1e-10, atol=1e-12)
    assert log_post == pytest.approx(log_post_dense, rel=1e-12)
    np.testing.assert_allclose(model.responsibilities, q_dense, rtol=1e-10, atol=1e-12)


def test_cpt_v_m_step_equals_dense_expected_counts():
    """mu_v's update counts the expected unobserved v's cell by cell (not by the Q_k - S_dk shortcut)."""
    rng = np.random.default_rng(1)
    dense = np.where(rng.random((8, 6)) < 0.4, rng.integers(1, 4, (8, 6)), 0).astype(float)
    dense[:, 0] = 1 + np.arange(8) % 3
    train = sp.csr_matrix(dense)
    levels = np.arange(1.0, 4.0)
    model = MultinomialMixture("cpt-v", n_components=2, rating_scale=(1, 3), max_iter=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(train)
    onehot = _onehot(train, levels)
    q, _, log_g = model._e_step(onehot)
    beta, mu = np.exp(model.log_beta), model.missing_model.mu.copy()
    expected = np.zeros(3)
    for n, d in zip(*np.nonzero(dense == 0)):
        post = (1 - mu)[:, None] * beta[:, d, :] / np.sum((1 - mu)[:, None] * beta[:, d, :], axis=0)
        expected += post @ q[n]
    observed = np.array([(dense == v).sum() for v in levels])
    s, c = model.missing_model.strength, model.missing_model.centre
    model._m_step(q, onehot.T.tocsr(), np.asarray(onehot.sum(axis=0)).reshape(3, 6), log_g)
    np.testing.assert_allclose(model.missing_model.mu, (observed + s * c) / (observed + expected + s), rtol=1e-10)


def test_logit_vd_gradient_matches_finite_differences():
    rng = np.random.default_rng(2)
    omega, psi = rng.normal(-2, 1, 5), rng.normal(0, 1, 7)
    observed, unobserved = rng.poisson(3.0, (5, 7)).astype(float), rng.uniform(10, 100, (5, 7))
    args = (observed, unobserved, rng.normal(-2, 1, 5), 0.7, 1.3)
    _, d_omega, d_psi = logit_vd_objective(omega, psi, *args)
    x, h = np.concatenate([omega, psi]), 1e-6
    numeric = np.array([(logit_vd_objective(*np.split(x + h * e, [5]), *args)[0]
                         - logit_vd_objective(*np.split(x - h * e, [5]), *args)[0]) / (2 * h) for e in np.eye(12)])
    np.testing.assert_allclose(np.concatenate([d_omega, d_psi]), numeric, rtol=1e-6, atol=1e-6)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # a few iterations suffice here
def test_mcar_prior_is_centred_on_naive_bayes_propensities(small):
    train, sample = small
    by_fit = MultinomialMixture("cpt-v", "mcar", n_components=3, max_iter=30, tol=1e-4).fit(train, mcar_sample=sample)
    by_ctor = MultinomialMixture("cpt-v", "mcar", n_components=3, max_iter=30, tol=1e-4, mcar_sample=sample).fit(train)
    assert by_fit.name == "cpt-v-mcar"
    centre = naive_bayes_propensities(train, sample)(np.arange(1.0, 6.0))
    np.testing.assert_allclose(by_fit.missing_model.centre, centre)
    np.testing.assert_array_equal(by_fit.predict([0, 1], [2, 3]), by_ctor.predict([0, 1], [2, 3]))
    free = MultinomialMixture("cpt-v", n_components=3, max_iter=30, tol=1e-4).fit(train)
    np.testing.assert_allclose(free.missing_model.centre, train.nnz / np.prod(train.shape))


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_names_predictions_on_scale_seeding_and_convergence_warning(small):
    train, sample = small
    names = {(m, p): MultinomialMixture(m, p).name for m, p in MultinomialMixture.NAMES}
    assert sorted(names.values()) == ["cpt-v", "cpt-v-mcar", "logit-vd", "logit-vd-mcar", "mixture"]
    with pytest.warns(ConvergenceWarning, match="max_iter=2"):
        model = MultinomialMixture("logit-vd", max_iter=2).fit(train)
    pred = model.predict(np.arange(300), np.arange(300) % 30)
    assert pred.shape == (300,) and (pred >= 1).all() and (pred <= 5).all()
    first, second = (MultinomialMixture("logit-vd", max_iter=40, tol=1e-4, seed=3).fit(train) for _ in range(2))
    np.testing.assert_array_equal(first.predict([0, 1], [2, 3]), second.predict([0, 1], [2, 3]))


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_bad_input_is_refused_clearly(small):
    train, sample = small
    with pytest.raises(ValueError, match="must be a scipy sparse matrix"):
        MultinomialMixture().fit(train.toarray())
    off = train.copy()
    off.data[0] = 6.0
    with pytest.raises(ValueError, match=r"outside rating_scale \(1\.0, 5\.0\)"):
        MultinomialMixture().fit(off)
    half = train.copy()
    half.data[0] = 2.5
    with pytest.raises(ValueError, match="non-integer ratings"):
        MultinomialMixture().fit(half)
    for field, value, message in [("n_components", 0, "n_components must be a positive integer"),
                                  ("n_components", 3.0, "n_components must be a positive integer"),
                                  ("alpha", 1.0, "alpha must exceed 1"),
                                  ("alpha", float("nan"), "alpha must be positive and finite"),
                                  ("tol", 0.0, "tol must be positive and finite"),
                                  ("prior_strength", -1.0, "prior_strength must be positive"),
                                  ("omega_sd", float("inf"), "omega_sd must be positive"),
                                  ("max_iter", 0, "max_iter must be a positive integer"),
                                  ("accelerate", "yes", "accelerate must be True or False"),
                                  ("rating_scale", (1.5, 5), "rating_scale must be integer"),
                                  ("rating_scale", (5, 1), "rating_scale must be integer"),
                                  ("rating_scale", None, "rating_scale must be integer")]:
        with pytest.raises(ValueError, match=f"MixtureConfig.{message}"):
            MultinomialMixture("logit-vd", **{field: value}).fit(train)
    with pytest.raises(ValueError, match="missing must be"):
        MultinomialMixture("cpt")
    with pytest.raises(ValueError, match="prior must be"):
        MultinomialMixture("cpt-v", "informative")
    with pytest.raises(ValueError, match="no missing model to put an MCAR prior on"):
        MultinomialMixture("none", "mcar")
    with pytest.raises(ValueError, match="cpt-v-mcar needs an MCAR sample"):
        MultinomialMixture("cpt-v", "mcar").fit(train)
    with pytest.raises(ValueError, match="logit-vd uses no MCAR data"):
        MultinomialMixture("logit-vd").fit(train, mcar_sample=sample)
    with pytest.raises(ValueError, match="mixture uses no MCAR data"):
        MultinomialMixture("none", mcar_sample=sample)
    with pytest.raises(ValueError, match=r"mcar_sample shape \(2, 2\) != train shape"):
        MultinomialMixture("logit-vd", "mcar").fit(train, mcar_sample=sp.csr_matrix(np.ones((2, 2))))
    with pytest.raises(ValueError, match="MultinomialMixture is not fitted"):
        MultinomialMixture().predict([0], [0])
    fitted = MultinomialMixture("none", max_iter=5, tol=1e-3).fit(train)
    with pytest.raises(ValueError, match="item index out of range"):
        fitted.predict([0], [30])
