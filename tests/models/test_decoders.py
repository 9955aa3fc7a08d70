"""The Bernoulli and Student-t decoders against torch.distributions, and each in a bound and an imputation."""

import math

import numpy as np
import pytest
import torch

from mnar_recsys.data.rows import as_rows
from mnar_recsys.inference.importance import ImportanceConfig, impute
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.models.decoders import (
    BernoulliDecoder,
    CategoricalDecoder,
    ConvMeanNet,
    GaussianDecoder,
    StudentTDecoder,
)
from mnar_recsys.training.seeds import seeded
from mnar_recsys.training.trainer import TrainConfig, fit


def test_bernoulli_log_prob_cdf_quadrature_and_mean_are_the_bernoullis():
    torch.manual_seed(0)
    decoder = BernoulliDecoder(latent_dim=2, n_features=5, hidden=(4,))
    params = decoder(torch.randn(3, 4, 2))
    reference = torch.distributions.Bernoulli(logits=params[0])
    x = torch.bernoulli(torch.full(params[0].shape, 0.5))
    torch.testing.assert_close(decoder.log_prob(params, x), reference.log_prob(x))
    torch.testing.assert_close(decoder.mean(params), reference.mean)
    torch.testing.assert_close(decoder.cdf(params, torch.zeros_like(x)), 1 - reference.probs)
    torch.testing.assert_close(decoder.cdf(params, torch.full_like(x, -0.5)), torch.zeros_like(x))
    torch.testing.assert_close(decoder.cdf(params, torch.ones_like(x)), torch.ones_like(x))
    nodes, log_w = decoder.quadrature(params)
    torch.testing.assert_close(log_w.exp().sum(-1), torch.ones_like(x))
    torch.testing.assert_close((log_w.exp() * nodes).sum(-1), reference.mean)
    torch.testing.assert_close(log_w[..., 1], reference.log_prob(torch.ones_like(x)))


def test_student_t_log_prob_and_mean_are_the_student_ts():
    torch.manual_seed(0)
    decoder = StudentTDecoder(latent_dim=2, n_features=5, hidden=(4,))
    params = decoder(torch.randn(3, 4, 2))
    loc, scale, df = params
    assert (df > 1).all() and (scale >= decoder.min_scale).all()
    x = torch.randn(loc.shape)
    torch.testing.assert_close(decoder.log_prob(params, x), torch.distributions.StudentT(df, loc, scale).log_prob(x))
    torch.testing.assert_close(decoder.mean(params), loc)
    with torch.no_grad():
        draws = decoder.rsample(tuple(t[:1, :1].expand(20_000, 1, 5) for t in params))
    # the draws' median is the location (heavy tails make the mean a poor check)
    torch.testing.assert_close(draws.median(0).values[0], loc[0, 0], atol=0.05, rtol=0)


@pytest.mark.parametrize("decoder, missing, values", [
    ("bernoulli", "self-masking-known", (0.0, 1.0)),
    ("student-t", "agnostic", None),
])
def test_each_decoder_trains_a_finite_bound_and_imputes(decoder, missing, values):
    """200 steps raise the bound on the rows (measured: Bernoulli -4.65 to -3.99, Student-t -7.44 to -5.33)."""
    torch.manual_seed(0)
    factor = "integrated" if decoder == "bernoulli" else "sampled"  # the Student-t has no quadrature
    model = build_model(ModelConfig(n_features=4, latent_dim=2, encoder="mlp", decoder=decoder, squash=None,
                                    missing=missing, missing_factor=factor))
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 2, (20, 4)).astype(float) if values else rng.standard_normal((20, 4))
    rows[rng.random(rows.shape) < 0.3] = np.nan
    batch = as_rows(rows).batch(np.arange(20))

    def mean_bound() -> float:
        with seeded(0, torch.device("cpu")), torch.no_grad():
            return model.bound(batch, 50).mean().item()

    before = mean_bound()
    fit(model, rows, TrainConfig(iterations=200, batch_size=20, lr=1e-2, progress=False, device="cpu"))
    assert math.isfinite(before) and mean_bound() > before + 0.1
    result = impute(model, rows, config=ImportanceConfig(n_samples=50, seed=0))
    assert np.isfinite(result.mean).all()
    if values:
        assert ((result.mean >= 0) & (result.mean <= 1)).all()


def test_a_median_without_the_decoders_cdf_is_refused_before_any_sampling(monkeypatch):
    """The Student-t gives no CDF, so its conditional median is refused up front, naming the way out; with
    sampled_imputation='draws' the median at missing targets is that of the weighted draws, which needs none,
    and an observed target, which has no draw, is refused up front too."""
    model = build_model(ModelConfig(n_features=4, latent_dim=2, encoder="mlp", decoder="student-t", squash=None,
                                    missing="agnostic", missing_factor="sampled"))
    rows = np.random.default_rng(0).standard_normal((6, 4))
    rows[:, 0] = np.nan
    monkeypatch.setattr(type(model), "sample", lambda *args, **kwargs: pytest.fail("sampled before refusing"))
    with pytest.raises(ValueError, match="StudentTDecoder does not give.*sampled_imputation='draws'"):
        impute(model, rows, methods=("median",), config=ImportanceConfig(n_samples=20))
    draws = ImportanceConfig(n_samples=20, sampled_imputation="draws")
    with pytest.raises(ValueError, match="missing targets only"):  # (0, 1) is observed: no draw to take there
        impute(model, rows, np.array([0, 0]), np.array([0, 1]), methods=("median",), config=draws)
    monkeypatch.undo()
    assert np.isfinite(impute(model, rows, methods=("median",), config=draws).median).all()


def test_gaussian_mean_is_squashed_onto_the_rating_range_and_the_variance_floored():
    decoder = GaussianDecoder(latent_dim=2, n_features=3, hidden=(), squash=(1.0, 5.0), min_variance=1e-3)
    with torch.no_grad():
        decoder.mean_head.weight.zero_()
        decoder.mean_head.bias.copy_(torch.tensor([-30.0, 0.0, 30.0]))
        decoder.raw_var.fill_(-40.0)  # a collapsing variance: softplus(-40) is about 4e-18
    loc, scale = decoder(torch.zeros(1, 1, 2))
    torch.testing.assert_close(loc[0, 0], torch.tensor([1.0, 3.0, 5.0]))
    torch.testing.assert_close(scale[0, 0] ** 2, torch.full((3,), 1e-3))
    assert torch.isfinite(decoder.log_prob((loc, scale), loc + 0.1)).all()  # -2.47, not -1e15


def test_categorical_cdf_counts_the_level_itself():
    decoder = CategoricalDecoder(latent_dim=1, n_features=1)
    logits = torch.tensor([0.6, 0.1, 0.1, 0.1, 0.1]).log().expand(1, 1, 1, 5)
    cdf = torch.stack([decoder.cdf((logits,), torch.full((1, 1, 1), level)) for level in (1.0, 2.0, 3.0, 4.0, 5.0)])
    torch.testing.assert_close(cdf.flatten(), torch.tensor([0.6, 0.7, 0.8, 0.9, 1.0]))


def test_gumbel_softmax_draws_follow_the_temperature():
    """At a low temperature the relaxed draws lie next to the levels (measured: 96% within 0.01 at 0.01; 3% at 1)."""
    torch.manual_seed(0)
    logits = torch.zeros(20_000, 1, 3, 5)
    for temperature, near in ((0.01, lambda share: share > 0.9), (1.0, lambda share: share < 0.2)):
        draws = CategoricalDecoder(latent_dim=2, n_features=3, temperature=temperature).rsample((logits,))
        assert near(((draws - draws.round()).abs() < 0.01).float().mean().item())


def test_the_conv_decoder_is_not_affine_in_z():
    """Its transposed convolutions are interleaved with ReLUs (measured: midpoint gap 8.8e-4; 7e-9 without them)."""
    torch.manual_seed(0)
    net = ConvMeanNet(3, 64, channels=(8, 4, 2))
    z1, z2 = torch.randn(2, 3), torch.randn(2, 3)
    with torch.no_grad():
        gap = (net((z1 + z2) / 2) - (net(z1) + net(z2)) / 2).abs().max().item()
    assert gap > 1e-5
