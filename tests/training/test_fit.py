"""Training raises the bound, is reproducible from its seed, and survives a save/load round trip."""

import numpy as np
import pytest
import torch

import mnar_recsys
from mnar_recsys.data.rows import as_rows
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.training import checkpoint, trainer
from mnar_recsys.training.trainer import TrainConfig, TrainingDiverged, fit

CONFIG = ModelConfig(n_features=8, latent_dim=3, embedding_dim=4, code_dim=8, missing="itemwise")
TRAIN = TrainConfig(iterations=100, batch_size=20, n_samples=5, lr=1e-2, seed=3, progress=False, log_every=50,
                    device="cpu")  # bitwise reproducibility is a CPU property


@pytest.fixture(scope="module")
def ratings() -> np.ndarray:
    """60 users x 8 items, ratings 1..5 from a rank-1 model, about half missing."""
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((60, 1)) @ rng.standard_normal((1, 8))
    rows = np.clip(np.round(3 + 1.2 * scores), 1, 5)
    rows[rng.random(rows.shape) < 0.5] = np.nan
    return rows


def mean_bound(model, rows: np.ndarray, seed: int = 0, n_samples: int = 20) -> float:
    torch.manual_seed(seed)
    with torch.no_grad():
        return model.bound(as_rows(rows).batch(np.arange(rows.shape[0])), n_samples).mean().item()


def trained(rows: np.ndarray):
    torch.manual_seed(0)
    model = build_model(CONFIG)
    history = fit(model, rows, TRAIN)
    return model, history


def test_fit_increases_the_bound(ratings):
    """100 Adam steps raise the mean L_20 over all rows by more than 1 nat per row (measured: -20.17 -> -10.25)."""
    torch.manual_seed(0)
    before = mean_bound(build_model(CONFIG), ratings)
    model, history = trained(ratings)
    after = mean_bound(model, ratings)
    print(f"bound per row before {before:.3f}, after {after:.3f}; history {history}")
    assert [i for i, _ in history.bound] == [50, 100]
    assert after > before + 1.0


def test_the_history_is_the_bounds_moving_average_with_decay_098(ratings, monkeypatch):
    """A bound of 1 at the first step and 0 after it leaves 0.98^49 in the average at step 50."""
    # _step returns the sum of the batch's bounds, left on the device: a mean of 1 is the batch's size
    monkeypatch.setattr(trainer, "_step", lambda *args: torch.tensor(float(args[2].size) if args[5] == 1 else 0.0,
                                                                     dtype=torch.float64))
    torch.manual_seed(0)
    history = fit(build_model(CONFIG), ratings, TrainConfig(**{**TRAIN.to_dict(), "iterations": 50}))
    assert history.bound == [(50, pytest.approx(0.98 ** 49))]


def test_training_that_diverges_stops_and_says_so(ratings):
    """A bound that is no longer finite would otherwise be trained on, and the model scored, as if it were a fit."""
    torch.manual_seed(0)
    with pytest.raises(TrainingDiverged, match=r"training diverged at iteration \d+: the batch's mean bound is"):
        fit(build_model(CONFIG), ratings, TrainConfig(**{**TRAIN.to_dict(), "lr": 1e6}))
    with pytest.raises(ValueError, match="lr must be positive and finite, got inf"):
        TrainConfig(lr=float("inf"))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_diverged_step_between_log_points_is_named_by_its_iteration(ratings, monkeypatch, bad):
    """The bounds are read back at log points, not every step: the first non-finite one among them is still
    the iteration the error names, and training stops there rather than at the end."""
    steps = []

    def step(*args):
        steps.append(args[5])
        return torch.tensor(bad if args[5] >= 7 else -1.0, dtype=torch.float64)

    monkeypatch.setattr(trainer, "_step", step)
    torch.manual_seed(0)
    with pytest.raises(TrainingDiverged, match=rf"at iteration 7: the batch's mean bound is {bad}"):
        fit(build_model(CONFIG), ratings, TrainConfig(**{**TRAIN.to_dict(), "iterations": 10_000, "log_every": 50}))
    assert steps == list(range(1, 51))


def test_a_step_broken_by_an_unseen_divergence_is_reported_as_the_divergence(ratings, monkeypatch):
    """A NaN bound still pending when a later step fails (its NaN update having broken the forward pass): the
    error names the diverged iteration, not the later step's error."""
    def step(*args):
        if args[5] == 5:
            raise IndexError("index -9223372036854775808 is out of bounds")  # what NaN logits gave a kernel
        return torch.tensor(float("nan") if args[5] == 3 else -1.0, dtype=torch.float64)

    monkeypatch.setattr(trainer, "_step", step)
    torch.manual_seed(0)
    with pytest.raises(TrainingDiverged, match=r"at iteration 3: the batch's mean bound is nan") as caught:
        fit(build_model(CONFIG), ratings, TrainConfig(**{**TRAIN.to_dict(), "log_every": 50}))
    assert isinstance(caught.value.__context__, IndexError)


def test_a_step_that_fails_after_non_finite_parameters_is_reported_as_a_divergence(ratings, monkeypatch):
    model = build_model(CONFIG)

    def step(*args):
        if args[5] == 2:
            with torch.no_grad():
                model.decoder.mean_head.weight[0, 0] = float("nan")  # a finite bound, then a NaN update
        if args[5] == 3:
            raise ValueError("Expected parameter df ... to satisfy the constraint")
        return torch.tensor(-1.0, dtype=torch.float64)

    monkeypatch.setattr(trainer, "_step", step)
    with pytest.raises(TrainingDiverged, match=r"diverged before iteration 3: decoder.mean_head.weight holds 1"):
        fit(model, ratings, TrainConfig(**{**TRAIN.to_dict(), "log_every": 50}))


def test_an_error_in_a_healthy_step_is_raised_as_it_is(ratings, monkeypatch):
    def step(*args):
        if args[5] == 4:
            raise RuntimeError("out of memory")
        return torch.tensor(-1.0, dtype=torch.float64)

    monkeypatch.setattr(trainer, "_step", step)
    with pytest.raises(RuntimeError, match="out of memory"):
        fit(build_model(CONFIG), ratings, TrainConfig(**{**TRAIN.to_dict(), "log_every": 50}))


def test_fit_is_reproducible_from_its_seed(ratings):
    """Two runs from the same initial seed and TrainConfig.seed end with identical parameters; another
    training seed does not."""
    first, _ = trained(ratings)
    second, _ = trained(ratings)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name
    torch.manual_seed(0)
    other = build_model(CONFIG)
    fit(other, ratings, TrainConfig(**{**TRAIN.to_dict(), "seed": 4}))
    assert not torch.equal(other.decoder.mean_head.weight, first.decoder.mean_head.weight)


def test_checkpoint_round_trip_gives_identical_bounds(ratings, tmp_path):
    """save then load (state dict read with weights_only=True) rebuilds the model: same parameters, same config,
    the extra metadata, and the same bound under the same seed."""
    model, _ = trained(ratings)
    checkpoint.save(model, CONFIG, tmp_path / "model", extra={"train": TRAIN.to_dict()})
    loaded, config, meta = checkpoint.load(tmp_path / "model")
    assert config == CONFIG
    assert meta.pop("provenance")["package_version"] == mnar_recsys.__version__  # which version saved it
    assert meta == {"train": TRAIN.to_dict()}
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    assert mean_bound(loaded, ratings, seed=5) == mean_bound(model, ratings, seed=5)


def test_validation_keeps_the_parameters_with_the_best_held_out_bound(ratings, monkeypatch):
    """With rows held out, fit checks their bound every `validation_every` steps and ends with the
    parameters of the best check: told that the first check was the best, it returns the parameters of
    a run stopped there."""
    config = TrainConfig(iterations=120, batch_size=TRAIN.batch_size, n_samples=TRAIN.n_samples, seed=0,
                         progress=False, validation_fraction=0.25, validation_every=40,
                         device="cpu")  # bitwise equality below: GPU scatter-adds are not deterministic
    torch.manual_seed(0)
    honest = fit(build_model(CONFIG), ratings, config)
    assert [i for i, _ in honest.validation] == [40, 80, 120]
    assert honest.best_iteration == max(honest.validation, key=lambda entry: entry[1])[0]

    held_out = {40: -1.0, 80: -5.0, 120: -3.0}
    real_bound = trainer._mean_bound
    # the real bound still runs (it draws from the seeded streams); its value is replaced, by iteration
    monkeypatch.setattr(trainer, "_mean_bound", lambda *args: real_bound(*args) * 0 + held_out[args[-1]])
    torch.manual_seed(0)
    model = build_model(CONFIG)
    history = fit(model, ratings, config)
    assert history.validation == [(40, -1.0), (80, -5.0), (120, -3.0)] and history.best_iteration == 40
    torch.manual_seed(0)
    stopped = build_model(CONFIG)
    fit(stopped, ratings, TrainConfig(**{**config.to_dict(), "iterations": 40}))
    for (name, a), b in zip(model.state_dict().items(), stopped.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="validation_fraction"):
        TrainConfig(validation_fraction=1.0)


def test_the_held_out_rows_do_not_shape_the_fit(ratings):
    """The held-out rows only pick which parameters are kept: the missing model starts from the training rows'
    observed fractions and mean. Checked at the end only, the held-out rows' data cannot change the fit; they
    did while the start was taken over all rows (a bias moved by 0.24 in the trainer's audit)."""
    config = TrainConfig(iterations=30, batch_size=20, n_samples=5, lr=1e-2, seed=3, progress=False,
                         validation_fraction=0.25, validation_every=1000, device="cpu")
    _, training, validation = trainer._split_rows(build_model(CONFIG), ratings, config, 1)
    assert np.intersect1d(training, validation).size == 0 and validation.size == 15
    flipped = ratings.copy()
    held = flipped[validation]
    flipped[validation] = np.where(np.isnan(held), 3.0, np.nan)  # the held-out rows' observed entries swapped
    models = []
    for rows in (ratings, flipped):
        torch.manual_seed(0)
        models.append(build_model(CONFIG))
        fit(models[-1], rows, config)
    for (name, first), second in zip(models[0].state_dict().items(), models[1].state_dict().values()):
        assert torch.equal(first, second), name


def test_observed_summary_reads_the_chosen_rows_a_few_at_a_time(ratings, monkeypatch):
    monkeypatch.setattr("mnar_recsys.data.rows.SUMMARY_ROWS", 7)  # several reads
    index = np.array([0, 5, 6, 7, 30, 31, 32, 33, 59, 12, 40])
    fraction, mean = as_rows(ratings).observed_summary(index)
    np.testing.assert_allclose(fraction, (~np.isnan(ratings[index])).mean(0))
    assert mean == pytest.approx(np.nanmean(ratings[index]), rel=1e-12)
    assert as_rows(np.full((2, 8), np.nan)).observed_summary(np.arange(2))[1] == 0.0
