"""Models with known answers for the model tests."""

import math

import numpy as np
import pytest
import torch

from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.models.notmiwae import NotMIWAE

PPCA_FEATURES, PPCA_LATENT, PPCA_VARIANCE = 5, 2, 0.3


def linear_gaussian_parameters(model: NotMIWAE) -> tuple[np.ndarray, np.ndarray, float]:
    """(W (p, d), b (p,), σ²) of a linear isotropic decoder in float64: x = W z + b + N(0, σ² I),
    σ² = softplus(raw_var) + min_variance."""
    decoder = model.decoder
    variance = torch.nn.functional.softplus(decoder.raw_var.detach().double()) + decoder.min_variance
    return (decoder.mean_head.weight.detach().double().numpy(), decoder.mean_head.bias.detach().double().numpy(),
            float(variance))


@pytest.fixture
def ppca_model() -> NotMIWAE:
    """The PPCA-like MIWAE (linear decoder, one noise variance, MCAR) with fixed random W, b and σ² = 0.3.

    The encoder is an untrained MLP: the bound holds for any q, and a poor q makes the gap to
    log p(x_o) large at K = 1, so its shrinking with K is visible.
    """
    torch.manual_seed(0)
    config = ModelConfig(n_features=PPCA_FEATURES, latent_dim=PPCA_LATENT, activation="tanh", encoder="mlp",
                         encoder_hidden=(16,), decoder="linear", missing="mcar", missing_factor="sampled")
    model = build_model(config)
    with torch.no_grad():
        model.decoder.mean_head.weight.normal_(0.0, 1.0)
        model.decoder.mean_head.bias.normal_(0.0, 0.5)
        model.decoder.raw_var.fill_(math.log(math.expm1(PPCA_VARIANCE - config.min_variance)))
    return model.eval()
