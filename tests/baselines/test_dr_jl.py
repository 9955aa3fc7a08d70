import numpy as np
import pytest
import scipy.sparse as sp
import torch

from baselines.dr_jl import (
    DRJL_GRID,
    DoublyRobustJointMF,
    DoublyRobustJointNFM,
    DRJLConfig,
    NFMDRJLConfig,
)
from baselines.ips import IPSMatrixFactorization
from mnar_recsys.evaluation.metrics import mse

FAST = {"n_steps": 30, "init_iters": 3}


@pytest.fixture(scope="module")
def sample(mnar_data):
    return mnar_data.mcar_test(0.02, seed=0)


@pytest.fixture(scope="module")
def fitted(mnar_data, sample):
    # nu 0.03: what tuning on IPS-weighted held-out train ratings picks here from DRJL_GRID
    return DoublyRobustJointMF(mcar_sample=sample, seed=3, nu=0.03).fit(mnar_data.train)


def _error_correlations(model: DoublyRobustJointMF, data) -> tuple[float, float]:
    """Pearson r of ê and r̂'s true squared error e over the rated cells and over the others."""
    u, i, y = data.all_cells()
    rated = data.mask.ravel() == 1
    imputed, error = model.imputed_errors(u, i), (model._scores(model.prediction, u, i) - y) ** 2
    return tuple(float(np.corrcoef(imputed[part], error[part])[0, 1]) for part in (rated, ~rated))


def test_it_beats_mf_ips_though_imputed_errors_track_the_true_ones_only_where_it_was_fitted(mnar_data, sample, fitted):
    """At the tuned nu r̂ scores 0.392 over all cells against MF-IPS's 0.522 (same seed), while ê follows e on
    the ratings the imputation model fits (r 0.255) but not on the other cells (r -0.053). A strong penalty,
    nu 0.3, trades one for the other: ê follows e off the ratings too (r 0.235), and r̂ scores 0.599."""
    u, i, y = mnar_data.all_cells()
    ips = IPSMatrixFactorization("naive-bayes", mcar_sample=sample, seed=3).fit(mnar_data.train)
    assert mse(y, fitted.predict(u, i)) < mse(y, ips.predict(u, i)) - 0.08
    on_ratings, elsewhere = _error_correlations(fitted, mnar_data)
    assert on_ratings > 0.15 and abs(elsewhere) < 0.12
    strong = DoublyRobustJointMF(mcar_sample=sample, seed=3, nu=0.3).fit(mnar_data.train)
    assert _error_correlations(strong, mnar_data)[1] > 0.15
    assert mse(y, strong.predict(u, i)) > mse(y, ips.predict(u, i))


def test_the_dr_loss_is_the_batch_estimate_with_the_batch_shares(mnar_data, fitted):
    """E_DR on a batch is (1/|D|)[(|D|/|B_D|) sum_{B_D} ê + (|O|/|B_O|) sum_{B_O} w (e - ê)], w = 1/p scaled to
    add up to |D| over the ratings; the imputation loss is the mean over B_O of (w |O|/|D|) (ê - e)^2."""
    train = mnar_data.train
    n_cells, n_observed = train.shape[0] * train.shape[1], train.nnz
    weights = fitted.cell_weights.numpy()
    assert weights.sum() == pytest.approx(n_cells)
    np.testing.assert_allclose(weights * fitted.train_propensities, weights[0] * fitted.train_propensities[0])

    rng = np.random.default_rng(0)
    du, di = rng.integers(0, train.shape[0], 50), rng.integers(0, train.shape[1], 50)
    pick = rng.integers(0, n_observed, 20)
    rows = np.repeat(np.arange(train.shape[0]), np.diff(train.indptr))
    ou, oi, r, w = rows[pick], train.indices[pick], train.data[pick], weights[pick]

    def by_hand(module: torch.nn.Module, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        p = {name: value.detach().numpy() for name, value in module.named_parameters()}
        return p["mu"] + p["user_bias"][users] + p["item_bias"][items] + np.einsum(
            "kf,kf->k", p["user_factors"][users], p["item_factors"][items])

    rhat_d, rtilde_d = by_hand(fitted.prediction, du, di), by_hand(fitted.imputation, du, di)
    rhat_o, rtilde_o = by_hand(fitted.prediction, ou, oi), by_hand(fitted.imputation, ou, oi)
    expected = ((n_cells / 50) * ((rhat_d - rtilde_d) ** 2).sum()
                + (n_observed / 20) * (w * ((rhat_o - r) ** 2 - (rhat_o - rtilde_o) ** 2)).sum()) / n_cells
    tensors = [torch.from_numpy(np.asarray(a)) for a in (du, di, ou, oi, r, w)]
    assert fitted.dr_loss(*tensors).item() == pytest.approx(expected, rel=1e-5)
    expected_imputation = np.mean(w * n_observed / n_cells * ((rhat_o - rtilde_o) ** 2 - (rhat_o - r) ** 2) ** 2)
    assert fitted.imputation_loss(*tensors[2:]).item() == pytest.approx(expected_imputation, rel=1e-5)


def test_it_needs_the_mcar_sample_and_repeats_under_a_seed(mnar_data, sample):
    with pytest.raises(ValueError, match="mf-dr-jl needs an MCAR sample"):
        DoublyRobustJointMF(**FAST).fit(mnar_data.train)
    u, i, _ = mnar_data.all_cells()
    by_ctor = DoublyRobustJointMF(mcar_sample=sample, seed=1, **FAST).fit(mnar_data.train).predict(u, i)
    by_fit = DoublyRobustJointMF(seed=1, **FAST).fit(mnar_data.train, mcar_sample=sample).predict(u, i)
    np.testing.assert_array_equal(by_ctor, by_fit)
    other = DoublyRobustJointMF(seed=2, **FAST).fit(mnar_data.train, mcar_sample=sample).predict(u, i)
    assert np.abs(other - by_ctor).max() > 1e-3


def test_nfm_runs_batch_norm_in_eval_mode_at_test(mnar_data, sample):
    """A pair predicted alone gets what it gets among all pairs (batch statistics would make them differ);
    predictions stay on the scale and repeat under the seed."""
    u, i, _ = mnar_data.all_cells()
    model = DoublyRobustJointNFM(mcar_sample=sample, seed=0, n_factors=8, layers=(8,), **FAST).fit(mnar_data.train)
    assert model.name == "nfm-dr-jl"
    every = model.predict(u, i)
    assert every.min() >= 1.0 and every.max() <= 5.0 and every.std() > 0.05
    np.testing.assert_allclose(model.predict(u[7:8], i[7:8]), every[7:8], rtol=1e-6)
    again = DoublyRobustJointNFM(mcar_sample=sample, seed=0, n_factors=8, layers=(8,), **FAST).fit(mnar_data.train)
    np.testing.assert_array_equal(again.predict(u, i), every)


def test_the_mask_variant_uses_no_mcar_data(mnar_data, sample):
    model = DoublyRobustJointMF("mask", **FAST).fit(mnar_data.train)
    assert model.name == "mf-dr-jl-mask" and model.train_propensities.shape == (mnar_data.train.nnz,)
    with pytest.raises(ValueError, match="uses no MCAR data"):
        DoublyRobustJointMF("mask", mcar_sample=sample)
    with pytest.raises(ValueError, match="uses no MCAR data"):
        DoublyRobustJointMF("mask", **FAST).fit(mnar_data.train, mcar_sample=sample)


def test_the_tuning_attributes_and_grid():
    """``baselines.registry.tune_baseline`` weighs held-out ratings by these attributes; the grid sets nu only."""
    model = DoublyRobustJointNFM(min_relative=0.2)
    assert model.propensity == "naive-bayes" and model.min_relative == 0.2
    assert model.mask_config.min_relative == 0.2
    assert isinstance(model.config, NFMDRJLConfig) and isinstance(DoublyRobustJointMF().config, DRJLConfig)
    assert all(set(point) == {"nu"} for point in DRJL_GRID) and len(DRJL_GRID) >= 3
    assert DoublyRobustJointMF(**DRJL_GRID[0], seed=4).config.nu == DRJL_GRID[0]["nu"]


def test_bad_input(mnar_data, sample):
    with pytest.raises(ValueError, match="propensity must be one of"):
        DoublyRobustJointMF("oracle")
    with pytest.raises(ValueError, match="unknown DRJLConfig fields: layers"):
        DoublyRobustJointMF(layers=(4,))
    for field, value in (("batch_size", 0), ("k1", 1.5), ("n_steps", -1)):
        with pytest.raises(ValueError, match=f"DRJLConfig.{field} must be a positive integer"):
            DoublyRobustJointMF(mcar_sample=sample, **{field: value}).fit(mnar_data.train)
    for field in ("nu", "imputation_nu", "lr"):
        with pytest.raises(ValueError, match=f"DRJLConfig.{field} must be positive and finite"):
            DoublyRobustJointMF(mcar_sample=sample, **{field: float("nan")}).fit(mnar_data.train)
    with pytest.raises(ValueError, match=r"NFMDRJLConfig.keep_bi must be in \(0, 1\]"):
        DoublyRobustJointNFM(mcar_sample=sample, keep_bi=0.0).fit(mnar_data.train)
    with pytest.raises(ValueError, match="NFMDRJLConfig.layers must be a positive integer"):
        DoublyRobustJointNFM(mcar_sample=sample, layers=(8, 0)).fit(mnar_data.train)
    with pytest.raises(ValueError, match="mcar_sample shape"):
        DoublyRobustJointMF().fit(mnar_data.train, mcar_sample=sp.csr_matrix(np.ones((2, 2))))
    wide = mnar_data.train.copy()
    wide.data = wide.data * 2
    with pytest.raises(ValueError, match=r"ratings outside rating_scale \(1\.0, 5\.0\)"):
        DoublyRobustJointMF(mcar_sample=sample).fit(wide)
    with pytest.raises(ValueError, match="not fitted"):
        DoublyRobustJointMF().predict(np.array([0]), np.array([0]))
    model = DoublyRobustJointMF(mcar_sample=sample, **FAST).fit(mnar_data.train)
    with pytest.raises(ValueError, match="item index out of range"):
        model.predict(np.array([0]), np.array([mnar_data.train.shape[1]]))
    with pytest.raises(ValueError, match="explicit zeros"):
        DoublyRobustJointMF(mcar_sample=sample).fit(sp.csr_matrix((np.array([0.0, 3.0]), np.array([0, 1]),
                                                                   np.array([0, 2])), shape=(1, 2)))
