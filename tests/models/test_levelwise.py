"""LevelwiseLogistic: a free selection logit per rating level, interpolated between levels, plus item biases."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mnar_recsys.data.rows import as_rows
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.models.integrated.gaussian_piecewise import log_expected_sigmoid_piecewise
from mnar_recsys.models.missing import LevelwiseLogistic

LEVEL_LOGITS = (-1.0, -1.5, 0.0, 1.0, 2.5)  # convex and not monotone, like the selection on Yahoo!


def levelwise(n_features: int = 4, levels: tuple[int, int] = (1, 5)) -> LevelwiseLogistic:
    torch.manual_seed(0)
    model = LevelwiseLogistic(n_features, levels=levels)
    with torch.no_grad():
        model.raw_level_logits.copy_(torch.tensor(LEVEL_LOGITS) + 3.0)  # the shift is absorbed by the centring
        model.bias.normal_(0.0, 1.0)
    return model


def levelwise_model(decoder: str, n_features: int = 6):
    """A random not-MIWAE with a levelwise missing model whose level logits are LEVEL_LOGITS."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(n_features=n_features, latent_dim=3, encoder="mlp", encoder_hidden=(8,),
                                    decoder=decoder, decoder_hidden=(8,), squash=None, missing="levelwise"))
    with torch.no_grad():
        model.missing_model.raw_level_logits.copy_(torch.tensor(LEVEL_LOGITS))
        model.missing_model.bias.normal_(0.0, 1.0)
    return model


def test_logits_at_the_levels_are_the_centred_level_logit_plus_the_item_bias():
    model = levelwise(levels=(0, 4))
    g = torch.tensor(LEVEL_LOGITS) - torch.tensor(LEVEL_LOGITS).mean()
    torch.testing.assert_close(model.level_logits(), g)
    levels = torch.arange(0.0, 5.0)
    features = torch.arange(4)
    logits = model.feature_logits(levels[:, None], features[None, :])  # (levels, items)
    torch.testing.assert_close(logits, g[:, None] + model.bias[None, :])
    torch.testing.assert_close(model.logits(levels[:, None].expand(5, 4)), logits)


def test_interpolates_linearly_between_levels_and_is_flat_beyond_them():
    model = levelwise()
    g = model.level_logits()
    x = torch.tensor([1.25, 2.5, 4.9, -3.0, 0.99, 5.0, 7.5])
    expected = torch.stack([0.75 * g[0] + 0.25 * g[1], 0.5 * g[1] + 0.5 * g[2], 0.1 * g[3] + 0.9 * g[4],
                            g[0], g[0], g[4], g[4]])
    torch.testing.assert_close(model.value_logits(x), expected)


def test_initialise_matches_each_items_observed_fraction_at_the_center():
    model = levelwise()
    fraction = np.array([0.02, 0.1, 0.5, 0.9])
    model.initialise(fraction, center=2.5)
    logits = model.feature_logits(torch.full((4,), 2.5), torch.arange(4))
    np.testing.assert_allclose(torch.sigmoid(logits).detach().numpy(), fraction, rtol=1e-5)


def test_refuses_empty_level_ranges():
    with pytest.raises(ValueError, match="lo < hi"):
        LevelwiseLogistic(3, levels=(5, 5))


def test_categorical_integrated_factor_matches_exact_draws():
    """log Pr(s_j = 0 | z) summed exactly over the levels equals, up to Monte-Carlo error, the log of the
    mean of Pr(s_j = 0 | x_j) over 40,000 exact draws x_j ~ p(x_j | z)."""
    model = levelwise_model("categorical")
    with torch.no_grad():
        params = model.decoder(torch.randn(2, 3, 3))
        integrated = model.log_prob_missing(params)
        draws = model.decoder.sample(tuple(t.expand(40_000, *t.shape) for t in params))
        features = torch.arange(6)
        monte_carlo = torch.sigmoid(-model.missing_model.feature_logits(draws, features)).mean(0).log()
    torch.testing.assert_close(integrated, monte_carlo, rtol=0, atol=0.02)


def test_gaussian_integrated_factor_agrees_with_the_sampled_factor_in_expectation():
    """With the same z, exp(log p(s | x_o) with x_m integrated out) is the mean over x_m ~ p(x_m | z) of
    p(s | x_o, x_m) with x_m sampled: compared on the log scale over 20,000 draws of x_m per row."""
    model = levelwise_model("gaussian")
    rng = np.random.default_rng(0)
    rows = rng.integers(1, 6, size=(3, 6)).astype(float)
    rows[:, :3] = np.nan  # three missing items per row
    batch = as_rows(rows).batch(np.arange(3))
    n_draws = 20_000
    with torch.no_grad():
        params = model.decoder(torch.randn(3, 1, 3))
        model.missing_factor = "integrated"
        integrated = model.log_ps(batch, params)[:, 0]
        model.missing_factor = "sampled"
        repeated = tuple(t.expand(3, n_draws, 6) for t in params)
        sampled = torch.logsumexp(model.log_ps(batch, repeated), 1) - math.log(n_draws)
    print(f"largest |integrated - sampled|: {(integrated - sampled).abs().max().item():.4f}")
    torch.testing.assert_close(integrated, sampled, rtol=0, atol=0.02)


def test_gaussian_fast_path_equals_the_generic_quadrature_in_value_and_gradient():
    """The fused Gauss-Hermite loop for piecewise-linear logits gives what the generic path gives (the logit
    at the decoder's quadrature nodes), including the hand-written gradients, checked in float64."""
    model = levelwise_model("gaussian").double()
    params = model.decoder(torch.randn(2, 3, 3, dtype=torch.float64))
    fast = model.log_prob_missing(params)
    nodes, log_w = model.decoder.quadrature(params)
    logits = model.missing_model.feature_logits(nodes, torch.arange(6)[:, None])
    generic = torch.logsumexp(log_w + F.logsigmoid(-logits), dim=-1)
    torch.testing.assert_close(fast, generic)
    inputs = tuple(model.decoder.parameters()) + tuple(model.missing_model.parameters())
    fast_grads = torch.autograd.grad(fast.sum(), inputs, retain_graph=True)
    for a, b in zip(fast_grads, torch.autograd.grad(generic.sum(), inputs)):
        torch.testing.assert_close(a, b)
    loc, scale = (t.detach()[:, :1] for t in params)
    arguments = (loc.requires_grad_(), (0.5 * scale).contiguous().requires_grad_(),
                 torch.tensor(LEVEL_LOGITS, dtype=torch.float64, requires_grad=True),
                 torch.randn(6, dtype=torch.float64, requires_grad=True))
    assert torch.autograd.gradcheck(lambda *a: log_expected_sigmoid_piecewise(*a, lo=1.0), arguments)


@pytest.mark.parametrize("factor", ["sampled", "integrated"])
@pytest.mark.parametrize("decoder", ["gaussian", "categorical"])
def test_gradient_of_log_ps_reaches_the_level_logits_and_the_decoder(decoder, factor):
    model = levelwise_model(decoder)
    model.missing_factor = factor
    rng = np.random.default_rng(0)
    rows = rng.integers(1, 6, size=(4, 6)).astype(float)
    rows[rng.random(rows.shape) < 0.5] = np.nan
    batch = as_rows(rows).batch(np.arange(4))
    params = model.decoder(torch.randn(4, 5, 3))
    model.log_ps(batch, params).sum().backward()
    level_grad = model.missing_model.raw_level_logits.grad
    assert level_grad is not None and level_grad.abs().sum() > 0
    assert level_grad.sum().abs() < 1e-5  # a shift of every level logit changes nothing
    for part in (model.decoder, model.missing_model):
        for name, parameter in part.named_parameters():
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, f"no gradient reaches {name}"
