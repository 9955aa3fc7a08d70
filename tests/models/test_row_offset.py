"""RowOffset: a per-row shift a(z) of every selection logit (users' activity), through every missing-term path."""

import copy

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from mnar_recsys.data.rows import as_rows
from mnar_recsys.models.config import ModelConfig, build_model

N_ROWS, N_ITEMS, LATENT = 7, 9, 3


def ratings(seed: int = 0) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    dense = np.zeros((N_ROWS, N_ITEMS))
    for i in range(N_ROWS):
        items = rng.choice(N_ITEMS, size=1 + i % (N_ITEMS - 1), replace=False)
        dense[i, items] = rng.integers(1, 6, size=items.size)
    return sp.csr_matrix(dense)


def model_pair(decoder: str, missing: str, factor: str, **extra):
    """A model with a row offset of random weight, and the same model without one."""
    torch.manual_seed(0)
    config = ModelConfig(n_features=N_ITEMS, latent_dim=LATENT, decoder=decoder, missing=missing,
                         missing_factor=factor, row_offset=True, **extra)
    model = build_model(config)
    with torch.no_grad():
        model.missing_model.bias.normal_(0.0, 1.0)
        model.row_offset.weight.normal_(0.0, 1.0)
    plain = copy.deepcopy(model)
    plain.row_offset = None
    return model.eval(), plain.eval()


def shifted(plain, offset: float):
    """`plain` with every item bias moved by `offset`: what a row offset of that value must amount to."""
    model = copy.deepcopy(plain)
    with torch.no_grad():
        model.missing_model.bias.add_(offset)
    return model


PATHS = [("gaussian", "itemwise", "integrated"), ("gaussian", "levelwise", "integrated"),
         ("categorical", "itemwise", "integrated"), ("categorical", "levelwise", "integrated"),
         ("gaussian", "itemwise", "sampled"), ("categorical", "levelwise", "sampled")]


@pytest.mark.parametrize("decoder,missing,factor", PATHS)
def test_a_row_offset_is_that_rows_item_biases_shifted(decoder, missing, factor):
    model, plain = model_pair(decoder, missing, factor)
    batch = as_rows(ratings()).batch(np.arange(N_ROWS))
    z = torch.randn(N_ROWS, 1, LATENT)  # K = 1: one offset per row
    params = model.decoder(z)
    offset = model.row_offset(z).detach()
    torch.manual_seed(1)  # the same x_m draws on the sampled path
    log_ps = model.log_ps(batch, params, offset)
    for i in range(N_ROWS):
        torch.manual_seed(1)
        expected = shifted(plain, float(offset[i, 0])).log_ps(batch, params)[i]
        torch.testing.assert_close(log_ps[i], expected, rtol=1e-5, atol=1e-4)
    torch.manual_seed(1)
    assert (plain.log_ps(batch, params) - log_ps).abs().max() > 0.1  # the offset does change it


def test_sample_scores_the_mask_with_the_offset_of_each_z():
    model, plain = model_pair("categorical", "levelwise", "integrated")
    batch = as_rows(ratings()).batch(np.arange(N_ROWS))
    torch.manual_seed(2)
    samples = model.sample(batch, 3)
    expected = plain.log_ps(batch, samples.params, samples.z @ model.row_offset.weight)
    torch.testing.assert_close(samples.terms.log_ps, expected)


@pytest.mark.parametrize("factor", ["integrated", "sampled"])
def test_the_subsampled_missing_term_shifts_the_same_way(factor):
    model, plain = model_pair("gaussian", "levelwise", factor, unobserved_samples=5)
    batch = as_rows(ratings()).batch(np.arange(N_ROWS))
    z = torch.randn(N_ROWS, 1, LATENT)
    offset = model.row_offset(z).detach()
    torch.manual_seed(2)
    _, log_ps = model.subsampled_log_likelihood(batch, z)
    for i in range(N_ROWS):
        torch.manual_seed(2)
        _, expected = shifted(plain, float(offset[i, 0])).subsampled_log_likelihood(batch, z)
        torch.testing.assert_close(log_ps[i], expected[i], rtol=1e-5, atol=1e-4)


def test_the_offset_weight_gets_a_gradient_from_the_bound():
    torch.manual_seed(0)
    model = build_model(ModelConfig(n_features=N_ITEMS, latent_dim=LATENT, row_offset=True))
    assert (model.row_offset.weight == 0).all()  # starts as the model without an offset
    model.bound(as_rows(ratings()).batch(np.arange(N_ROWS)), 3).sum().backward()
    assert model.row_offset.weight.grad.abs().min() > 0


def test_the_mcar_model_takes_no_row_offset():
    with pytest.raises(ValueError, match="MCAR model has none"):
        build_model(ModelConfig(n_features=3, missing="mcar", missing_factor="sampled", row_offset=True))
