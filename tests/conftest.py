"""Torch on one thread for every test: the models here are small, and on a shared 2-core machine extra
threads only wait on each other."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
