"""Small simulated ratings shared by the estimator tests."""

import pytest

from mnar_recsys.data import SimulatorConfig, simulate_ratings


@pytest.fixture(scope="session")
def small_ratings():
    return simulate_ratings(SimulatorConfig(n_users=300, n_items=60, n_test_users=100, seed=0))
