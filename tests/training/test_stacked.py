"""A stacked fit of R runs gives each run its single fit's parameters and history, and refuses what it cannot stack."""

import numpy as np
import pytest
import torch

from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.training import stacked as stacked_module
from mnar_recsys.training.seeds import seeded
from mnar_recsys.training.stacked import UnsupportedStack, fit_stacked, unsupported_reason
from mnar_recsys.training.trainer import TrainConfig, TrainingDiverged, fit

SEEDS = (3, 11)
# after 300 Adam steps the stacked and single fits differ by rounding alone: measured at most 3e-5 on
# parameters of size ~1 (batched products and tanh as 2 sigmoid(2x) - 1 round differently)
TOLERANCE = {"atol": 2e-4, "rtol": 2e-4}


def uci_config(decoder: str = "gaussian", missing: str = "self-masking-known", hidden: int = 32,
               **changes) -> ModelConfig:
    """The UCI imputer's architecture (`NotMIWAEImputer.model_config`), narrower to keep the test short."""
    linear = decoder == "linear"
    settings = dict(n_features=4, latent_dim=3, activation="tanh", encoder="mlp", encoder_hidden=(hidden, hidden),
                    decoder=decoder, decoder_hidden=() if linear else (hidden, hidden), squash=None,
                    variance="isotropic" if linear else "per_row", missing=missing, missing_sign=-1,
                    missing_factor="integrated", init="glorot")
    return ModelConfig(**{**settings, **changes})


def train_config(seed: int, **changes) -> TrainConfig:
    return TrainConfig(**{**dict(iterations=300, batch_size=16, n_samples=10, seed=seed, device="cpu",
                                 progress=False, log_every=100, validation_every=50), **changes})


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    """200 rows of 4 correlated features, the first two self-masked above 0.3 (the UCI protocol's shape)."""
    rng = np.random.default_rng(0)
    data = rng.standard_normal((200, 2)) @ rng.standard_normal((2, 4)) + 0.3 * rng.standard_normal((200, 4))
    data[:, :2][data[:, :2] > 0.3] = np.nan
    return data


def models(config: ModelConfig, seeds=SEEDS) -> list:
    """One freshly initialised model per seed, each as `NotMIWAEImputer` seeds it."""
    built = []
    for seed in seeds:
        with seeded(seed, torch.device("cpu")):
            built.append(build_model(config))
    return built


def assert_same_fit(single, stacked) -> None:
    for one, other in zip(single, stacked):
        for (name, a), b in zip(one.named_parameters(), other.parameters()):
            torch.testing.assert_close(b, a, **TOLERANCE, msg=lambda text: f"{name}: {text}")


@pytest.mark.parametrize("decoder, missing", [("gaussian", "mcar"), ("gaussian", "self-masking-known"),
                                              ("gaussian", "self-masking"), ("gaussian", "agnostic")])
@pytest.mark.parametrize("validation_fraction", [0.0, 0.2])
def test_each_stacked_run_is_its_single_fit(rows, decoder, missing, validation_fraction):
    configs = [train_config(seed, validation_fraction=validation_fraction) for seed in SEEDS]
    factor = "sampled" if missing == "agnostic" else "integrated"  # the agnostic model's x_m is drawn
    single = models(uci_config(decoder, missing, missing_factor=factor))
    single_histories = [fit(model, rows, config) for model, config in zip(single, configs)]
    stacked = models(uci_config(decoder, missing, missing_factor=factor))
    histories = fit_stacked(stacked, rows, configs)
    assert_same_fit(single, stacked)
    for one, other in zip(single_histories, histories):
        assert [i for i, _ in other.bound] == [i for i, _ in one.bound] == [100, 200, 300]
        assert [v for _, v in other.bound] == pytest.approx([v for _, v in one.bound], abs=1e-3)
        assert [v for _, v in other.validation] == pytest.approx([v for _, v in one.validation], abs=1e-3)
        assert other.best_iteration == one.best_iteration
    if validation_fraction:  # the held-out choice has teeth: the runs keep different iterations' parameters
        assert all(h.best_iteration is not None for h in histories)
    assert all(not model.training for model in stacked)


@pytest.mark.parametrize("missing", [pytest.param("mcar", marks=pytest.mark.slow), "self-masking",
                                     pytest.param("agnostic", marks=pytest.mark.slow)])
def test_the_compiled_stacked_step_gives_each_run_its_single_fit(rows, monkeypatch, missing):
    """Where a job compiles (long fits; forced here), the stacked step (gradient and Adam's update) runs as one
    compiled graph, with tanh as a rational function: the same fits, to rounding."""
    configs = [train_config(seed) for seed in SEEDS]
    factor = "sampled" if missing == "agnostic" else "integrated"
    single = models(uci_config("gaussian", missing, missing_factor=factor))
    for model, config in zip(single, configs):
        fit(model, rows, config)
    stacked = models(uci_config("gaussian", missing, missing_factor=factor))
    monkeypatch.setenv("MNAR_RECSYS_COMPILE", "1")
    eager_steps = []
    eager = stacked_module._train_step
    monkeypatch.setattr(stacked_module, "_train_step",
                        lambda *args, **kwargs: eager_steps.append(1) or eager(*args, **kwargs))
    fit_stacked(stacked, rows, configs)
    assert stacked_module._compiled_step.compiled is not None and not stacked_module._compiled_step.eager
    assert not eager_steps  # every step ran the compiled graph
    assert_same_fit(single, stacked)


@pytest.mark.slow  # two compiled graphs to build
def test_compiled_steps_of_two_architectures_in_one_process_keep_to_their_own_graphs(rows, monkeypatch):
    """After its first step a fit skips dynamo's checks but those that tell compiled graphs apart: fits of two
    architectures, one after the other and back, each still run their own graph and give their single fits."""
    monkeypatch.setenv("MNAR_RECSYS_COMPILE", "1")
    configs = [train_config(seed, iterations=100) for seed in SEEDS]
    for missing in ("self-masking", "mcar", "self-masking"):
        single = models(uci_config("gaussian", missing))
        for model, config in zip(single, configs):
            fit(model, rows, config)
        stacked = models(uci_config("gaussian", missing))
        fit_stacked(stacked, rows, configs)
        assert_same_fit(single, stacked)


@pytest.mark.slow  # the shared variance's compiled quadrature kernel takes a while to build
def test_the_ppca_like_decoder_stacks_too(rows):
    configs = [train_config(seed) for seed in SEEDS]
    single = models(uci_config("linear", "self-masking"))
    for model, config in zip(single, configs):
        fit(model, rows, config)
    stacked = models(uci_config("linear", "self-masking"))
    fit_stacked(stacked, rows, configs)
    assert_same_fit(single, stacked)


def test_shards_are_seeded_as_a_single_fit_seeds_them(rows):
    configs = [train_config(seed, iterations=100, shards=2) for seed in SEEDS]
    single = models(uci_config())
    for model, config in zip(single, configs):
        fit(model, rows, config)
    stacked = models(uci_config())
    fit_stacked(stacked, rows, configs)
    assert_same_fit(single, stacked)


def test_runs_with_their_seeds_swapped_are_not_their_single_fits(rows):
    """The comparison above has teeth: the same initial models trained on each other's batch order and noise."""
    configs = [train_config(seed, iterations=100) for seed in SEEDS]
    single = models(uci_config())
    for model, config in zip(single, configs):
        fit(model, rows, config)
    stacked = models(uci_config())
    fit_stacked(stacked, rows, configs[::-1])
    with pytest.raises(AssertionError):
        assert_same_fit(single, stacked)


@pytest.mark.parametrize("changes, reason", [
    ({"missing": "nonlinear", "missing_factor": "sampled"}, "the missing model is Nonlinear"),
    ({"missing_factor": "sampled"}, "x_m is sampled"),
    ({"encoder": "set"}, "the encoder is a SetEncoder"),
    ({"decoder": "bernoulli"}, "the decoder is a BernoulliDecoder"),
    ({"row_offset": True}, "row offset"),
    ({"missing": "fixed-logistic"}, "FixedLogistic is fixed"),
])
def test_unsupported_models_are_refused_saying_why(rows, changes, reason):
    model = models(uci_config(**changes), seeds=(0,))[0]
    assert reason in unsupported_reason(model)
    with pytest.raises(UnsupportedStack, match=f"no stacked fit for this model: .*{reason}"):
        fit_stacked([model], rows, [train_config(0)])


def test_models_of_different_shapes_or_configs_that_differ_beyond_the_seed_are_refused(rows):
    narrow, wide = models(uci_config(hidden=16), seeds=(0,))[0], models(uci_config(hidden=32), seeds=(1,))[0]
    with pytest.raises(UnsupportedStack, match="model 1 differs from model 0 in its architecture or parameter shapes"):
        fit_stacked([narrow, wide], rows, [train_config(0), train_config(1)])
    pair = models(uci_config())
    with pytest.raises(UnsupportedStack, match=r"differ in lr \(0\.001, 0\.01\); only seed, log_every, progress"):
        fit_stacked(pair, rows, [train_config(0), train_config(1, lr=1e-2)])
    with pytest.raises(UnsupportedStack, match="as many configs as models"):
        fit_stacked(pair, rows, [train_config(0)])
    with pytest.raises(ValueError, match="the model has 4 features but the rows have 3"):
        fit_stacked(pair, rows[:, :3], [train_config(0), train_config(1)])


def test_a_run_that_diverges_stops_the_stacked_fit_naming_it(rows):
    """Values of 1e20 square past float32's range: the bound is -inf at the first step, as in a single fit."""
    with pytest.raises(TrainingDiverged, match=r"training diverged at iteration 1: run 0 \(seed 3\) has the batch"):
        fit_stacked(models(uci_config()), rows * 1e20, [train_config(seed) for seed in SEEDS])
