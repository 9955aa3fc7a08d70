import numpy as np
import pytest
import torch

from mnar_recsys.denormals import denormals_flushed, flushing
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.training import stacked, trainer
from mnar_recsys.training.trainer import TrainConfig


@pytest.fixture
def not_flushing():
    """A test process may already flush (the command line, run in it, turns flushing on for good)."""
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush denormal floats to zero")
    yield
    torch.set_flush_denormal(False)


def denormal_product() -> float:
    """A product with a denormal operand (the bit pattern 5 is 7e-45) times 2^100."""
    tiny = torch.tensor([5], dtype=torch.int32).view(torch.float32)
    return float(tiny * 2.0 ** 100)


def test_a_flushed_block_reads_denormals_as_zero_and_restores_the_setting(not_flushing):
    assert not flushing() and denormal_product() > 0
    with denormals_flushed():
        assert flushing() and denormal_product() == 0.0
    assert not flushing() and denormal_product() > 0


def test_a_flushed_block_inside_a_flushing_thread_leaves_it_flushing(not_flushing):
    torch.set_flush_denormal(True)
    with denormals_flushed():
        pass
    assert flushing()


@pytest.mark.parametrize("stacking", [False, True])
def test_training_steps_flush_denormals(not_flushing, monkeypatch, stacking):
    """Every step of `fit` and `fit_stacked` runs with denormals flushed; the thread's setting is back after."""
    seen = []
    if stacking:
        step = stacked._StackedModel.step
        monkeypatch.setattr(stacked._StackedModel, "step",
                            lambda self, *args: seen.append(flushing()) or step(self, *args))
    else:
        step = trainer._step
        monkeypatch.setattr(trainer, "_step", lambda *args: seen.append(flushing()) or step(*args))
    rng = np.random.default_rng(0)
    rows = np.where(rng.random((40, 3)) < 0.3, np.nan, rng.normal(size=(40, 3)))
    config = TrainConfig(iterations=3, batch_size=8, n_samples=2, progress=False, validation_fraction=0.0)
    model_config = ModelConfig(n_features=3, latent_dim=2, activation="tanh", encoder="mlp", encoder_hidden=(8,),
                               decoder_hidden=(8,), squash=None, variance="per_row", missing="self-masking")
    models = [build_model(model_config) for _ in range(2)]
    if stacking:
        stacked.fit_stacked(models, rows, [config, TrainConfig(**{**config.to_dict(), "seed": 1})])
    else:
        trainer.fit(models[0], rows, config)
    assert seen == [True] * 3 and not flushing()
