"""Several starts or runs of the imputer trained as one stacked fit: each the fit it would have had alone."""

import numpy as np
import pytest
import torch

from mnar_recsys.estimators import imputer as imputer_module
from mnar_recsys.estimators.imputer import NotMIWAEImputer, fit_imputers


@pytest.fixture(scope="module")
def table():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 4)) @ rng.normal(size=(4, 4))
    X[X > 0.8] = np.nan  # high values go missing
    return X


def _imputer(seed: int, **settings) -> NotMIWAEImputer:
    options = dict(iterations=60, batch_size=16, n_samples=5, hidden=16, importance_samples=20, progress=False,
                   missing="self-masking-known", missing_sign=-1)
    options.update(settings)
    return NotMIWAEImputer(random_state=seed, **options)


def _parameters(imputer: NotMIWAEImputer) -> list[torch.Tensor]:
    return [p.detach() for p in imputer.model_.parameters()]


def test_runs_that_differ_in_their_seed_train_stacked_each_as_alone(table, monkeypatch):
    calls = []
    stacked = imputer_module.fit_stacked

    def spy(models, data, configs):
        calls.append(len(models))
        return stacked(models, data, configs)

    monkeypatch.setattr(imputer_module, "fit_stacked", spy)
    together = fit_imputers([_imputer(seed) for seed in (0, 1, 2)], table)
    assert calls == [3]
    monkeypatch.setattr(imputer_module, "fit_stacked", stacked)
    for seed, fitted in zip((0, 1, 2), together):
        alone = _imputer(seed).fit(table)
        assert fitted.seed_ == alone.seed_
        for ours, theirs in zip(_parameters(fitted), _parameters(alone)):
            torch.testing.assert_close(ours, theirs, rtol=2e-4, atol=2e-4)
        np.testing.assert_allclose(fitted.transform(table), alone.transform(table), rtol=1e-3, atol=1e-3)
    assert not torch.allclose(_parameters(together[0])[0], _parameters(together[1])[0])


def test_starts_of_one_imputer_train_stacked_and_keep_the_same_best(table, monkeypatch):
    calls = []
    stacked = imputer_module.fit_stacked
    monkeypatch.setattr(imputer_module, "fit_stacked", lambda *args: calls.append(1) or stacked(*args))
    fast = _imputer(3, n_init=3).fit(table)
    assert calls == [1]
    monkeypatch.setattr(imputer_module, "stackable", lambda models, configs: False)
    slow = _imputer(3, n_init=3).fit(table)
    assert len(calls) == 1  # the second fit ran its starts one by one
    np.testing.assert_allclose(fast.init_scores_, slow.init_scores_, rtol=1e-4)
    assert fast.seed_ == slow.seed_


def test_imputers_that_differ_in_more_than_their_seed_fit_one_by_one(table, monkeypatch):
    monkeypatch.setattr(imputer_module, "fit_stacked", lambda *args: pytest.fail("nothing to stack"))
    first, second = fit_imputers([_imputer(0), _imputer(1, lr=1e-2)], table)
    assert first.lr == 1e-3 and second.lr == 1e-2 and hasattr(first, "model_") and hasattr(second, "model_")


def test_the_agnostic_models_starts_train_stacked_too_with_x_m_drawn_as_alone(table, monkeypatch):
    calls = []
    stacked = imputer_module.fit_stacked
    monkeypatch.setattr(imputer_module, "fit_stacked", lambda *args: calls.append(1) or stacked(*args))
    fast = _imputer(5, n_init=2, missing="agnostic").fit(table)
    monkeypatch.setattr(imputer_module, "stackable", lambda models, configs: False)
    slow = _imputer(5, n_init=2, missing="agnostic").fit(table)
    assert calls == [1] and fast.model_.missing_factor == "sampled"
    np.testing.assert_allclose(fast.init_scores_, slow.init_scores_, rtol=1e-4)
    for ours, theirs in zip(_parameters(fast), _parameters(slow)):
        torch.testing.assert_close(ours, theirs, rtol=2e-4, atol=2e-4)


def test_a_start_that_diverges_in_the_stacked_fit_sends_all_of_them_one_by_one(table, monkeypatch):
    def diverging(*args):
        raise imputer_module.TrainingDiverged("training diverged at iteration 7 of run 1")

    monkeypatch.setattr(imputer_module, "fit_stacked", diverging)
    fitted = _imputer(4, n_init=2).fit(table)
    monkeypatch.setattr(imputer_module, "stackable", lambda models, configs: False)
    alone = _imputer(4, n_init=2).fit(table)
    np.testing.assert_allclose(fitted.init_scores_, alone.init_scores_, rtol=1e-6)
    for ours, theirs in zip(_parameters(fitted), _parameters(alone)):
        torch.testing.assert_close(ours, theirs)


def test_a_failed_fit_together_leaves_every_imputers_last_fit_whole(table, monkeypatch):
    first, second = fit_imputers([_imputer(0), _imputer(1)], table)
    before = [(imputer.model_, imputer.n_features_in_) for imputer in (first, second)]

    def diverging(*args):
        raise imputer_module.TrainingDiverged("training diverged at iteration 2")

    monkeypatch.setattr(imputer_module, "fit_stacked", diverging)
    monkeypatch.setattr(imputer_module, "fit", diverging)
    with pytest.raises(imputer_module.TrainingDiverged):
        fit_imputers([first, second], table[:, :3])
    assert [(imputer.model_, imputer.n_features_in_) for imputer in (first, second)] == before
