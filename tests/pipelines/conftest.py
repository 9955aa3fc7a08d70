"""Small simulated ratings shared by the estimator tests; torch on one thread (the tests share a busy
machine, where extra threads only wait on each other)."""

import pytest
import torch

from mnar_recsys.data import SimulatorConfig, simulate_ratings


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def small_ratings():
    return simulate_ratings(SimulatorConfig(n_users=300, n_items=60, n_test_users=100, seed=0))
