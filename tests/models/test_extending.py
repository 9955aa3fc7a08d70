"""docs/extending.md, run: a per-feature missing model with a fast integrated path is one class and one
registration, both in this file alone; so is a kernel of its own for a new logit form."""

import pytest
import torch
from torch import nn

from mnar_recsys.data.rows import as_rows
from mnar_recsys.models import config
from mnar_recsys.models.config import ModelConfig, build_model, register_missing_model
from mnar_recsys.models.gather import take
from mnar_recsys.models.integrated import (
    GENERIC,
    IntegratedFactor,
    factor_for,
    gaussian_affine,
    register_factor,
    unregister_factor,
)
from mnar_recsys.models.integrated.categorical import Categorical
from mnar_recsys.models.integrated.gaussian_affine import GaussianAffine
from mnar_recsys.models.integrated.gaussian_piecewise import GaussianPiecewise
from mnar_recsys.models.missing import FixedFunction, MissingModel
from mnar_recsys.training.trainer import TrainConfig, fit


class PerItemSlope(MissingModel):
    """logit_j = w_j x_j + b_j: self-selection as steep as each item's own slope."""

    per_feature = True
    logit_form = "affine"

    def __init__(self, n_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(-1.0, 1.5, n_features))
        self.bias = nn.Parameter(torch.zeros(n_features))

    def feature_affine(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return take(self.weight, features), take(self.bias, features)


@pytest.fixture
def registered(monkeypatch):
    """The registration of docs/extending.md, undone after the test (a copy of the registry is patched in)."""
    monkeypatch.setattr(config, "MISSING_MODELS", dict(config.MISSING_MODELS))
    register_missing_model("per-item-slope", lambda cfg: PerItemSlope(cfg.n_features))


def _model_and_batch(missing: str, decoder: str = "gaussian", n_features: int = 7):
    torch.manual_seed(0)
    model = build_model(ModelConfig(n_features=n_features, encoder="mlp", encoder_hidden=(16,), decoder=decoder,
                                    decoder_hidden=(16,), latent_dim=3, missing=missing))
    values = 1 + 4 * torch.rand(5, n_features)
    values[torch.rand(5, n_features) < 0.4] = float("nan")
    if decoder == "categorical":
        values = values.round()
    return model, as_rows(values.numpy()).batch(list(range(5)))


def test_a_new_affine_missing_model_takes_the_fused_gaussian_kernel_and_integrates_as_the_generic_rule(
        registered, monkeypatch):
    calls = []
    kernel = gaussian_affine._compiled_masked_sums

    def spy(*tensors, **constants):
        calls.append(constants["needs_grad"])
        return kernel(*tensors, **constants)

    monkeypatch.setattr(gaussian_affine, "_compiled_masked_sums", spy)
    model, batch = _model_and_batch("per-item-slope")
    assert isinstance(model.missing_model, PerItemSlope)
    assert isinstance(model.integrated_factor, GaussianAffine)
    z = torch.randn(5, 4, 3)
    params = model.decoder(z)
    keep = 1 - batch.mask[:, None]
    fast = model.integrated_factor.masked_sum(model.decoder, model.missing_model, params, keep, None)
    generic = GENERIC.masked_sum(model.decoder, model.missing_model, params, keep, None)
    assert calls == [True]  # the fused pass ran, with its written-out gradient
    torch.testing.assert_close(fast, generic, rtol=1e-5, atol=1e-5)
    fast_grad = torch.autograd.grad(fast.sum(), model.missing_model.weight)[0]
    generic_grad = torch.autograd.grad(generic.sum(), model.missing_model.weight)[0]
    torch.testing.assert_close(fast_grad, generic_grad, rtol=1e-4, atol=1e-5)
    assert fast_grad.abs().min() > 0  # every item's slope is reached


def test_a_new_missing_model_trains_and_imputes_through_its_registration(registered):
    model, _ = _model_and_batch("per-item-slope")
    values = 1 + 4 * torch.rand(60, 7)
    values[values < 2.5] = float("nan")  # low values go missing: a self-selection the slopes can learn
    before = model.missing_model.weight.detach().clone()
    history = fit(model, values.numpy(), TrainConfig(iterations=30, batch_size=20, n_samples=4, lr=1e-2,
                                                     progress=False, log_every=10))
    assert len(history.bound) == 3 and all(torch.isfinite(torch.tensor(v)) for _, v in history.bound)
    assert not torch.equal(model.missing_model.weight.detach(), before)


def test_registering_a_taken_name_is_refused(registered):
    with pytest.raises(ValueError, match="'per-item-slope' is already registered"):
        register_missing_model("per-item-slope", lambda cfg: PerItemSlope(cfg.n_features))
    with pytest.raises(ValueError, match="missing must be one of .*'per-item-slope'.*got 'per-item-slopes'"):
        ModelConfig(n_features=3, missing="per-item-slopes")


class SquaredLogit(MissingModel):
    """logit_j = c_j (x_j - 3)²: a logit form no built-in kernel knows."""

    per_feature = True
    logit_form = "test-squared"

    def __init__(self, n_features: int):
        super().__init__()
        self.curvature = nn.Parameter(torch.full((n_features,), 0.3))

    def feature_logits(self, x: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return take(self.curvature, features) * (x - 3) ** 2


def test_a_kernel_of_its_own_is_one_registered_factor_class():
    counted = []

    @register_factor("gaussian", "test-squared")
    class CountingQuadrature(IntegratedFactor):
        def log_prob_missing(self, decoder, missing_model, params, features, offset):
            counted.append(features.shape)
            return GENERIC.log_prob_missing(decoder, missing_model, params, features, offset)

    try:
        model, batch = _model_and_batch("mcar")
        model.missing_model, model.missing_factor = SquaredLogit(7), "integrated"
        assert isinstance(model.integrated_factor, CountingQuadrature)
        params = model.decoder(torch.randn(5, 4, 3))
        value = model.log_ps(batch, params)
        assert counted == [torch.Size([7])] and value.shape == (5, 4) and torch.isfinite(value).all()
    finally:
        unregister_factor("gaussian", "test-squared")
    assert factor_for(model.decoder, model.missing_model) is GENERIC
    with pytest.raises(KeyError, match="'gaussian' and logit form 'test-squared'"):
        unregister_factor("gaussian", "test-squared")
    with pytest.raises(TypeError, match="takes an IntegratedFactor subclass"):
        register_factor("gaussian", "x")(object)


@pytest.mark.parametrize("decoder, missing, expected", [
    ("gaussian", "itemwise", GaussianAffine), ("linear", "self-masking", GaussianAffine),
    ("gaussian", "levelwise", GaussianPiecewise), ("categorical", "itemwise", Categorical),
    ("categorical", "levelwise", Categorical), ("bernoulli", "self-masking", type(GENERIC)),
])
def test_each_built_in_pair_finds_its_kernel(decoder, missing, expected):
    model, _ = _model_and_batch(missing, decoder)
    assert type(model.integrated_factor) is expected


def test_a_logit_without_a_form_integrates_on_the_decoders_nodes():
    model, _ = _model_and_batch("mcar")
    assert factor_for(model.decoder, FixedFunction(torch.sin)) is GENERIC
