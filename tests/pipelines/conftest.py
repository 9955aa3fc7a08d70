"""One torch thread: these small models run fastest single-threaded, above all on a shared machine."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _single_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
