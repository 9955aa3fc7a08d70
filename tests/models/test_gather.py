"""`take`, the gather whose gradient repeats bit for bit with several CPU threads, and training runs
that repeat bit for bit with two threads because the model gathers through it."""

import os

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.models.gather import sum_by_row, take
from mnar_recsys.training.trainer import TrainConfig, fit

needs_two_cores = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPU cores to run two threads")


@pytest.mark.parametrize("source_shape, index", [
    ((7, 3), torch.tensor([4, 0, 4, 6])),  # rows of a matrix, one repeated
    ((7,), torch.tensor([[1, 1], [5, 0], [2, 1]])),  # a vector at a 2-d index
    ((7,), torch.tensor(3)),  # a vector at one index
])
def test_take_is_indexing_in_value_and_gradient(source_shape, index):
    source = torch.randn(source_shape, dtype=torch.float64, requires_grad=True)
    taken, indexed = take(source, index), source[index]
    assert taken.shape == indexed.shape
    torch.testing.assert_close(taken, indexed)
    weights = torch.randn(indexed.shape, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad((taken * weights).sum(), source)[0],
                               torch.autograd.grad((indexed * weights).sum(), source)[0])


@needs_two_cores
def test_take_gradient_repeats_bit_for_bit_with_two_threads(torch_threads):
    """100,000 gathered entries onto 1,000 rows: past the size where indexing's backward adds with atomics."""
    torch_threads(2)
    generator = torch.Generator().manual_seed(0)
    source = torch.randn(1000, 50, generator=generator, requires_grad=True)
    index = torch.randint(0, 1000, (2000,), generator=generator)
    weights = torch.randn(2000, 50, generator=generator)
    gradients = [torch.autograd.grad((take(source, index) * weights).sum(), source)[0] for _ in range(10)]
    assert all(torch.equal(gradients[0], g) for g in gradients[1:])


def ratings(n_rows: int = 300, n_items: int = 400, per_row: int = 20) -> sp.csr_matrix:
    rng = np.random.default_rng(0)
    cols = np.argsort(rng.random((n_rows, n_items)), axis=1)[:, :per_row].ravel()
    rows = np.repeat(np.arange(n_rows), per_row)
    values = rng.integers(1, 6, rows.size).astype(np.float32)
    return sp.csr_matrix((values, (rows, cols)), shape=(n_rows, n_items))


@needs_two_cores
@pytest.mark.parametrize("decoder, row_offset", [("gaussian", False), ("categorical", True)])
def test_training_repeats_bit_for_bit_with_two_threads(torch_threads, decoder, row_offset):
    """The set encoder gathers 2,000 x 50 item codes per batch and the row offset 2,000 x 20 entries:
    with plain indexing two runs of the same seed drifted apart in the last bits."""
    torch_threads(2)
    data = ratings()
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = build_model(ModelConfig(n_features=400, decoder=decoder, row_offset=row_offset))
        fit(model, data, TrainConfig(iterations=3, device="cpu", progress=False))  # drifted within 3
        runs.append(model.state_dict())
    for name, value in runs[0].items():
        assert torch.equal(value, runs[1][name]), name


def test_sum_by_row_adds_each_rows_entries_and_leaves_empty_rows_zero():
    values = torch.arange(12, dtype=torch.float64).reshape(6, 2).requires_grad_()
    rows = torch.tensor([0, 0, 2, 2, 2, 3])
    summed = sum_by_row(values, rows, 5)
    expected = torch.stack([values[rows == r].sum(0) if (rows == r).any() else values.new_zeros(2) for r in range(5)])
    assert torch.equal(summed, expected)
    upstream = torch.randn(5, 2, dtype=torch.float64)
    summed.backward(upstream)
    assert torch.equal(values.grad, upstream[rows])  # each entry receives its row's gradient
