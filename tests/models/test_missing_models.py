"""Every learnt missing model: started at each feature's observed fraction, and usable in float64."""

import numpy as np
import pytest
import torch

from mnar_recsys.data.rows import as_rows
from mnar_recsys.models.config import ModelConfig, build_model

LEARNT = ("self-masking", "self-masking-known", "itemwise", "levelwise", "agnostic", "nonlinear")


def config(missing: str, n_features: int) -> ModelConfig:
    factor = "sampled" if missing in ("agnostic", "nonlinear") else "integrated"  # these couple the features
    return ModelConfig(n_features=n_features, latent_dim=2, missing=missing, missing_factor=factor)


# the self-masking model of unknown sign keeps the paper's random start (Glorot-uniform weights and thresholds)
@pytest.mark.parametrize("missing", [m for m in LEARNT if m != "self-masking"])
def test_initialise_gives_each_features_observed_fraction_at_a_row_of_centre_values(missing):
    """The nonlinear model once set its last bias alone and missed (0.23 for 0.10): its hidden layers add to it."""
    torch.manual_seed(0)
    model = build_model(config(missing, 6))
    fraction = np.array([0.02, 0.05, 0.1, 0.3, 0.5, 0.9])
    model.missing_model.initialise(fraction, center=2.5)
    with torch.no_grad():
        logits = model.missing_model.logits(torch.full((1, 6), 2.5))[0]
    np.testing.assert_allclose(torch.sigmoid(logits).numpy(), fraction, rtol=1e-4)


@pytest.mark.parametrize("missing", LEARNT)
def test_a_float64_model_computes_its_bound_from_float32_rows(missing):
    """Batches hold float32 values; the level-wise model's interpolation refused to mix them with float64."""
    torch.manual_seed(0)
    model = build_model(config(missing, 4)).double()
    rows = np.array([[1.0, np.nan, 3.0, 5.0], [2.0, 4.0, np.nan, np.nan]])
    bound = model.bound(as_rows(rows).batch(np.arange(2)), 3)
    assert bound.dtype == torch.float64 and torch.isfinite(bound).all()
