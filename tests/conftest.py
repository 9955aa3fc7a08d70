"""Torch on one thread for every test: the models here are small, and on a shared 2-core machine extra
threads only wait on each other."""

import math

import pytest
import torch

from mnar_recsys.models.config import ModelConfig, build_model


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def torch_threads():
    """`torch_threads(n)` runs the rest of the test on n torch threads; the count before comes back after it."""
    previous = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def ppca_model():
    """A PPCA-like MIWAE (linear decoder, one noise variance σ² = 0.3, MCAR) over 5 features with a 2-d latent
    and fixed random W, b: log p(x_o) and p(x_m | x_o) are known in closed form.

    The encoder is an untrained MLP: the bound holds for any q, and a poor q makes the gap to
    log p(x_o) large at K = 1, so its shrinking with K is visible.
    """
    torch.manual_seed(0)
    config = ModelConfig(n_features=5, latent_dim=2, activation="tanh", encoder="mlp", encoder_hidden=(16,),
                         decoder="linear", missing="mcar", missing_factor="sampled")
    model = build_model(config)
    with torch.no_grad():
        model.decoder.mean_head.weight.normal_(0.0, 1.0)
        model.decoder.mean_head.bias.normal_(0.0, 0.5)
        model.decoder.raw_var.fill_(math.log(math.expm1(0.3 - config.min_variance)))
    return model.eval()
