"""The data of a `ratings` run: Coat's or Yahoo! R3's files, or the simulator drawn from the run's settings,
kept for the process's next run on the same data (a worker's next task)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baselines.registry import SPECS
from mnar_recsys.data import (
    RatingsData,
    SimulatorConfig,
    load_coat,
    load_coat_propensities,
    load_yahoo_r3,
    simulate_ratings,
)

if TYPE_CHECKING:
    from mnar_recsys.pipelines.ratings_config import RatingsRun

_LOADED: dict[tuple, RatingsData] = {}  # the last data set this process loaded, by its settings


def load_data(run: RatingsRun) -> RatingsData:
    """The run's data set; the simulator is drawn once (data_seed), the model seeds vary on top of it.
    Kept for the process's next call with the same data settings (a worker's next task)."""
    key = (run.data, run.data_dir, run.users, run.items, run.test_users, run.data_seed, run.selection)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = _read_data(run)
    return _LOADED[key]


def _read_data(run: RatingsRun) -> RatingsData:
    if run.data == "coat":
        return load_coat(run.data_dir)
    if run.data == "yahoo":
        return load_yahoo_r3(run.data_dir)
    return simulate_ratings(simulator_config(run))


def simulator_config(run: RatingsRun) -> SimulatorConfig:
    """The simulator's settings for --data synthetic; the options that fail its checks are named."""
    try:
        return SimulatorConfig(n_users=run.users, n_items=run.items, n_test_users=simulated_test_users(run),
                               selection=run.selection, seed=run.data_seed)
    except ValueError as error:
        raise ValueError(f"--users {run.users} --items {run.items}: the simulator refuses them ({error})") from None


def simulated_test_users(run: RatingsRun) -> int:
    """--test-users, by default Yahoo! R3's share of users with MCAR ratings (5,400 of 15,400)."""
    return run.test_users if run.test_users is not None else max(1, run.users * 5_400 // 15_400)


def given_propensities(name: str, run: RatingsRun) -> dict[str, Any]:
    """The keywords that hand a model reading given propensities Coat's own; none for other models."""
    return {"propensities": load_coat_propensities(run.data_dir)} if SPECS[name].given_propensities else {}
