"""Gradients of log p(s | x_o, x_m) reach the missing model and, through x_m, the decoder."""

import numpy as np
import pytest
import torch

from mnar_recsys.data.rows import as_rows
from mnar_recsys.models.config import ModelConfig, build_model


@pytest.mark.parametrize("factor", ["sampled", "integrated"])
@pytest.mark.parametrize("decoder", ["gaussian", "categorical"])
def test_log_ps_alone_has_gradients_for_decoder_and_missing_model(decoder, factor):
    """Backpropagating log_ps alone gives a nonzero gradient to every decoder parameter (through the
    reparameterised Gaussian x_m, the Gumbel-Softmax relaxed categorical x_m, or the quadrature over x_m)
    and to every missing-model parameter."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(n_features=6, latent_dim=3, encoder="mlp", encoder_hidden=(8,),
                                    decoder=decoder, decoder_hidden=(8,), missing="self-masking",
                                    missing_factor=factor))
    with torch.no_grad():
        model.missing_model.weight.normal_(0.0, 1.0)
        model.missing_model.offset.normal_(0.0, 1.0)
    rng = np.random.default_rng(0)
    rows = rng.integers(1, 6, size=(4, 6)).astype(float)
    rows[rng.random(rows.shape) < 0.5] = np.nan
    batch = as_rows(rows).batch(np.arange(4))
    params = model.decoder(torch.randn(4, 5, 3))
    model.log_ps(batch, params).sum().backward()
    for part in (model.decoder, model.missing_model):
        for name, parameter in part.named_parameters():
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, f"no gradient reaches {name}"
