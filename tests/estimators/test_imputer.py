"""NotMIWAEImputer: scikit-learn's estimator checks, Pipeline use, units, masks and input errors."""

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import LinearRegression
from sklearn.pipeline import Pipeline
from sklearn.utils.estimator_checks import parametrize_with_checks

from mnar_recsys.data.amputation import apply_mask, paper_self_masking, standardize
from mnar_recsys.estimators import imputer as imputer_module
from mnar_recsys.estimators.imputer import NotMIWAEImputer
from mnar_recsys.models.config import ModelConfig
from mnar_recsys.training.trainer import TrainingDiverged

TINY = dict(iterations=3, hidden=8, importance_samples=20, random_state=0)
SHORT = dict(iterations=150, hidden=32, importance_samples=200, random_state=0)


# Every applicable check passes, so no `expected_failed_checks`. The checks feed complete data only
# (an imputer then returns its input), so the imputation itself is tested below. scikit-learn skips
# check_array_api_input by itself unless SCIPY_ARRAY_API is set; the model computes in torch anyway.
@parametrize_with_checks([NotMIWAEImputer(**TINY)])
def test_sklearn_checks(estimator, check):
    check(estimator)


@pytest.fixture(scope="module")
def self_masked():
    """Rank-2 data, standardised, with the paper's self-masking in the first half of the features."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 2)) @ rng.standard_normal((2, 6)) + 0.2 * rng.standard_normal((300, 6))
    X, _, _ = standardize(X)
    mask = paper_self_masking(X)
    return X, mask, apply_mask(X, mask)


def test_pipeline_round_trip(self_masked):
    X, mask, Xm = self_masked
    y = X.sum(1)
    pipe = Pipeline([("impute", NotMIWAEImputer(**SHORT)), ("regress", LinearRegression())])
    pipe.set_params(impute__missing="self-masking")
    assert pipe.get_params()["impute__missing"] == "self-masking"
    predictions = clone(pipe).fit(Xm, y).predict(Xm)
    assert predictions.shape == y.shape and np.isfinite(predictions).all()
    imputed = pipe.fit(Xm, y).named_steps["impute"].transform(Xm)
    np.testing.assert_array_equal(imputed[mask == 1], X[mask == 1])  # observed values untouched
    assert np.isfinite(imputed).all()
    assert list(pipe[:-1].get_feature_names_out()) == [f"x{j}" for j in range(6)]


def test_imputations_in_original_units(self_masked):
    _, mask, Xm = self_masked
    shift, scale = np.array([100.0, -5, 0, 3, 1e3, 7]), np.array([10.0, 0.1, 1, 2, 50, 3])
    base = NotMIWAEImputer(**SHORT).fit_transform(Xm)
    moved_imputer = NotMIWAEImputer(**SHORT).fit(Xm * scale + shift)
    moved = moved_imputer.transform(Xm * scale + shift)
    np.testing.assert_allclose(moved_imputer.mean_, np.nanmean(Xm, 0) * scale + shift)
    np.testing.assert_allclose((moved - shift) / scale, base, atol=1e-3)
    # standardising matters: the missing entries move with the units, not towards the unscaled origin
    assert np.all(np.abs((moved - shift) / scale)[mask == 0] < 5)


def test_mask_accuracy_and_fitted_attributes(self_masked):
    X, mask, Xm = self_masked
    imputer = NotMIWAEImputer(**SHORT).fit(Xm)
    assert imputer.n_features_in_ == 6 and imputer.model_.latent_dim == 5
    assert imputer.history_.bound and imputer.history_.bound[-1][0] == SHORT["iterations"]
    assert imputer.mask_accuracy(X, mask) > 0.8
    miwae = NotMIWAEImputer(**{**TINY, "missing": "mcar"}).fit(Xm)
    with pytest.raises(ValueError, match="no missing model"):
        miwae.mask_accuracy(X, mask)


def test_score_is_the_log_likelihood_of_the_data_in_its_own_units(self_masked):
    _, _, Xm = self_masked
    base = NotMIWAEImputer(**SHORT).fit(Xm)
    scale = np.array([10.0, 0.1, 1, 2, 50, 3])
    moved = NotMIWAEImputer(**SHORT).fit(Xm * scale - 4)
    # the same fit in other units: its density at each row changes by the Jacobian of the observed entries
    jacobian = (~np.isnan(Xm) * np.log(scale)).sum(1).mean()
    assert moved.score(Xm * scale - 4) == pytest.approx(base.score(Xm) - jacobian, abs=1e-3)
    # training raises the log-likelihood of the rows it saw, by far more than the estimate's noise
    barely = NotMIWAEImputer(**{**SHORT, "iterations": 1}).fit(Xm)
    assert base.score(Xm) > barely.score(Xm) + 1


@pytest.mark.parametrize("missing", ["self-masking", "agnostic", "mcar"])
def test_transform_and_score_give_both_from_one_pass(self_masked, missing):
    """One importance pass gives transform's imputation and score's estimate from the same draws, x_m
    integrated or sampled (the MIWAE's imputation could split its samples otherwise where they fill more than
    one block; here they fill one)."""
    _, _, Xm = self_masked
    imputer = NotMIWAEImputer(**{**SHORT, "missing": missing, "importance_samples": 500}).fit(Xm)
    imputed, score = imputer.transform_and_score(Xm)
    np.testing.assert_array_equal(imputed, imputer.transform(Xm))
    assert score == pytest.approx(imputer.score(Xm), abs=1e-6)
    assert score > imputer.score(Xm * 2) + 1  # the density of the rows it is given
    complete = np.nan_to_num(Xm)  # nothing to impute, so no pass: score's own estimate
    imputed, score = imputer.transform_and_score(complete)
    np.testing.assert_array_equal(imputed, complete)
    assert score == imputer.score(complete)


def test_n_init_keeps_the_fit_whose_rows_score_highest(self_masked):
    _, _, Xm = self_masked
    params = {**SHORT, "iterations": 60, "missing": "self-masking", "standardize": False}
    several = NotMIWAEImputer(**params, n_init=3).fit(Xm)
    rng = np.random.RandomState(params["random_state"])
    seeds = [rng.randint(2 ** 31 - 1) for _ in range(3)]
    assert len(set(several.init_scores_)) == 3
    assert several.seed_ == seeds[int(np.argmax(several.init_scores_))]
    assert several.score(Xm) == pytest.approx(max(several.init_scores_))
    # one fit is the first of them, unscored
    single = several.set_params(n_init=1).fit(Xm)
    assert single.seed_ == seeds[0] and single.init_scores_ is None
    for bad in (0, True):
        with pytest.raises(ValueError, match=f"n_init must be a positive integer, got {bad}"):
            NotMIWAEImputer(**params, n_init=bad).fit(Xm)


@pytest.mark.parametrize("scores, kept", [([np.nan, 1.0, np.nan], 1), ([np.nan, np.nan], 0), ([2.0, 3.0, 3.0], 1)])
def test_n_init_never_keeps_a_nan_score_over_a_number(self_masked, monkeypatch, scores, kept):
    _, _, Xm = self_masked
    given = iter(scores)
    monkeypatch.setattr(NotMIWAEImputer, "_mean_log_likelihood", lambda self, model, seed, X: next(given))
    imputer = NotMIWAEImputer(**{**TINY, "n_init": len(scores)}).fit(Xm)
    rng = np.random.RandomState(TINY["random_state"])
    seeds = [rng.randint(2 ** 31 - 1) for _ in scores]
    assert imputer.seed_ == seeds[kept]  # ties keep the first of them, as np.argmax does
    np.testing.assert_array_equal(imputer.init_scores_, scores)


def test_n_init_passes_over_a_start_that_diverges(self_masked, monkeypatch):
    """A start whose training diverges scores NaN and is not kept; with every start diverged, the error stands."""
    _, _, Xm = self_masked
    fit = imputer_module.fit
    calls = []

    def diverging(model, data, config):
        calls.append(config.seed)
        if len(calls) in diverged:
            raise TrainingDiverged("training diverged at iteration 3")
        return fit(model, data, config)
    monkeypatch.setattr(imputer_module, "fit", diverging)
    # the starts one by one, as after a stacked fit diverges (tests/estimators/test_imputer_stacked.py)
    monkeypatch.setattr(imputer_module, "stackable", lambda models, configs: False)
    diverged = {1}
    imputer = NotMIWAEImputer(**{**TINY, "n_init": 2}).fit(Xm)
    assert np.isnan(imputer.init_scores_[0]) and np.isfinite(imputer.init_scores_[1]) and imputer.seed_ == calls[1]
    calls.clear()
    diverged = {1, 2}
    with pytest.raises(TrainingDiverged):
        NotMIWAEImputer(**{**TINY, "n_init": 2}).fit(Xm)


def test_a_failed_refit_leaves_the_last_fit_whole(self_masked, monkeypatch):
    """The standardisation of the new data must not sit beside the old model: transform would then mix them."""
    _, _, Xm = self_masked
    imputer = NotMIWAEImputer(**TINY).fit(Xm)
    before = imputer.transform(Xm)

    def failing_fit(*args, **kwargs):
        raise RuntimeError("training failed")

    monkeypatch.setattr("mnar_recsys.estimators.imputer.fit", failing_fit)
    with pytest.raises(RuntimeError, match="training failed"):
        imputer.fit(100 + 10 * Xm)
    np.testing.assert_array_equal(imputer.transform(Xm), before)
    # refused before training, on data of another width, with names: the width and names stay the last fit's
    narrower = pd.DataFrame(Xm[:, :5], columns=list("vwxyz"))
    narrower["z"] = np.nan
    with pytest.raises(ValueError, match="entirely missing"):
        imputer.fit(narrower)
    assert imputer.n_features_in_ == 6 and not hasattr(imputer, "feature_names_in_")
    np.testing.assert_array_equal(imputer.transform(Xm), before)


def test_fit_leaves_the_callers_torch_random_state_alone(self_masked):
    _, _, Xm = self_masked
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    NotMIWAEImputer(**TINY).fit(Xm)
    torch.testing.assert_close(torch.rand(3), expected, rtol=0, atol=0)


def test_pandas_missing_markers_in_object_columns_are_missing(self_masked):
    _, _, Xm = self_masked
    objects = pd.DataFrame(Xm).astype(object)
    objects[objects.isna()] = pd.NA
    # to rounding: a frame's values arrive column-major, which changes the order of the standardisation's sums
    np.testing.assert_allclose(NotMIWAEImputer(**TINY).fit(objects).transform(objects),
                               NotMIWAEImputer(**TINY).fit(Xm).transform(Xm), rtol=1e-6)


def test_bad_input(self_masked):
    _, _, Xm = self_masked
    with pytest.raises(NotFittedError):
        NotMIWAEImputer(**TINY).transform(Xm)
    empty = Xm.copy()
    empty[:, 4] = np.nan
    with pytest.raises(ValueError, match=r"column 4 entirely missing"):
        NotMIWAEImputer(**TINY).fit(empty)
    frame = pd.DataFrame(empty, columns=list("abcdef"))
    with pytest.raises(ValueError, match=r"column 4 \('e'\) entirely missing"):
        NotMIWAEImputer(**TINY).fit(frame)
    words = Xm.astype(object)
    words[3, 2] = "high"
    with pytest.raises(ValueError, match=r"column 2 holds the non-numeric value 'high'"):
        NotMIWAEImputer(**TINY).fit(words)
    with pytest.raises(ValueError, match=r"column 2 \('c'\) holds the non-numeric value 'high'"):
        NotMIWAEImputer(**TINY).fit(pd.DataFrame(words, columns=list("abcdef")))
    with pytest.raises(ValueError, match="decoder must be one of"):
        NotMIWAEImputer(**{**TINY, "decoder": "conv"}).fit(Xm)
    with pytest.raises(ValueError, match="missing must be one of"):
        NotMIWAEImputer(**{**TINY, "missing": "itemwise"}).fit(Xm)
    with pytest.raises(ValueError, match=r"encoder_hidden must hold positive integers.*\(0, 0\)"):
        NotMIWAEImputer(**{**TINY, "hidden": 0}).fit(Xm)
    with pytest.raises(ValueError, match="latent_dim must be a positive integer, got 2.5"):
        NotMIWAEImputer(**{**TINY, "latent_dim": 2.5}).fit(Xm)
    # before training, not in transform
    with pytest.raises(ValueError, match="n_samples must be a positive integer, got 0"):
        NotMIWAEImputer(**{**TINY, "importance_samples": 0}).fit(Xm)
    fitted = NotMIWAEImputer(**TINY).fit(Xm)
    with pytest.raises(ValueError, match="X has 5 features"):
        fitted.transform(Xm[:, :5])


def test_dense_layers_start_as_in_the_reference_code(self_masked):
    """Glorot-uniform weights and zero biases (the paper's TF code); PyTorch's default init is rougher
    and made the deep not-MIWAE overshoot on Banknote. The variance head still starts near variance 1."""
    _, _, Xm = self_masked
    assert NotMIWAEImputer().model_config(4).init == "glorot"
    with pytest.raises(ValueError, match="init must be one of"):
        ModelConfig(n_features=4, init="xavier")
    # one step with a negligible learning rate leaves the parameters at their initial values
    model = NotMIWAEImputer(iterations=1, lr=1e-12, importance_samples=20, random_state=0).fit(Xm).model_
    layers = [m for m in (*model.encoder.modules(), *model.decoder.modules()) if isinstance(m, torch.nn.Linear)]
    assert len(layers) == 7  # encoder: 2 hidden + head; decoder: 2 hidden + mean and variance heads
    for layer in layers:
        fan_out, fan_in = layer.weight.shape
        limit = np.sqrt(6 / (fan_in + fan_out))
        weight = layer.weight.detach().abs()
        assert weight.max() <= limit + 1e-6 and weight.max() > 0.9 * limit
        if layer is model.decoder.var_head:
            variance = torch.nn.functional.softplus(layer.bias.detach())
            assert torch.allclose(variance, torch.ones_like(variance), atol=1e-3)
        else:
            assert layer.bias.detach().abs().max() < 1e-6


def test_self_masking_model_starts_as_in_the_reference_code(self_masked):
    """logit_j = w_j (x_j - b_j), with w and b Glorot-uniform over a (1, 1, p) variable as in the paper's TF
    code, so of either sign. Written w x + c and started at w = 0, the deep model settled with the wrong
    signs on Concrete (README, UCI)."""
    _, _, Xm = self_masked
    model = NotMIWAEImputer(iterations=1, lr=1e-12, missing="self-masking", importance_samples=20,
                            random_state=0).fit(Xm).model_
    missing = model.missing_model
    limit = np.sqrt(6 / (1 + 6))
    for start in (missing.weight.detach().cpu().numpy(), missing.offset.detach().cpu().numpy()):
        assert np.abs(start).max() <= limit and (start > 0).any() and (start < 0).any()
    slope, intercept = missing.feature_affine(torch.arange(6, device=missing.offset.device))
    logit = slope * missing.offset + intercept
    torch.testing.assert_close(logit, torch.zeros_like(logit))  # logit 0 at the threshold


def test_agnostic_missing_model_learns_the_mask_and_imputes(self_masked):
    """The agnostic missing model (logits linear in the whole completed row, x_m sampled) learns which entries
    go missing from the rows alone and imputes the missing entries better than the observed means, with
    either estimate under its weights; the two differ."""
    X, mask, Xm = self_masked
    imputer = NotMIWAEImputer(**{**SHORT, "iterations": 400, "missing": "agnostic"}).fit(Xm)
    assert imputer.model_config(6).missing_factor == "sampled"
    accuracy = imputer.mask_accuracy(X, mask)
    imputed = imputer.transform(Xm)
    missing = mask == 0
    rmse = np.sqrt(((imputed - X)[missing] ** 2).mean())
    mean_rmse = np.sqrt(((np.nanmean(Xm, axis=0) - X)[missing] ** 2).mean())
    print(f"agnostic: mask accuracy {accuracy:.3f} (all-observed {mask.mean():.3f}), RMSE {rmse:.3f} vs mean "
          f"{mean_rmse:.3f}")
    assert accuracy > mask.mean() + 0.05
    assert rmse < mean_rmse - 0.2
    drawn = imputer.set_params(sampled_imputation="draws").transform(Xm)
    drawn_rmse = np.sqrt(((drawn - X)[missing] ** 2).mean())
    print(f"with the drawn x_m: RMSE {drawn_rmse:.3f}")
    assert drawn_rmse < mean_rmse - 0.2 and not np.allclose(drawn, imputed)
    with pytest.raises(ValueError, match="sampled_imputation"):
        NotMIWAEImputer(**{**TINY, "sampled_imputation": "tilted"}).fit(Xm)


def test_an_infinity_is_refused_naming_its_row_and_column(self_masked):
    _, _, Xm = self_masked
    infinite = Xm.copy()
    infinite[[7, 9], [3, 1]] = [np.inf, -np.inf]
    with pytest.raises(ValueError, match=r"X holds 2 infinite values, the first inf in row 7, column 3 \('d'\); mark "
                                         r"a missing entry with NaN"):
        NotMIWAEImputer(**TINY).fit(pd.DataFrame(infinite, columns=list("abcdef")))
    fitted = NotMIWAEImputer(**TINY).fit(Xm)
    with pytest.raises(ValueError, match=r"X holds 2 infinite values, the first inf in row 7, column 3;"):
        fitted.transform(infinite)
