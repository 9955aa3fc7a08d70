"""The integrated missing factor: log Pr(s_j = 0 | z) = log E_{p(x_j|z)}[sigmoid(-logit_j(x_j))]."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.special import ndtri

from mnar_recsys.data.rows import as_rows
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.models.integrated import categorical, gaussian_affine
from mnar_recsys.models.integrated.base import gauss_hermite
from mnar_recsys.models.integrated.categorical import (
    log_expected_sigmoid_categorical,
    masked_log_expected_sigmoid_categorical_sum,
)
from mnar_recsys.models.integrated.gaussian_affine import (
    log_expected_sigmoid,
    log_expected_sigmoid_composed,
    masked_log_expected_sigmoid_sum,
)


def self_masking_model(decoder: str, n_features: int = 6, slopes: tuple[float, float] = (-1.5, 1.5),
                       quadrature_points: int = 8):
    """A random model with a self-masking missing model whose slopes span `slopes` and random thresholds."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(n_features=n_features, latent_dim=3, encoder="mlp", encoder_hidden=(8,),
                                    decoder=decoder, decoder_hidden=(8,), squash=None, missing="self-masking",
                                    missing_factor="integrated", quadrature_points=quadrature_points))
    with torch.no_grad():
        model.missing_model.weight.copy_(torch.linspace(*slopes, n_features))
        model.missing_model.offset.normal_(0.0, 1.0)
    return model


def test_categorical_integrated_factor_is_the_exact_sum_over_levels():
    """For the categorical decoder, log_ps with the integrated factor equals, entry by entry in float64,
    Σ_observed log sigmoid(logit_j(x_j)) + Σ_missing log Σ_c π_jc sigmoid(-logit_j(c))."""
    model = self_masking_model("categorical")
    rng = np.random.default_rng(0)
    rows = rng.integers(1, 6, size=(4, 6)).astype(float)
    rows[rng.random(rows.shape) < 0.5] = np.nan
    batch = as_rows(rows).batch(np.arange(4))
    with torch.no_grad():
        params = model.decoder(torch.randn(4, 3, 3))
        integrated = model.log_ps(batch, params).double().numpy()
    probs = F.softmax(params[0].double(), dim=-1).numpy()  # (B, K, p, levels)
    weight, bias = (t.detach().double().numpy() for t in model.missing_model.feature_affine(torch.arange(6)))
    expected = np.zeros(integrated.shape)
    for b, row in enumerate(rows):
        for j, value in enumerate(row):
            if np.isnan(value):
                missing = sum(probs[b, :, j, c] / (1 + math.exp(weight[j] * level + bias[j]))
                              for c, level in enumerate(range(1, 6)))
                expected[b] += np.log(missing)
            else:
                expected[b] -= math.log1p(math.exp(-(weight[j] * value + bias[j])))
    np.testing.assert_allclose(integrated, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("sd_shape", [(1, 1, 4), (5, 3, 4)])  # shared per feature (factored e^m e^{sd t}); per entry
@pytest.mark.parametrize("block_entries", [7, 2 ** 18])
def test_gaussian_kernel_in_row_blocks_is_the_plain_node_sum_in_value_and_gradient(monkeypatch, block_entries,
                                                                                    sd_shape, compiled):
    """The Gauss-Hermite loop runs over blocks of rows (to stay in cache); with one row per block or one
    block in all, with sd per feature or per entry, compiled or eager, it gives log Σ_h ω_h σ(-(m + sd t_h))
    and its autograd gradient, in float64."""
    monkeypatch.setattr(gaussian_affine, "_BLOCK_ENTRIES", block_entries)
    if not compiled:
        monkeypatch.setattr(gaussian_affine._compiled_node_sums, "eager", True)
    generator = torch.Generator().manual_seed(0)
    mean = torch.randn(5, 3, 4, generator=generator, dtype=torch.float64).requires_grad_()
    sd = (0.2 + torch.rand(sd_shape, generator=generator, dtype=torch.float64)).requires_grad_()
    nodes, weights = (torch.tensor(v, dtype=torch.float64) for v in gauss_hermite(8))
    reference = torch.logsumexp(weights.log() + F.logsigmoid(-(mean[..., None] + sd[..., None] * nodes)), -1)
    kernel = log_expected_sigmoid(mean, sd)
    torch.testing.assert_close(kernel, reference)
    for a, b in zip(torch.autograd.grad(kernel.sum(), (mean, sd)), torch.autograd.grad(reference.sum(), (mean, sd))):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("compiled", [True, False])
def test_the_composed_quadrature_is_the_plain_node_sum_in_value_and_gradient(compiled):
    """The stacked step's quadrature (a sum of elementwise terms, for torch.compile to fuse), compiled or not,
    gives log Σ_h ω_h σ(-(m + sd t_h)) and its gradient, in float64, with sd broadcast per feature."""
    generator = torch.Generator().manual_seed(1)
    mean = torch.randn(5, 3, 4, generator=generator, dtype=torch.float64).requires_grad_()
    sd = (0.2 + torch.rand(1, 1, 4, generator=generator, dtype=torch.float64)).requires_grad_()
    nodes, weights = gauss_hermite(8)
    t, w = torch.tensor(nodes, dtype=torch.float64), torch.tensor(weights, dtype=torch.float64)
    reference = torch.logsumexp(w.log() + F.logsigmoid(-(mean[..., None] + sd[..., None] * t)), -1)
    composed = torch.compile(log_expected_sigmoid_composed) if compiled else log_expected_sigmoid_composed
    value = composed(mean, sd, nodes, weights)
    torch.testing.assert_close(value, reference)
    for a, b in zip(torch.autograd.grad(value.sum(), (mean, sd)), torch.autograd.grad(reference.sum(), (mean, sd))):
        torch.testing.assert_close(a, b)


def test_gaussian_kernel_is_finite_where_factored_exponentials_would_overflow():
    """Where e^m underflows to 0 and e^{sd t} overflows to inf in float32 (m = -110, sd t up to 124) their
    product would be NaN: the kernel must fall back to one sigmoid per node there and still match float64."""
    mean = torch.tensor([[-110.0, -5.0, 0.0, 30.0]]).repeat(3, 1).requires_grad_()
    sd = torch.tensor([30.0, 1.0, 0.5, 2.0], requires_grad=True)
    nodes, weights = (torch.tensor(v, dtype=torch.float64) for v in gauss_hermite(8))
    mean64, sd64 = mean.detach().double().requires_grad_(), sd.detach().double().requires_grad_()
    reference = torch.logsumexp(weights.log() + F.logsigmoid(-(mean64[..., None] + sd64[..., None] * nodes)), -1)
    kernel = log_expected_sigmoid(mean, sd)
    torch.testing.assert_close(kernel, reference.float())
    for a, b in zip(torch.autograd.grad(kernel.sum(), (mean, sd)),
                    torch.autograd.grad(reference.sum(), (mean64, sd64))):
        torch.testing.assert_close(a, b.float())


@pytest.mark.parametrize("slope_shape, sd_shape, offset_shape, loc_scale, fused", [
    ((), (6,), None, 1.0, True),  # the item-wise model: one slope, an sd per item
    ((1,), (6,), None, 1.0, True),  # one slope held as a vector
    ((6,), (6,), (4, 3, 1), 1.0, True),  # self-masking, with a row offset
    ((6,), (1,), None, 1.0, True),  # the PPCA-like decoder's one variance
    ((), (), (4, 3, 1), 1.0, True),  # one slope, one sd
    ((), (4, 3, 6), None, 1.0, False),  # per-row variances
    ((6,), (6,), None, 300.0, False),  # |slope x loc| beyond the range of e^m in float64
])
def test_masked_missing_term_is_the_masked_sum_of_the_kernel_in_value_and_gradient(slope_shape, sd_shape,
                                                                                    offset_shape, loc_scale, fused):
    """The missing term equals Σ_j keep_j log_expected_sigmoid(slope loc + intercept + offset, sd), in value
    (with and without gradients) and in the gradient of every input, in float64, by the fused kernel where
    it applies and by that composition where it does not."""
    generator = torch.Generator().manual_seed(3)

    def tensor(shape, low=-1.0, high=1.0):
        return (low + (high - low) * torch.rand(shape, generator=generator, dtype=torch.float64)).requires_grad_()

    loc = tensor((4, 3, 6), -loc_scale, loc_scale)
    slope, intercept, sd = tensor(slope_shape, -2, 2), tensor((6,), -2, 2), tensor(sd_shape, 0.2, 1.5)
    offset = None if offset_shape is None else tensor(offset_shape)
    keep = (torch.rand(4, 1, 6, generator=generator) > 0.3).double()
    inputs = [t for t in (loc, slope, intercept, sd, offset) if t is not None]
    upstream = torch.randn(4, 3, generator=generator, dtype=torch.float64)

    mean = slope * loc + intercept
    expected = (keep * log_expected_sigmoid(mean if offset is None else mean + offset, sd)).sum(-1)
    _assert_term_matches(lambda: masked_log_expected_sigmoid_sum(loc, slope, intercept, sd, keep, offset),
                         expected, inputs, upstream, "_PrecomputedGradientBackward" if fused else None)


def _assert_term_matches(term, expected: torch.Tensor, inputs: list[torch.Tensor], upstream: torch.Tensor,
                         fused_backward: str | None) -> None:
    """term() equals `expected` in value, with and without gradients, and in the gradient of every input,
    and went through the fused kernel (its backward named `fused_backward`) or, given None, did not."""
    value = term()
    assert type(value.grad_fn).__name__ == fused_backward or (
        fused_backward is None and "Precomputed" not in type(value.grad_fn).__name__)
    torch.testing.assert_close(value, expected)
    for a, b in zip(torch.autograd.grad((value * upstream).sum(), inputs),
                    torch.autograd.grad((expected * upstream).sum(), inputs)):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        torch.testing.assert_close(term(), expected.detach())


def _masked_sum(mean: torch.Tensor, sd: torch.Tensor) -> torch.Tensor:
    keep = (torch.arange(mean.shape[-1]) % 2).to(mean.dtype)
    return masked_log_expected_sigmoid_sum(mean, torch.tensor(0.7, dtype=mean.dtype), -sd, sd, keep)


def _masked_level_sum(mean: torch.Tensor, sd: torch.Tensor) -> torch.Tensor:
    keep = (torch.arange(mean.shape[-1]) % 2).to(mean.dtype)
    return masked_log_expected_sigmoid_categorical_sum(torch.stack([mean, -mean, 2 * mean], -1),
                                                       torch.stack([sd, -sd, 3 * sd], -1), keep)


@pytest.mark.parametrize("kernel, module, compiled", [(log_expected_sigmoid, gaussian_affine, "_compiled_node_sums"),
                                                      (_masked_sum, gaussian_affine, "_compiled_masked_sums"),
                                                      (_masked_level_sum, categorical, "_compiled_level_sums")])
def test_compiled_kernels_run_eagerly_with_a_warning_once_compiling_fails(monkeypatch, kernel, module, compiled):
    """Without a working C++ compiler what torch.compile returns raises BackendCompilerFailed when called: the
    kernel warns once, gives the same values from the eager loop, and does not try to compile again."""
    calls = []

    def failing(*args, **constants):
        calls.append(args)
        raise torch._dynamo.exc.BackendCompilerFailed(failing, RuntimeError("no working C++ compiler"), None)

    mean, sd = torch.randn(6, 3, 4, dtype=torch.float64), 0.2 + torch.rand(4, dtype=torch.float64)
    expected = kernel(mean, sd)
    monkeypatch.setattr(getattr(module, compiled), "compiled", failing)
    monkeypatch.setattr(getattr(module, compiled), "eager", False)  # restored afterwards: later tests compile
    with pytest.warns(RuntimeWarning, match="could not build _fused.*runs eagerly"):
        first = kernel(mean, sd)
    second = kernel(mean, sd)
    assert len(calls) == 1
    torch.testing.assert_close(first, expected)
    torch.testing.assert_close(second, expected)


def test_the_command_line_starts_without_loading_torch_compile():
    """Importing torch.compile's machinery takes seconds, so the command line (whose parser imports every
    pipeline, and so the models) leaves it unloaded: a kernel is compiled at its first call."""
    script = ("import sys; from mnar_recsys.cli import build_parser; "
              "from mnar_recsys.models.integrated import gaussian_affine; build_parser(); "
              "print('torch._dynamo' in sys.modules, gaussian_affine._compiled_node_sums.compiled)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "None"]


@pytest.mark.parametrize("shapes", [
    ((2, 3, 4, 5), (4, 5), (2, 3, 1)),  # every item of a batch, with a row offset per (row, sample)
    ((2, 3, 4, 5), (4, 5), None),  # no row offset
    ((6, 3, 5), (6, 1, 5), (6, 3)),  # drawn entries (the subsampled term), offset per entry and sample
])
def test_categorical_kernel_is_the_softmax_weighted_sum_in_value_and_gradient(shapes):
    """The looped categorical kernel equals log Σ_c softmax(l)_c σ(-(s_c + a)) written with logsumexp, and
    its hand-written gradient passes gradcheck in float64, for the shapes the model feeds it."""
    logits_shape, selection_shape, offset_shape = shapes
    generator = torch.Generator().manual_seed(0)
    logits = (2 * torch.randn(logits_shape, generator=generator, dtype=torch.float64)).requires_grad_()
    selection = (3 * torch.randn(selection_shape, generator=generator, dtype=torch.float64)).requires_grad_()
    offset = None if offset_shape is None else torch.randn(offset_shape, generator=generator,
                                                           dtype=torch.float64).requires_grad_()
    shifted = selection if offset is None else selection + offset[..., None]
    reference = torch.logsumexp(F.log_softmax(logits, -1) + F.logsigmoid(-shifted), -1)
    torch.testing.assert_close(log_expected_sigmoid_categorical(logits, selection, offset), reference)
    inputs = (logits, selection) + (() if offset is None else (offset,))
    assert torch.autograd.gradcheck(lambda *a: log_expected_sigmoid_categorical(*a), inputs)


@pytest.mark.parametrize("offset_shape, level_major, scale, fused", [
    ((4, 3, 1), True, 3.0, True),  # the decoder's level-major logits, with a row offset per (row, sample)
    (None, False, 3.0, True),  # feature-major logits, no offset
    (None, True, 30.0, True),  # missing probabilities down to 1e-13, which 1 - Pr(observed) would lose
    ((4, 1, 1), True, 3.0, False),  # an offset shared by the samples: the composition
])
def test_masked_categorical_missing_term_is_the_masked_sum_of_the_kernel_in_value_and_gradient(
        offset_shape, level_major, scale, fused):
    """The categorical missing term equals Σ_j keep_j log_expected_sigmoid_categorical(l_j, s_j, offset), in
    value (with and without gradients) and in the gradient of every input, in float64, by the fused kernel
    where it applies and by that composition where it does not."""
    generator = torch.Generator().manual_seed(4)

    def tensor(shape, spread=1.0):
        return spread * torch.randn(shape, generator=generator, dtype=torch.float64)

    logits = (tensor((4, 3, 5, 6), 2).transpose(-1, -2) if level_major else tensor((4, 3, 6, 5), 2)).requires_grad_()
    selection = (scale + tensor((6, 5), 3)).requires_grad_()
    offset = None if offset_shape is None else tensor(offset_shape).requires_grad_()
    keep = (torch.rand(4, 1, 6, generator=generator) > 0.3).double()
    inputs = [t for t in (logits, selection, offset) if t is not None]
    upstream = tensor((4, 3))

    expected = (keep * log_expected_sigmoid_categorical(logits, selection, offset)).sum(-1)
    _assert_term_matches(lambda: masked_log_expected_sigmoid_categorical_sum(logits, selection, keep, offset),
                         expected, inputs, upstream, "_PrecomputedLevelGradientBackward" if fused else None)


def test_categorical_decoder_lays_its_logits_out_level_major():
    """Each level's logits lie contiguous over the features, as the fused missing term reads them fastest."""
    decoder = build_model(ModelConfig(n_features=7, decoder="categorical")).decoder
    logits = decoder(torch.randn(2, 3, decoder.logit_head.in_features))[0]
    assert logits.shape == (2, 3, 7, 5)
    assert logits.transpose(-1, -2).is_contiguous()


def test_categorical_kernel_refuses_level_logits_smaller_than_the_selection():
    with pytest.raises(ValueError, match="full shape"):
        log_expected_sigmoid_categorical(torch.zeros(4, 5), torch.zeros(4, 5), torch.zeros(3, 1))


def test_categorical_kernel_keeps_precision_when_almost_every_level_is_observed():
    """With selection logits near +30 a missing entry has probability ~1e-13: the kernel must not lose it
    to cancellation (it sums Pr(missing) directly rather than 1 - Pr(observed))."""
    logits = torch.zeros(1, 5, dtype=torch.float32)
    selection = torch.full((1, 5), 30.0)
    value = log_expected_sigmoid_categorical(logits, selection)
    assert abs(value.item() - (-30.0)) < 1e-4


def quadrature_and_monte_carlo(model) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's integrated log Pr(s = 0 | z) at random z, and a stratified Monte-Carlo estimate of it
    (50,000 draws of x per entry)."""
    with torch.no_grad():
        params = model.decoder(torch.randn(2, 3, model.latent_dim, generator=torch.Generator().manual_seed(2)))
        quadrature = model.log_prob_missing(params).double()
    loc, scale = (t.detach().double() for t in params)
    n_draws = 50_000
    strata = (np.arange(n_draws) + np.random.default_rng(1).random(n_draws)) / n_draws
    eps = torch.from_numpy(ndtri(strata))[:, None, None, None]
    x = loc + scale * eps
    slope, intercept = (t.detach().double() for t in model.missing_model.feature_affine(torch.arange(x.shape[-1])))
    logits = slope * x + intercept
    return quadrature, torch.sigmoid(-logits).mean(0).log()


def test_gaussian_quadrature_matches_monte_carlo():
    """Gauss-Hermite (8 nodes) gives log E[sigmoid(-logit(x))], x ~ N(loc, scale²), to 1e-3 of a stratified
    Monte-Carlo estimate (50,000 draws per entry), for slopes·scale up to 1.5.

    The accuracy depends on how steep the logistic is relative to the Gaussian: measured against adaptive
    quadrature, 8 nodes are off by up to 8e-6 at slope·scale = 1, 3e-3 at 2, 3e-2 at 3, 0.1 at 4, 0.65 at 10.
    """
    model = self_masking_model("gaussian")
    assert model.decoder(torch.randn(2, 3, 3))[1].max() < 1.01
    quadrature, monte_carlo = quadrature_and_monte_carlo(model)
    print(f"largest |quadrature - Monte Carlo|: {(quadrature - monte_carlo).abs().max().item():.1e}")
    torch.testing.assert_close(quadrature, monte_carlo, rtol=0, atol=1e-3)


def test_more_quadrature_points_integrate_a_steep_missing_model_for_the_ppca_like_decoder():
    """`quadrature_points` reaches the linear (PPCA-like) decoder too: at slope·scale up to 4, where 8
    nodes miss the Monte-Carlo value by more than 1e-3, 64 nodes come within 1e-3 of it."""
    errors = {}
    for points in (8, 64):
        model = self_masking_model("linear", slopes=(-4.0, 4.0), quadrature_points=points)
        quadrature, monte_carlo = quadrature_and_monte_carlo(model)
        errors[points] = (quadrature - monte_carlo).abs().max().item()
    assert errors[8] > 1e-3 > errors[64]


def test_integrated_bound_is_tighter_and_its_weights_less_noisy():
    """With the same z draws, the integrated bound's mean over draws is ≥ the sampled bound's (it replaces
    each w_k by its expectation over x_m), and its log-weights vary less, so the ESS is higher.

    Random model: set encoder with q = prior, squashed Gaussian decoder, item-wise missing model with
    shared weight 1, 40 items, about 75% missing, K = 20, 100 repetitions of 10 rows. Measured: mean bound
    per row sampled -52.92 vs integrated -51.49; ESS 2.38 vs 4.84 of 20; log-weight variance 18.1 vs 8.1.
    """
    torch.manual_seed(0)
    n_features, n_rows, repeats, k = 40, 10, 100, 20
    model = build_model(ModelConfig(n_features=n_features, latent_dim=5, embedding_dim=8, code_dim=16))
    rng = np.random.default_rng(0)
    rows = rng.integers(1, 6, size=(n_rows, n_features)).astype(float)
    rows[rng.random(rows.shape) < 0.75] = np.nan
    source = as_rows(rows)
    model.missing_model.initialise(source.observed_summary(np.arange(n_rows))[0], float(np.nanmean(rows)))
    with torch.no_grad():
        model.missing_model.raw_weight.fill_(math.log(math.expm1(1.0)))
        model.encoder.head.linear.weight.zero_()
        model.encoder.head.linear.bias.zero_()
    batch = as_rows(np.tile(rows, (repeats, 1))).batch(np.arange(repeats * n_rows))
    stats = {}
    for factor in ("sampled", "integrated"):
        model.missing_factor = factor
        torch.manual_seed(1)
        with torch.no_grad():
            log_w = model.sample(batch, k).terms.log_weights.double()
        bound = (torch.logsumexp(log_w, 1) - math.log(k)).reshape(repeats, n_rows).sum(1)
        ess = 1 / (torch.softmax(log_w, 1) ** 2).sum(1)
        stats[factor] = bound, ess.mean().item(), log_w.var(1).mean().item()
        print(f"{factor}: bound per row {bound.mean().item() / n_rows:.3f}, ESS {stats[factor][1]:.2f} of {k}, "
              f"log-weight variance {stats[factor][2]:.3f}")
    gain = stats["integrated"][0] - stats["sampled"][0]
    assert gain.mean() > -3 * gain.std() / math.sqrt(repeats)
    assert stats["integrated"][1] > stats["sampled"][1]
    assert stats["integrated"][2] < stats["sampled"][2]


def test_integrating_is_refused_for_a_decoder_without_quadrature_nodes():
    """The Student-t decoder has no nodes: asking it to integrate x_m out fails when the model is built, not at
    its first training step; the MIWAE, which has no missing factor, and sampling x_m are fine."""
    with pytest.raises(ValueError, match="StudentTDecoder has no quadrature nodes"):
        build_model(ModelConfig(n_features=5, decoder="student-t", missing="self-masking"))
    build_model(ModelConfig(n_features=5, decoder="student-t", missing="mcar"))
    build_model(ModelConfig(n_features=5, decoder="student-t", missing="self-masking", missing_factor="sampled"))


def test_the_gaussian_kernel_takes_a_scalar_and_an_empty_tensor():
    """A 0-d mean is one block, not a slice of a leading axis it does not have; an empty one stays empty."""
    scalar = torch.tensor(0.3, requires_grad=True)
    value = log_expected_sigmoid(scalar, torch.tensor(1.0))
    value.backward()
    one = torch.tensor([0.3], requires_grad=True)
    log_expected_sigmoid(one, torch.tensor([1.0])).sum().backward()
    assert value.shape == () and torch.allclose(value, log_expected_sigmoid(one, torch.tensor([1.0]))[0])
    assert torch.allclose(scalar.grad, one.grad[0])
    assert log_expected_sigmoid(torch.zeros(0, 3), torch.ones(3)).shape == (0, 3)


def test_gaussian_kernel_skips_the_derivatives_under_no_grad(monkeypatch):
    """Imputation runs under torch.no_grad with parameters that require grad, and autograd.Function still
    reports needs_input_grad there: the kernel must ask for no derivatives, and give the same values."""
    asked = []

    def spy(*tensors, _kernel=gaussian_affine._compiled_node_sums, **constants):
        asked.append(constants["needs_grad"])
        return _kernel(*tensors, **constants)

    monkeypatch.setattr(gaussian_affine, "_compiled_node_sums", spy)
    generator = torch.Generator().manual_seed(0)
    mean = torch.randn(5, 3, 4, generator=generator, requires_grad=True)
    sd = (0.2 + torch.rand(4, generator=generator)).requires_grad_()
    with torch.no_grad():
        value = log_expected_sigmoid(mean, sd)
    assert asked == [False]
    torch.testing.assert_close(value, log_expected_sigmoid(mean, sd).detach())
    assert asked == [False, True]
