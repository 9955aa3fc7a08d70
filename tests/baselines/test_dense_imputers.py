"""Dense imputers: accuracy against mean imputation, Pipeline use, sklearn params, input errors, PPCA's solvers."""

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.linear_model import LinearRegression
from sklearn.pipeline import Pipeline

from baselines.dense_imputers import DENSE_IMPUTERS, PPCAImputer, make_dense_imputer
from baselines.lowrank_joint import LowRankJointImputer
from mnar_recsys.checks.dense import pandas_missing_as_nan
from mnar_recsys.data.amputation import apply_mask, mcar, paper_self_masking, standardize
from mnar_recsys.evaluation.metrics import imputation_rmse

FAST = {
    "mean": {},
    "mice": {"random_state": 0},
    "missforest": {"n_estimators": 10, "max_iter": 3, "random_state": 0},
    "ppca": {"n_components": 2},
    "lowrank-joint": {"random_state": 0},
}
# imputation RMSE must be below this fraction of mean imputation's
MAX_RATIO = {"mice": 0.8, "missforest": 0.8, "ppca": 0.5, "lowrank-joint": 0.5}


@pytest.fixture(autouse=True)
def _quiet_iterative_imputer():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # few MICE rounds on purpose, for speed
        yield


@pytest.fixture(scope="module")
def low_rank():
    """Rank-2 data with small noise and 20% of the entries missing completely at random."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 2)) @ rng.standard_normal((2, 6)) + 0.1 * rng.standard_normal((200, 6))
    mask = mcar(X, 0.2, seed=1)
    return X, mask, apply_mask(X, mask)


def _rmse(name, low_rank):
    X, mask, Xm = low_rank
    out = make_dense_imputer(name, **FAST[name]).fit_transform(Xm)
    assert out.shape == X.shape and np.isfinite(out).all()
    np.testing.assert_array_equal(out[mask == 1], X[mask == 1])
    return np.sqrt(np.mean((out - X)[mask == 0] ** 2))


@pytest.mark.parametrize("name", list(MAX_RATIO))
def test_beats_mean_imputation(name, low_rank):
    assert _rmse(name, low_rank) < MAX_RATIO[name] * _rmse("mean", low_rank)


@pytest.mark.parametrize("name", list(DENSE_IMPUTERS))
def test_in_pipeline_and_clone(name, low_rank):
    X, _, Xm = low_rank
    y = X[:, 0] + X[:, 1]
    pipe = Pipeline([("impute", make_dense_imputer(name, **FAST[name])), ("model", LinearRegression())])
    pipe.fit(Xm, y)
    assert pipe.predict(Xm[:10]).shape == (10,)
    imputer = make_dense_imputer(name, **FAST[name])
    assert clone(imputer).get_params() == imputer.get_params()


@pytest.mark.parametrize("name", list(DENSE_IMPUTERS))
def test_all_missing_column_raises(name, low_rank):
    Xm = low_rank[2].copy()
    Xm[:, 3] = np.nan
    with pytest.raises(ValueError, match=r"column\(s\) \[3\] are entirely missing"):
        make_dense_imputer(name, **FAST[name]).fit(Xm)


@pytest.mark.parametrize("name", list(DENSE_IMPUTERS))
def test_transform_checks_width_and_infinities(name, low_rank):
    Xm = low_rank[2]
    with pytest.raises(NotFittedError):  # not an AttributeError on n_features_in_
        make_dense_imputer(name, **FAST[name]).transform(Xm)
    imputer = make_dense_imputer(name, **FAST[name]).fit(Xm)
    with pytest.raises(ValueError, match="X has 5 features, but the imputer was fitted on 6"):
        imputer.transform(Xm[:, :5])
    bad = Xm.copy()
    bad[0, 0] = np.inf
    with pytest.raises(ValueError, match="infinite values"):
        imputer.transform(bad)


@pytest.mark.parametrize("name", list(DENSE_IMPUTERS))
def test_pandas_missing_values_are_nan_and_a_non_numeric_value_is_named(name, low_rank):
    Xm = low_rank[2]
    frame = pd.DataFrame(Xm, columns=list("abcdef")).astype("Float64")  # NaN becomes pandas' NA
    assert frame.isna().to_numpy().sum() == np.isnan(Xm).sum() > 0
    # to rounding: a frame's values arrive column-major, which changes the order of some sums
    np.testing.assert_allclose(make_dense_imputer(name, **FAST[name]).fit(frame).transform(frame),
                               make_dense_imputer(name, **FAST[name]).fit(Xm).transform(Xm), rtol=1e-9, atol=1e-12)
    strings = pd.DataFrame(Xm, columns=list("abcdef")).astype(str).astype("string")
    strings[pd.DataFrame(np.isnan(Xm), columns=list("abcdef"))] = pd.NA  # a string column keeps pd.NA
    np.testing.assert_allclose(make_dense_imputer(name, **FAST[name]).fit(strings).transform(strings),
                               make_dense_imputer(name, **FAST[name]).fit(Xm).transform(Xm), rtol=1e-9, atol=1e-12)
    objects = pd.DataFrame(Xm, columns=list("abcdef")).astype(object)
    objects[objects.isna()] = pd.NA  # object columns hold pandas' own missing marker as it is
    np.testing.assert_allclose(make_dense_imputer(name, **FAST[name]).fit(objects).transform(objects),
                               make_dense_imputer(name, **FAST[name]).fit(Xm).transform(Xm), rtol=1e-9, atol=1e-12)
    words = pd.DataFrame(Xm, columns=list("abcdef")).astype(object)
    words.iloc[3, 2] = "high"
    with pytest.raises(ValueError, match=r"column 2 \('c'\) holds the non-numeric value 'high'"):
        make_dense_imputer(name, **FAST[name]).fit(words)


def test_numeric_frames_are_read_without_a_copy_of_every_value():
    # float and int columns hold no missing marker but NaN: boxing their values as objects only costs time
    frame = pd.DataFrame({"a": [1.0, np.nan], "b": [1, 2]})
    assert pandas_missing_as_nan(frame) is frame
    column = frame["a"]
    assert pandas_missing_as_nan(column) is column
    mixed = frame.assign(c=pd.array([1, None], dtype="Int64"))
    assert np.isnan(pandas_missing_as_nan(mixed).iloc[1, 2])


def test_unknown_name():
    with pytest.raises(ValueError, match="unknown dense imputer 'knn'"):
        make_dense_imputer("knn")


@pytest.mark.parametrize("solver", ["em", "lbfgs"])
def test_ppca_loglik_non_decreasing(low_rank, solver):
    for q in (1, 2, 5):
        ll = PPCAImputer(n_components=q, max_iter=100, tol=0.0, solver=solver).fit(low_rank[2]).loglik_
        assert len(ll) == 100 or solver == "lbfgs" and len(ll) > 5  # L-BFGS may stop at rounding's floor
        assert np.all(np.diff(ll) >= -1e-8 * np.abs(ll[:-1]))


@pytest.mark.parametrize("solver", ["em", "lbfgs"])
def test_ppca_complete_data_matches_closed_form(solver):
    """Without missing values both solvers reach Tipping & Bishop's closed-form maximum-likelihood s2."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((500, 3)) @ rng.standard_normal((3, 5)) + 0.3 * rng.standard_normal((500, 5))
    model = PPCAImputer(n_components=2, max_iter=2000, tol=1e-12, standardize=False, solver=solver).fit(X)
    eigval = np.linalg.eigvalsh(np.cov(X, rowvar=False, bias=True))[::-1]
    assert model.noise_variance_ == pytest.approx(eigval[2:].mean(), rel=1e-4)


@pytest.fixture(scope="module")
def self_masked():
    """Correlated data with the paper's self-masking: values above the mean go missing in half the features."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((300, 4)) @ rng.standard_normal((4, 6)) + 0.2 * rng.standard_normal((300, 6))
    X, _, _ = standardize(X)
    return X, paper_self_masking(X), apply_mask(X, paper_self_masking(X))


def test_ppca_gradient_matches_finite_differences(self_masked):
    """The L-BFGS solver's gradient of the observed-data log-likelihood, against central differences."""
    from baselines import ppca

    imputer = PPCAImputer(standardize=False)
    imputer.center_, imputer.scale_ = np.zeros(6), np.ones(6)
    X0, S = imputer._prepare(self_masked[2])
    patterns = ppca._patterns(S)
    rng = np.random.default_rng(3)
    W, mu, s2 = rng.standard_normal((6, 3)), rng.standard_normal(6) * 0.3, 0.7
    _, grad_W, grad_mu, grad_s2 = ppca._loglik_and_gradient(W, mu, s2, X0, S, patterns)

    def loglik(W, mu, s2):
        return ppca._e_step(X0, S, W, mu, s2, patterns)[2]

    h = 1e-6
    for j, k in ((0, 0), (4, 2), (5, 1)):
        step = np.zeros_like(W)
        step[j, k] = h
        assert grad_W[j, k] == pytest.approx((loglik(W + step, mu, s2) - loglik(W - step, mu, s2)) / (2 * h), rel=1e-5)
    for j in (1, 5):
        step = np.eye(6)[j] * h
        assert grad_mu[j] == pytest.approx((loglik(W, mu + step, s2) - loglik(W, mu - step, s2)) / (2 * h), rel=1e-5)
    assert grad_s2 == pytest.approx((loglik(W, mu, s2 + h) - loglik(W, mu, s2 - h)) / (2 * h), rel=1e-5)


def test_ppca_solvers_reach_the_same_fit_under_self_masking(self_masked):
    """EM run to a tight tolerance and L-BFGS reach one maximum: the same log-likelihood and imputations.
    With q = D - 1, as in the paper, L-BFGS gets there in far fewer iterations (768 for EM, 78 here)."""
    Xm = self_masked[2]
    em = PPCAImputer(standardize=False, solver="em", tol=1e-12).fit(Xm)
    lbfgs = PPCAImputer(standardize=False, tol=1e-12).fit(Xm)
    assert lbfgs.loglik_[-1] == pytest.approx(em.loglik_[-1], abs=1e-4)
    np.testing.assert_allclose(lbfgs.transform(Xm), em.transform(Xm), atol=2e-4)
    assert lbfgs.n_iter_ < em.n_iter_ / 5


@pytest.mark.parametrize("solver", ["em", "lbfgs"])
def test_ppca_warns_when_stopped_before_converging(self_masked, solver):
    with pytest.warns(ConvergenceWarning, match=f"PPCAImputer: the {solver} solver stopped after max_iter=3"):
        model = PPCAImputer(standardize=False, max_iter=3, solver=solver).fit(self_masked[2])
    assert model.n_iter_ <= 3
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        PPCAImputer(standardize=False, solver=solver).fit(self_masked[2])


def test_ppca_bad_components(low_rank):
    with pytest.raises(ValueError, match="n_components must be in 1..5 for 6 features, got 6"):
        PPCAImputer(n_components=6).fit(low_rank[2])
    with pytest.raises(ValueError, match="n_components must be in 1..5 for 6 features, got 2.0"):
        PPCAImputer(n_components=2.0).fit(low_rank[2])
    with pytest.raises(ValueError, match="needs at least 2 features, got 1"):
        PPCAImputer().fit(low_rank[2][:, :1])
    with pytest.raises(ValueError, match="n_lambdas must be a positive integer, got 0"):
        LowRankJointImputer(n_lambdas=0).fit(low_rank[2])
    with pytest.raises(ValueError, match="PPCAImputer: max_iter must be a positive integer, got 2.5"):
        PPCAImputer(max_iter=2.5).fit(low_rank[2])
    with pytest.raises(ValueError, match="PPCAImputer: solver must be one of lbfgs, em, got 'newton'"):
        PPCAImputer(solver="newton").fit(low_rank[2])
    with pytest.raises(ValueError, match="LowRankJointImputer: max_iter must be a positive integer, got True"):
        LowRankJointImputer(max_iter=True).fit(low_rank[2])


@pytest.mark.parametrize("name", ["ppca", "lowrank-joint", "notmiwae"])
def test_values_too_large_to_standardise_are_refused(name):
    """Beyond about 1e154 the sd overflows to inf: every imputation had come back NaN without a word."""
    from mnar_recsys.estimators.imputer import NotMIWAEImputer

    X = np.random.default_rng(0).standard_normal((12, 3))
    X[:, 1] *= 1e200
    X[0, 0] = np.nan
    imputer = NotMIWAEImputer(iterations=1) if name == "notmiwae" else make_dense_imputer(name)
    with pytest.raises(ValueError, match=r"column\(s\) \[1\] hold values too large to standardise"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's own overflow warning
            imputer.fit(X)
    with pytest.raises(ValueError, match=r"features \[1\] are too large to standardise"):  # the UCI protocol's scaling
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            standardize(np.nan_to_num(X))


def test_lowrank_holdout_selection(low_rank):
    model = make_dense_imputer("lowrank-joint", random_state=0).fit(low_rank[2])
    assert model.cv_rmse_.shape == (20,)
    assert model.cv_rmse_[model.best_index_] == model.cv_rmse_.min()
    assert model.best_index_ > 0  # lambda = sigma_max shrinks everything to zero, which cannot be best
    with pytest.raises(ValueError, match="holdout must lie in"):
        make_dense_imputer("lowrank-joint", holdout=0.0).fit(low_rank[2])


def test_lowrank_imputations_are_converged_soft_impute_solutions():
    """The default tolerance gives the soft-impute path's solutions: within 0.01 of a path run to 1e-14
    (measured 0.0015). At R's softImpute tolerance of 1e-5 the warm-started path took one or two steps a
    lambda and its imputations differed from those by up to 0.069 here."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((150, 3)) @ rng.standard_normal((3, 8)) + 0.3 * rng.standard_normal((150, 8))
    X[:, :4][X[:, :4] > 0.5] = np.nan  # self-masking, as the paper's protocol
    missing = np.isnan(X)

    def imputed(**options) -> np.ndarray:
        model = make_dense_imputer("lowrank-joint", standardize=False, random_state=0, **options)
        return model.fit_transform(X)[missing]

    converged = imputed(tol=1e-14, max_iter=50_000)
    assert np.abs(imputed() - converged).max() < 0.01
    assert np.abs(imputed(tol=1e-5, max_iter=200) - converged).max() > 0.05  # the test can tell


def test_lowrank_without_standardizing_uses_data_as_given(low_rank):
    model = make_dense_imputer("lowrank-joint", standardize=False, random_state=0).fit(low_rank[2])
    np.testing.assert_array_equal(model.center_, 0.0)
    np.testing.assert_array_equal(model.scale_, 1.0)
    assert np.isfinite(model.transform(low_rank[2])).all()


class _DataAlone(LowRankJointImputer):
    """The same soft-impute without the mask columns."""

    def _joint(self, X):
        joint, observed = super()._joint(X)
        return joint[:, :X.shape[1]], observed[:, :X.shape[1]]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_mask_columns_carry_what_self_masking_hides(seed):
    """Completing [data, mask] jointly is what makes the model an MNAR method: under the paper's self-masking it
    imputes better than soft-impute of the data alone (measured RMSE 0.524 / 0.437 / 0.515 against 0.631 / 0.487
    / 0.637)."""
    rng = np.random.default_rng(seed)
    complete, _, _ = standardize(rng.standard_normal((500, 3)) @ rng.standard_normal((3, 8))
                                 + 0.3 * rng.standard_normal((500, 8)))
    mask = paper_self_masking(complete)
    masked = apply_mask(complete, mask)
    joint, alone = (imputation_rmse(complete, model(standardize=False, random_state=0).fit_transform(masked), mask)
                    for model in (LowRankJointImputer, _DataAlone))
    assert joint < alone - 0.04
