"""Importance-sampling imputation: the methods' outputs, their targets, and a posterior known in closed form."""

import math

import numpy as np
import pytest
import torch

from mnar_recsys.data.rows import as_rows
from mnar_recsys.inference.importance import ImportanceConfig, _weighted_median, impute, log_likelihood, mask_accuracy
from mnar_recsys.inference.tilt import Posterior, mixture_median
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.models.missing import FixedFunction

N_FEATURES, LATENT, VARIANCE = 5, 2, 0.3


@pytest.fixture(scope="module")
def ppca(ppca_model):
    """The PPCA-like MIWAE of conftest, rows drawn from it with about 40% missing (first feature always observed),
    and the exact conditional mean of each missing entry, b_m + C_mo C_oo⁻¹ (x_o - b_o) with C = W Wᵀ + σ² I."""
    model = ppca_model
    weight = model.decoder.mean_head.weight.detach().double().numpy()
    bias = model.decoder.mean_head.bias.detach().double().numpy()
    rng = np.random.default_rng(1)
    complete = rng.standard_normal((8, LATENT)) @ weight.T + bias + math.sqrt(VARIANCE) * rng.standard_normal((8, 5))
    rows = complete.copy()
    missing = rng.random(rows.shape) < 0.4
    missing[:, 0] = False
    rows[missing] = np.nan
    covariance = weight @ weight.T + VARIANCE * np.eye(N_FEATURES)
    exact = np.full(rows.shape, np.nan)
    for i, row in enumerate(rows):
        o, m = ~np.isnan(row), np.isnan(row)
        exact[i, m] = bias[m] + covariance[np.ix_(m, o)] @ np.linalg.solve(covariance[np.ix_(o, o)], row[o] - bias[o])
    return model.eval(), rows, exact


def test_methods_return_one_value_per_missing_entry_and_leave_the_data_alone(ppca):
    """Default targets are exactly the missing entries; mean and median have one value per target, multiple
    imputation (n_imputations, targets); the input array is not modified; 1 ≤ ESS ≤ K for every row."""
    model, rows, _ = ppca
    before = rows.copy()
    config = ImportanceConfig(n_samples=300, n_imputations=4, seed=0)
    result = impute(model, rows, methods=("mean", "median", "multiple"), config=config)
    missing_rows, missing_cols = np.nonzero(np.isnan(rows))
    assert sorted(zip(result.rows, result.cols)) == sorted(zip(missing_rows, missing_cols))
    n_targets = missing_rows.size
    assert result.mean.shape == result.median.shape == (n_targets,)
    assert result.draws.shape == (4, n_targets)
    assert np.isfinite(result.mean).all() and np.isfinite(result.median).all() and np.isfinite(result.draws).all()
    np.testing.assert_array_equal(rows, before)
    assert result.ess.shape == (rows.shape[0],)
    assert ((result.ess >= 1 - 1e-9) & (result.ess <= config.n_samples + 1e-6)).all()


def test_explicit_targets_come_back_in_the_order_asked(ppca):
    """Asking for targets in a shuffled order returns them in that order with the values of the sorted request
    (the same seed draws the same samples)."""
    model, rows, _ = ppca
    target_rows, target_cols = np.nonzero(np.isnan(rows))
    order = np.random.default_rng(0).permutation(target_rows.size)
    config = ImportanceConfig(n_samples=200, seed=0)
    sorted_result = impute(model, rows, target_rows, target_cols, config=config)
    shuffled = impute(model, rows, target_rows[order], target_cols[order], config=config)
    np.testing.assert_array_equal(shuffled.rows, target_rows[order])
    np.testing.assert_array_equal(shuffled.cols, target_cols[order])
    np.testing.assert_allclose(shuffled.mean, sorted_result.mean[order], rtol=0, atol=1e-6)


@pytest.mark.parametrize("chunk_entries", [None, 2000])
def test_conditional_mean_and_median_match_the_exact_gaussian_posterior(ppca, chunk_entries):
    """Under PPCA + MCAR, x_m | x_o is Gaussian: with 2,000 samples the importance-sampling conditional mean and
    median are within 0.1 of the exact conditional mean (= median), ten times closer than the prior mean b_m
    (measured: largest error 0.031 for the mean, 0.041 for the median, 0.484 for b_m), also when the samples
    come in about 57 sub-chunks (chunk_entries=2000), whose weights the streamed mean rescales as it goes."""
    model, rows, exact = ppca
    result = impute(model, rows, methods=("mean", "median"),
                    config=ImportanceConfig(n_samples=2000, seed=0, device="cpu", chunk_entries=chunk_entries))
    truth = exact[result.rows, result.cols]
    prior_error = np.abs(model.decoder.mean_head.bias.detach().numpy()[result.cols] - truth)
    for estimate in (result.mean, result.median):
        error = np.abs(estimate - truth)
        print(f"largest error {error.max():.3f}, prior-mean error {prior_error.max():.3f}")
        assert error.max() < 0.1
        assert error.mean() < 0.1 * prior_error.mean()


def test_weighted_median_is_where_the_sorted_weights_reach_half():
    """Sorted: 0 (0.3), 1 (0.4), 10 (0.3): half the weight is reached at 1, where the weighted mean is 3.4;
    a cumulative weight of exactly 1/2 keeps the lower value."""
    alpha = torch.tensor([[0.3, 0.3, 0.4], [0.5, 0.5, 0.0]])
    values = torch.tensor([[[10.0], [0.0], [1.0]], [[1.0], [0.0], [7.0]]])
    torch.testing.assert_close(_weighted_median(alpha, values), torch.tensor([[1.0], [0.0]]))


def test_mixture_median_lies_between_component_medians_and_halves_the_mass():
    """For a weighted mixture of Gaussians, the median solves Σ_k α_k F(x | z_k) = 0.5 (to 1e-4) and lies between
    the smallest and largest component median."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(n_features=3, latent_dim=2, encoder="mlp", decoder="gaussian", squash=None,
                                    missing="mcar", missing_factor="sampled"))
    loc = 3 * torch.randn(4, 6, 3)
    scale = 0.2 + torch.rand(4, 6, 3)
    alpha = torch.softmax(torch.randn(4, 6), dim=1)
    cols = torch.arange(3).expand(4, 3)
    median = mixture_median(model, alpha, (loc, scale), cols, torch.zeros(4, 3), None)
    assert ((median >= loc.amin(1)) & (median <= loc.amax(1))).all()
    mass = (alpha[:, :, None] * model.decoder.cdf((loc, scale), median[:, None, :])).sum(1)
    torch.testing.assert_close(mass, torch.full_like(mass, 0.5), rtol=0, atol=1e-4)


def test_categorical_median_and_draws_lie_on_the_levels():
    """With the categorical decoder the conditional median and every multiple-imputation draw is a level 1..5."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(n_features=6, latent_dim=3, encoder="set", embedding_dim=4, code_dim=8,
                                    decoder="categorical"))
    rng = np.random.default_rng(0)
    rows = rng.integers(1, 6, size=(5, 6)).astype(float)
    rows[rng.random(rows.shape) < 0.5] = np.nan
    result = impute(model, rows, methods=("median", "multiple"),
                    config=ImportanceConfig(n_samples=50, n_imputations=7, seed=0))
    levels = np.arange(1, 6)
    assert result.draws.shape == (7, np.isnan(rows).sum())
    assert np.isin(result.draws, levels).all() and np.isin(result.median, levels).all()
    assert len(np.unique(result.draws)) > 1


def test_tilted_mean_median_and_draws_describe_one_posterior():
    """With x_m integrated out, the mean, the median and the resampled draws all use p(x_j | z_k, s_j), the
    decoder tilted by the missing model: the draws' average and median match the mean and the median."""
    torch.manual_seed(0)
    config = ModelConfig(n_features=5, latent_dim=2, encoder="mlp", activation="tanh", decoder="gaussian",
                         decoder_hidden=(16,), squash=None, missing="self-masking-known", missing_sign=-1)
    model = build_model(config)
    with torch.no_grad():
        model.missing_model.raw_weight.fill_(1.0)  # a clear tilt: missing values are the large ones
    data = np.random.default_rng(0).normal(size=(8, 5)).astype(np.float32)
    data[:, :2] = np.nan
    result = impute(model, data, methods=("mean", "median", "multiple"),
                    config=ImportanceConfig(n_samples=200, n_imputations=4000, seed=0, device="cpu"))
    assert np.abs(result.draws.mean(0) - result.mean).max() < 0.08
    assert np.abs(np.median(result.draws, 0) - result.median).max() < 0.1
    mean_only = impute(model, data, config=ImportanceConfig(n_samples=200, seed=0, device="cpu"))
    assert np.allclose(mean_only.mean, result.mean)  # the other methods do not disturb the mean's draws
    # the tilt moves the imputations above the decoder's means (under a fresh set of weights), towards the
    # large values the missing model says go missing; sampled here on the CPU, hence device="cpu" above
    with torch.no_grad():
        samples = model.sample(as_rows(data).batch(np.arange(8)), 200)
        alpha = torch.softmax(samples.terms.log_weights, 1)
        decoder_mean = (alpha[:, :, None] * samples.params[0]).sum(1).numpy()
    assert (result.mean > decoder_mean[result.rows, result.cols]).mean() > 0.9


def test_imputation_finds_the_posterior_given_the_mask():
    """A decoder that ignores z, x_j ~ N(0, 1), and a known self-masking model Pr(s_j = 0 | x_j) = σ(2 x_j):
    the posterior of a missing x_j is N(0, 1) tilted by σ(2 x_j), mean 0.61 and median 0.58, not the
    decoder's 0. With x_m integrated out the tilt finds both. With x_m sampled, averaging the drawn x_m,k
    finds them too, within Monte Carlo error; averaging the decoder mean under the weights, as the paper's
    code does, stays at 0."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(n_features=3, latent_dim=2, encoder="mlp", activation="tanh", decoder="gaussian",
                                    decoder_hidden=(4,), squash=None, missing="self-masking-known",
                                    missing_sign=-1)).eval()
    with torch.no_grad():
        model.decoder.mean_head.weight.zero_()
        model.decoder.mean_head.bias.zero_()
        model.decoder.raw_var.fill_(math.log(math.expm1(1 - model.decoder.min_variance)))  # variance 1
        model.missing_model.raw_weight.fill_(math.log(math.expm1(2.0)))  # slope -2
        model.missing_model.offset.zero_()
    grid = np.linspace(-10, 10, 200_001)
    density = np.exp(-grid ** 2 / 2) / (1 + np.exp(-2 * grid))
    cdf = np.cumsum(density) / density.sum()
    exact_mean, exact_median = (grid * density).sum() / density.sum(), grid[np.searchsorted(cdf, 0.5)]
    data = np.random.default_rng(0).normal(size=(10, 3))
    data[:, 0] = np.nan
    config = ImportanceConfig(n_samples=1000, n_imputations=2000, seed=0)
    result = impute(model, data, methods=("mean", "median", "multiple"), config=config)
    print(f"exact mean {exact_mean:.3f}, median {exact_median:.3f}; imputed {result.mean.round(3)}, "
          f"{result.median.round(3)}, draws' mean {result.draws.mean():.3f}")
    assert np.abs(result.mean - exact_mean).max() < 0.01
    assert np.abs(result.median - exact_median).max() < 0.01
    assert abs(result.draws.mean() - exact_mean) < 0.03
    model.missing_factor = "sampled"
    assert np.abs(impute(model, data, config=config).mean).max() < 1e-6  # sampled_imputation='decoder-mean'
    drawn = impute(model, data, methods=("mean", "median", "multiple"),
                   config=ImportanceConfig(n_samples=4000, n_imputations=500, seed=0, sampled_imputation="draws"))
    print(f"draws: {drawn.mean.round(3)}, {drawn.median.round(3)}, draws' mean {drawn.draws.mean():.3f}")
    assert np.abs(drawn.mean - exact_mean).max() < 0.06
    assert np.abs(drawn.median - exact_median).max() < 0.08
    assert abs(drawn.draws.mean() - exact_mean) < 0.03
    with pytest.raises(ValueError, match="sampled_imputation must be one of"):
        ImportanceConfig(sampled_imputation="tilted")
    # an observed target has no draw: it keeps the decoder's estimate, the missing ones take the draws'
    rows, cols = np.array([0, 0, 1]), np.array([0, 1, 0])  # (0, 1) is observed
    paper = impute(model, data, rows, cols, config=ImportanceConfig(n_samples=500, seed=1))
    mixed = impute(model, data, rows, cols, config=ImportanceConfig(n_samples=500, seed=1, sampled_imputation="draws"))
    assert mixed.mean[1] == paper.mean[1] and np.all(np.abs(mixed.mean[[0, 2]] - paper.mean[[0, 2]]) > 0.3)


def _z_free_self_masking(slope: float, threshold: float, missing_factor: str = "integrated"):
    """A decoder that ignores z, x_j ~ N(0, 1), and Pr(s_j = 0 | x_j) = σ(slope (x_j - threshold)); with the exact
    mean and median of a missing x_j's posterior, N(0, 1) tilted by that, on a fine grid."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(n_features=3, latent_dim=2, encoder="mlp", activation="tanh", decoder="gaussian",
                                    decoder_hidden=(4,), squash=None, missing="self-masking-known", missing_sign=-1,
                                    missing_factor=missing_factor)).eval()
    with torch.no_grad():
        model.decoder.mean_head.weight.zero_()
        model.decoder.mean_head.bias.zero_()
        model.decoder.raw_var.fill_(math.log(math.expm1(1 - model.decoder.min_variance)))  # variance 1
        model.missing_model.raw_weight.fill_(math.log(math.expm1(slope)))
        model.missing_model.offset.fill_(threshold)
    grid = np.linspace(-12, 12, 400_001)
    density = np.exp(-grid ** 2 / 2) * 0.5 * (1 + np.tanh(slope * (grid - threshold) / 2))  # σ without overflow
    cdf = np.cumsum(density) / density.sum()
    return model, (grid * density).sum() / density.sum(), grid[np.searchsorted(cdf, 0.5)]


@pytest.mark.parametrize("slope, threshold",
                         [(20.0, 1.5), (5.0, 3.0), (50.0, 0.0), (2.0, 6.0), (3.0, 7.0), (20.0, 8.5)])
def test_median_and_draws_follow_a_steep_tilt(slope, threshold):
    """A steep missing process is a near step in the posterior: one 8-point rule over the line put the median
    of (20, 1.5) at 8.00 (exact 1.83) and left 52% of the draws of (3, 3) untilted after 200 rejection rounds.
    The median (exact to 0.005) and the draws (to Monte Carlo error) now follow the exact posterior, also where
    the mask pushes it past 6 decoder sd, the ends of a probability scale centred at the decoder's mean
    ((3, 7): median 2.27, exact 3.00; (20, 8.5): -8.00, exact 8.53, before the scale was centred at the mode)."""
    model, exact_mean, exact_median = _z_free_self_masking(slope, threshold)
    data = np.random.default_rng(0).normal(size=(4, 3))
    data[:, 0] = np.nan
    result = impute(model, data, methods=("median", "multiple"),
                    config=ImportanceConfig(n_samples=20, n_imputations=5000, seed=0))
    print(f"exact mean {exact_mean:.3f}, median {exact_median:.3f}; median {result.median.round(3)}, draws' mean "
          f"{result.draws.mean():.3f}, median {np.median(result.draws):.3f}")
    np.testing.assert_allclose(result.median, exact_median, atol=0.005)
    assert abs(result.draws.mean() - exact_mean) < 0.03 and abs(np.median(result.draws) - exact_median) < 0.03


def test_a_logit_that_is_not_affine_still_follows_a_posterior_pushed_far_out():
    """A user's own logit function (here the affine σ(-20 (x - 8.5)) as a plain function): the scale has
    no closed-form mode, so it is found by search, and moves there only when the mode lies far out."""
    model = build_model(ModelConfig(n_features=1, latent_dim=1, decoder="gaussian", missing="self-masking",
                                    squash=None)).eval()
    model.missing_model = FixedFunction(lambda x: -20.0 * (x - 8.5))
    grid = np.linspace(0, 12, 120_001)
    density = np.exp(-grid ** 2 / 2 - np.logaddexp(0, -20.0 * (grid - 8.5)))  # missing: σ(20 (x - 8.5))
    exact_median = grid[np.searchsorted(np.cumsum(density) / density.sum(), 0.5)]
    cols, missing = torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1)
    median = mixture_median(model, torch.ones(1, 1), (torch.zeros(1, 1, 1), torch.ones(1, 1, 1)), cols, missing, None)
    assert abs(median.item() - exact_median) < 0.005


@pytest.mark.parametrize("slope, threshold", [(20.0, 2.5), (20.0, 1.5), (5.0, 2.0)])
def test_a_steep_logit_that_is_not_affine_splits_its_panels_at_the_step(slope, threshold):
    """A posterior pushed 2 to 3 sd out, where the scale stays at the decoder's mean: the panels are graded
    towards where the logit crosses 0 and the median's bracket reaches past the step (measured at (20, 2.5):
    CDF 0.5000 at the exact median 2.7265, and 0.1055 / median 3.11 with the split left at the scale's middle;
    median 2.00 with a bracket of 2 sd)."""
    model = build_model(ModelConfig(n_features=1, latent_dim=1, decoder="gaussian", missing="self-masking",
                                    squash=None)).eval()
    model.missing_model = FixedFunction(lambda x: -slope * (x - threshold))
    grid = np.linspace(-8, 12, 200_001)
    density = np.exp(-grid ** 2 / 2 - np.logaddexp(0, -slope * (grid - threshold)))
    exact_median = grid[np.searchsorted(np.cumsum(density) / density.sum(), 0.5)]
    exact_mean = (grid * density).sum() / density.sum()
    params, cols, missing = (torch.zeros(1, 1, 1), torch.ones(1, 1, 1)), torch.zeros(1, 1, dtype=torch.long), \
        torch.zeros(1, 1)
    median = mixture_median(model, torch.ones(1, 1), params, cols, missing, None)
    posterior = Posterior(model, params, cols, missing, None)
    assert abs(median.item() - exact_median) < 0.005
    assert abs(posterior.cdf(torch.full((1, 1, 1), exact_median)).item() - 0.5) < 0.005
    torch.manual_seed(0)
    many = (torch.zeros(1, 20_000, 1), torch.ones(1, 20_000, 1))  # one entry's posterior, 20,000 times over
    draws = Posterior(model, many, cols, missing, None).sample()
    assert abs(draws.mean().item() - exact_mean) < 0.02


def test_the_affine_modes_bracket_scales_with_the_decoders_variance():
    """N(0, 2^2) tilted by σ(1.5 (x - 14)): the mode solves x / 4 = 1.5 σ(-1.5 (x - 14)), at 6.0, within
    loc + slope scale^2 = 6 (measured 6.000; a bracket of slope x scale, 3, put it at 3.0 and the mass over 1)."""
    model, *_ = _z_free_self_masking(1.5, 14.0)
    params = (torch.zeros(1, 1, 1), torch.full((1, 1, 1), 2.0))
    posterior = Posterior(model, params, torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1), None)
    grid = np.linspace(-10, 20, 300_001)
    log_density = -grid ** 2 / 8 - np.logaddexp(0, -1.5 * (grid - 14.0))
    assert abs(posterior.centres().item() - grid[np.argmax(log_density)]) < 0.01
    assert posterior.total.item() <= 1.0 + 1e-6


def test_median_and_draws_of_a_two_mode_level_wise_posterior():
    """A level-wise logit high at both end levels tilts N(3, 1) towards both: a scale centred at one mode
    resolves the other badly (a draft centred every entry's scale at its mode: median 2.63, exact 3.09), so
    the scale leaves the decoder's mean only for a mode far out in its tail."""
    model = build_model(ModelConfig(n_features=1, latent_dim=1, decoder="gaussian", missing="levelwise",
                                    squash=(1.0, 5.0)))
    with torch.no_grad():
        model.missing_model.raw_level_logits.copy_(torch.tensor([1.0, -1.0, -1.2, -1.0, 1.5]))
        model.missing_model.bias.fill_(-1.0)
        grid = np.linspace(-6, 12, 180_001)
        logits = model.missing_model.value_logits(torch.tensor(grid, dtype=torch.float32)).double().numpy() - 1.0
    density = np.exp(-(grid - 3) ** 2 / 2) / (1 + np.exp(-logits))  # observed: Pr(s = 1 | x)
    exact_mean = (grid * density).sum() / density.sum()
    exact_median = grid[np.searchsorted(np.cumsum(density) / density.sum(), 0.5)]
    cols, observed = torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1)
    params = (torch.full((1, 1, 1), 3.0), torch.ones(1, 1, 1))
    median = mixture_median(model, torch.ones(1, 1), params, cols, observed, None)
    torch.manual_seed(1)
    draws = Posterior(model, (torch.full((1, 20_000, 1), 3.0), torch.ones(1, 20_000, 1)), cols, observed, None).sample()
    assert abs(median.item() - exact_median) < 0.005
    assert abs(draws.mean().item() - exact_mean) < 0.03


def test_multiple_imputation_with_x_m_sampled_resamples_the_drawn_values():
    """With x_m sampled, multiple imputation resamples the (z_k, x_m,k) pairs the weights were computed with, a
    draw from p(x_m | x_o, s), also under sampled_imputation='decoder-mean': a fresh x_m given the picked z_k
    ignored the mask (draws' mean 0.02 where the posterior's is 0.61)."""
    model, exact_mean, _ = _z_free_self_masking(2.0, 0.0, missing_factor="sampled")
    data = np.random.default_rng(0).normal(size=(10, 3))
    data[:, 0] = np.nan
    result = impute(model, data, methods=("mean", "multiple"),
                    config=ImportanceConfig(n_samples=4000, n_imputations=500, seed=0))
    assert np.abs(result.mean).max() < 1e-6  # the decoder mean under the weights, as the paper's code
    assert abs(result.draws.mean() - exact_mean) < 0.03


def test_a_discrete_decoders_sampled_x_m_are_values_at_inference():
    """Training draws a categorical x_m relaxed (Gumbel-Softmax), off its levels; inference draws it exactly.
    So the sampled factor's log-likelihood agrees with the integrated one's (the same parameters; exact sum
    over the levels) to Monte Carlo error: relaxed draws, as inference took them before, put it 1.9 nats a
    row below (eight missing items a row, slope 2). And the draws, averaged or resampled, lie on the levels."""
    torch.manual_seed(0)
    config = dict(n_features=10, latent_dim=2, embedding_dim=4, code_dim=8, decoder="categorical")
    integrated = build_model(ModelConfig(**config)).eval()
    with torch.no_grad():
        integrated.missing_model.raw_weight.fill_(math.log(math.expm1(2.0)))
        integrated.missing_model.bias.fill_(-4.0)
    sampled = build_model(ModelConfig(**config, missing_factor="sampled")).eval()
    sampled.load_state_dict(integrated.state_dict())
    rows = np.full((8, 10), np.nan)
    rows[:, :2] = np.random.default_rng(0).integers(1, 4, (8, 2))
    importance = ImportanceConfig(n_samples=4000, seed=0)
    gap = log_likelihood(integrated, rows, importance) - log_likelihood(sampled, rows, importance)
    assert abs(gap.mean()) < 0.8  # measured -0.25 (per row -1.8 to 1.1)
    result = impute(sampled, rows[:2], methods=("mean", "median", "multiple"),
                    config=ImportanceConfig(n_samples=200, n_imputations=20, sampled_imputation="draws", seed=0))
    assert np.isin(result.median, np.arange(1, 6)).all() and np.isin(result.draws, np.arange(1, 6)).all()
    assert ((result.mean >= 1) & (result.mean <= 5)).all()


def _nearly_deterministic_encoder(model, latent_dim: int) -> None:
    """q(z | x_o) with the smallest variance the head allows (sd e^-6), so every sample sits at its mean."""
    with torch.no_grad():
        model.encoder.head.linear.weight[latent_dim:].zero_()
        model.encoder.head.linear.bias[latent_dim:].fill_(-30.0)


@pytest.mark.parametrize("decoder", ["categorical", "gaussian"])
def test_imputation_tilts_by_the_row_offset_of_each_sample(decoder):
    """With a row offset a(z) the posterior of an unrated item is p(x_j | z) Pr(s_j = 0 | x_j, z), whose
    selection logit includes a(z). With z pinned to the encoder mean, the imputed mean, median and draws
    must match that posterior, computed here directly (levels summed, or a fine grid for the Gaussian, which
    the package integrates with 8 Gauss-Hermite points, hence its looser tolerance), and the offset must
    matter: leaving it out moves the expected values by far more than the tolerance."""
    torch.manual_seed(0)
    latent, n_items = 3, 6
    model = build_model(ModelConfig(n_features=n_items, latent_dim=latent, embedding_dim=4, code_dim=8,
                                    decoder=decoder, row_offset=True)).eval()
    _nearly_deterministic_encoder(model, latent)
    with torch.no_grad():
        model.row_offset.weight.copy_(torch.tensor([2.0, -1.5, 1.0]))
        model.missing_model.bias.copy_(torch.linspace(-2.0, 1.0, n_items))
    rng = np.random.default_rng(0)
    rows = rng.integers(1, 6, size=(6, n_items)).astype(float)
    rows[rng.random(rows.shape) < 0.5] = np.nan
    rows[:, 0] = 3.0  # every user has a rating
    # on the CPU, where the direct computation below encodes the same rows
    result = impute(model, rows, methods=("mean", "median", "multiple"),
                    config=ImportanceConfig(n_samples=20, n_imputations=4000, seed=0, device="cpu"))

    batch = as_rows(rows).batch(np.arange(rows.shape[0]))
    with torch.no_grad():
        z = model.encoder(batch)[0][:, None]  # (B, 1, d)
        offset = model.row_offset(z)[:, 0].double().numpy()
        params = [t[:, 0].double().numpy() for t in model.decoder(z)]
    if decoder == "categorical":
        support = np.arange(1.0, 6.0)
        prior = np.exp(params[0] - params[0].max(-1, keepdims=True))  # (B, p, C)
    else:
        support = np.linspace(-4.0, 10.0, 20_001)
        loc, scale = params[0][..., None], params[1][..., None]
        prior = np.exp(-0.5 * ((support - loc) / scale) ** 2)
    slope = model.missing_model.weight.item()
    bias = model.missing_model.bias.detach().double().numpy()[:, None]

    def posterior(row_offset: np.ndarray) -> np.ndarray:
        weight = prior / (1 + np.exp(slope * support + bias + row_offset[:, None, None]))  # Pr(s = 0 | x, z)
        return weight / weight.sum(-1, keepdims=True)

    tilted, untilted = posterior(offset), posterior(np.zeros_like(offset))
    r, c = result.rows, result.cols
    tolerance = 2e-3 if decoder == "categorical" else 1e-2
    expected_mean = (tilted * support).sum(-1)[r, c]
    np.testing.assert_allclose(result.mean, expected_mean, atol=tolerance)
    assert np.abs((untilted * support).sum(-1)[r, c] - expected_mean).max() > 0.1
    expected_median = support[(tilted.cumsum(-1) < 0.5).sum(-1)][r, c]
    np.testing.assert_allclose(result.median, expected_median, atol=0 if decoder == "categorical" else tolerance)
    np.testing.assert_allclose(result.draws.mean(0), expected_mean, atol=0.1)


def test_targets_must_be_integers_and_the_callers_random_state_is_left_alone(ppca):
    """A float index would be truncated (0.9 to row 0) without a word; and imputing with its own seed does not
    move the caller's torch random stream."""
    model, rows, _ = ppca
    with pytest.raises(ValueError, match="rows must be integer indices, got dtype float64"):
        impute(model, rows, np.array([0.9]), np.array([1]), config=ImportanceConfig(n_samples=5))
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    impute(model, rows, config=ImportanceConfig(n_samples=5, seed=0))
    torch.testing.assert_close(torch.rand(3), expected)


def test_no_rows_impute_to_nothing_and_mask_accuracy_checks_the_width():
    """No rows in, no targets out (np.concatenate of nothing had raised); the mask model's accuracy on rows of
    another width is refused (3 of 5 features had been scored, 0.417)."""
    model = build_model(ModelConfig(n_features=N_FEATURES, latent_dim=LATENT, encoder="mlp", encoder_hidden=(8,),
                                    decoder="linear", missing="self-masking"))
    nothing = impute(model, np.zeros((0, N_FEATURES)), config=ImportanceConfig(n_samples=5, device="cpu"))
    assert nothing.rows.size == 0 and nothing.mean.size == 0
    complete = np.random.default_rng(0).standard_normal((4, N_FEATURES))
    assert 0 <= mask_accuracy(model, complete, complete > 0) <= 1
    for width in (3, 6):
        with pytest.raises(ValueError, match=r"rows of the model's 5 features, at least one, "
                                             rf"got shape \(4, {width}\)"):
            mask_accuracy(model, complete[:, :1].repeat(width, 1), np.ones((4, width)))
    with pytest.raises(ValueError, match="at least one"):
        mask_accuracy(model, complete[:0], complete[:0] > 0)
