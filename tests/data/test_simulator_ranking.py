"""Under the logistic selection the methods rank, by MCAR MSE, as the not-MIWAE paper found on Yahoo! R3:
not-MIWAE (Gaussian) < MF-IPS < MF, PMF, AutoRec < MIWAE (Gaussian), PMF's lead on the MIWAE too thin to assert."""

from __future__ import annotations

import pytest

from baselines.registry import make_baseline
from mnar_recsys.data import SimulatorConfig, simulate_ratings
from mnar_recsys.estimators.recommender import make_recommender
from mnar_recsys.evaluation.protocol import fit_and_score, mcar_split
from mnar_recsys.inference.importance import ImportanceConfig
from mnar_recsys.training.trainer import TrainConfig

USERS, ITEMS = 2_000, 500


def mcar_mse(data_seed: int) -> dict[str, float]:
    """MCAR MSE of each model as `mnar-recsys ratings --selection logistic --users 2000 --items 500
    --iterations 2000 --lr 3e-3 --seeds 0 --data-seed D` scores it (K_pred 1,000, 10% of users held out)."""
    data = simulate_ratings(SimulatorConfig(n_users=USERS, n_items=ITEMS, n_test_users=USERS * 5_400 // 15_400,
                                            selection="logistic", seed=data_seed))
    split = mcar_split(data, seed=0)
    train = TrainConfig(iterations=2_000, lr=3e-3, progress=False, validation_fraction=0.1)
    models = {name: make_recommender(name, seed=0, rating_scale=data.rating_scale, train=train,
                                     importance=ImportanceConfig(n_samples=1_000, progress=False))
              for name in ("notmiwae-gaussian", "miwae-gaussian")}
    models.update({name: make_baseline(name, seed=0, rating_scale=data.rating_scale)
                   for name in ("mf-ips", "mf", "pmf", "autorec")})
    return {name: fit_and_score(model, split, uses_mcar_sample=name == "mf-ips")[0]["mse"]
            for name, model in models.items()}


@pytest.mark.slow
def test_logistic_selection_ranks_the_methods_as_on_yahoo():
    """Measured MCAR MSE, data seeds 0 / 1 / 2 (model seed 0), by the bare `mnar-recsys ratings --data-seed D`:
    not-MIWAE Gaussian 0.742 / 0.734 / 0.721, MF-IPS 0.798 / 0.845 / 0.814, AutoRec 1.267 / 1.425 / 1.181, MF
    1.480 / 1.598 / 1.383, PMF 1.569 / 1.686 / 1.439, MIWAE Gaussian 1.570 / 1.688 / 1.456, oracle 0.474 / 0.460 /
    0.470. PMF lies below the MIWAE on each, as on Yahoo! R3, but by 0.001 to 0.017 only (without its biases it
    lay 0.03 to 0.09 above), too little to assert; it is left out of the last comparison."""
    mse = mcar_mse(data_seed=0)
    assert mse["notmiwae-gaussian"] < mse["mf-ips"] - 0.03
    for name in ("mf", "pmf", "autorec"):
        assert mse["mf-ips"] < mse[name] - 0.3, name
    for name in ("mf", "autorec"):
        assert mse[name] < mse["miwae-gaussian"] - 0.04, name
