"""Fixed missing processes: a user's logit function is scored as the equivalent built-in one, and stays fixed."""

import numpy as np
import pytest
import torch
from torch import nn

from mnar_recsys.data.rows import as_rows
from mnar_recsys.models import missing
from mnar_recsys.models.config import ModelConfig, build_model


@pytest.mark.parametrize("missing_factor", ["sampled", "integrated"])
def test_a_fixed_function_gives_the_bound_of_the_same_fixed_logistic(missing_factor):
    """FixedFunction(x -> -5 (x - 0.5)) and FixedLogistic(-5, 0.5) give one bound for the same samples and
    parameters: by the decoder's generic quadrature nodes and by the affine fast path when integrated."""
    rows = np.random.default_rng(0).random((6, 4)).astype(np.float32)
    rows[rows > 0.7] = np.nan
    batch = as_rows(rows).batch(np.arange(6))
    bounds = []
    fixed = (missing.FixedLogistic(-5.0, 0.5), missing.FixedFunction(lambda x: -5.0 * (x - 0.5)))
    for missing_model in fixed:
        torch.manual_seed(0)
        model = build_model(ModelConfig(n_features=4, latent_dim=2, encoder="mlp", encoder_hidden=(8,),
                                        decoder="gaussian", decoder_hidden=(8,), squash=None,
                                        missing="fixed-logistic", missing_factor=missing_factor))
        model.missing_model = missing_model
        torch.manual_seed(1)
        bounds.append(model.bound(batch, 5))
    torch.testing.assert_close(bounds[1], bounds[0], rtol=1e-5, atol=1e-4)


def test_a_fixed_function_refuses_a_module():
    with pytest.raises(TypeError, match="plain function"):
        missing.FixedFunction(nn.Linear(1, 1))


def test_self_masking_known_needs_a_direction():
    """The known sign is the model's one piece of prior knowledge: None (no sign) is refused, not read as -1."""
    with pytest.raises(ValueError, match="missing_sign -1"):
        ModelConfig(n_features=3, missing="self-masking-known", missing_sign=None)
    for sign in (-1, 1):
        model = build_model(ModelConfig(n_features=3, missing="self-masking-known", missing_sign=sign))
        slope, _ = model.missing_model.feature_affine(torch.arange(3))
        assert (torch.sign(slope) == sign).all()
