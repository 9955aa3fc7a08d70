"""Decoder parameters at chosen entries: `forward_entries` (from z) and `at_entries` (from the forward
pass's output) equal gathering from the full forward pass."""

import pytest
import torch
from torch import nn

from mnar_recsys.models import decoders

LATENT, FEATURES, ROWS, SAMPLES = 3, 64, 5, 4


def _decoders() -> dict[str, decoders.ObservationModel]:
    return {
        "gaussian-shared-squashed": decoders.GaussianDecoder(LATENT, FEATURES, (8,), nn.ReLU, squash=(1.0, 5.0)),
        "gaussian-per-row": decoders.GaussianDecoder(LATENT, FEATURES, (8, 6), nn.Tanh, variance="per_row"),
        "gaussian-isotropic-no-trunk": decoders.GaussianDecoder(LATENT, FEATURES, (), variance="isotropic"),
        "linear": decoders.linear_gaussian_decoder(LATENT, FEATURES),
        "categorical": decoders.CategoricalDecoder(LATENT, FEATURES, (1, 5)),
        "categorical-hidden": decoders.CategoricalDecoder(LATENT, FEATURES, (0, 2), hidden=(8,)),
        "bernoulli": decoders.BernoulliDecoder(LATENT, FEATURES, (8,)),
        "student-t": decoders.StudentTDecoder(LATENT, FEATURES, (8,)),
        "conv-gaussian (default gather)": decoders.GaussianDecoder(
            LATENT, FEATURES, squash=(0.0, 1.0), mean_net=decoders.ConvMeanNet(LATENT, FEATURES, (8, 4))),
    }


@pytest.mark.parametrize("method", ["forward_entries", "at_entries"])
@pytest.mark.parametrize("name", list(_decoders()))
def test_parameters_at_entries_equal_the_gather_from_forward(name, method):
    """Values and gradients (to z and every decoder parameter) agree to float32 rounding, for entries in
    no particular row order, with repeated entries and with a row that has none."""
    torch.manual_seed(0)
    decoder = _decoders()[name]
    with torch.no_grad():
        for parameter in decoder.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))  # spread variances and dfs away from their init
    z = torch.randn(ROWS, SAMPLES, LATENT, requires_grad=True)
    rows = torch.tensor([3, 0, 3, 1, 0, 3, 3, 1, 0, 4])  # row 2 has no entries
    cols = torch.tensor([7, 0, 63, 5, 5, 7, 1, 62, 33, 12])
    full = tuple(t[rows, :, cols] for t in decoder(z))
    if method == "forward_entries":
        entries = decoder.forward_entries(z, rows, cols)
    else:
        entries = decoder.at_entries(decoder(z), rows, cols)
    assert len(entries) == len(full)
    for got, expected in zip(entries, full):
        assert got.shape == expected.shape == (rows.numel(), SAMPLES, *expected.shape[2:])
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    weights = [torch.randn_like(t) for t in full]
    inputs = [z, *decoder.parameters()]
    expected_grads = torch.autograd.grad(sum((w * t).sum() for w, t in zip(weights, full)), inputs,
                                         allow_unused=True, materialize_grads=True)
    got_grads = torch.autograd.grad(sum((w * t).sum() for w, t in zip(weights, entries)), inputs,
                                    allow_unused=True, materialize_grads=True)
    for got, expected in zip(got_grads, expected_grads):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_forward_entries_with_no_entries():
    decoder = decoders.GaussianDecoder(LATENT, FEATURES, (8,))
    loc, scale = decoder.forward_entries(torch.randn(ROWS, SAMPLES, LATENT), torch.zeros(0, dtype=torch.long),
                                         torch.zeros(0, dtype=torch.long))
    assert loc.shape == scale.shape == (0, SAMPLES)
