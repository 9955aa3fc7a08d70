"""Checkpoints are verified on load: the digest of the weights is required, and non-finite weights are refused,
at load and at the end of the fit that would have made them."""

import json

import numpy as np
import pytest
import torch

from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.training import checkpoint, trainer
from mnar_recsys.training.trainer import TrainConfig, TrainingDiverged, fit

CONFIG = ModelConfig(n_features=6, latent_dim=2, embedding_dim=3, code_dim=4)


def rows() -> np.ndarray:
    rng = np.random.default_rng(0)
    values = rng.integers(1, 6, (30, 6)).astype(np.float64)
    values[rng.random(values.shape) < 0.4] = np.nan
    values[:, 0] = 3.0
    return values


def saved(tmp_path, poison: bool = False):
    torch.manual_seed(0)
    model = build_model(CONFIG)
    if poison:
        with torch.no_grad():
            next(model.decoder.parameters()).view(-1)[0] = float("nan")
    return checkpoint.save(model, CONFIG, tmp_path / "model")


def test_a_config_without_the_digest_is_refused(tmp_path):
    directory = saved(tmp_path)
    checkpoint.load(directory)
    config = directory / "config.json"
    meta = json.loads(config.read_text())
    for digests in (None, {}, {"state.pt": 7}):  # the key deleted, emptied, or not a digest
        config.write_text(json.dumps({**meta, "sha256": digests} if digests is not None else
                                     {k: v for k, v in meta.items() if k != "sha256"}))
        with pytest.raises(ValueError, match=r"a 'sha256' object holding the digest of state\.pt"):
            checkpoint.load(directory)


def test_non_finite_weights_are_refused_on_load(tmp_path):
    directory = saved(tmp_path, poison=True)
    with pytest.raises(ValueError, match=r"state\.pt: decoder\.\S+ holds 1 non-finite values; the model it holds "
                                         r"diverged"):
        checkpoint.load(directory)


def test_a_fit_whose_last_update_makes_weights_non_finite_fails(monkeypatch):
    """The bound is checked before each update: the update after the last check is checked when fit ends."""

    class Poisoning(torch.optim.Adam):
        def step(self, closure=None):
            result = super().step(closure)
            with torch.no_grad():
                self.param_groups[0]["params"][0].view(-1)[0] = float("inf")
            return result

    monkeypatch.setattr(trainer.torch.optim, "Adam", Poisoning)
    torch.manual_seed(0)
    model = build_model(CONFIG)
    with pytest.raises(TrainingDiverged, match=r"after 1 iterations encoder\.\S+ holds 1 non-finite values"):
        fit(model, rows(), TrainConfig(iterations=1, batch_size=10, n_samples=2, device="cpu", progress=False))
