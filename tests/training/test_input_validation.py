"""Bad input is refused with a ValueError that names the problem; a row with nothing observed is valid."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from mnar_recsys.data.rows import as_rows
from mnar_recsys.inference.importance import ImportanceConfig
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.training.trainer import TrainConfig, fit

QUICK = TrainConfig(iterations=1, batch_size=2, n_samples=2, progress=False)


@pytest.fixture
def model():
    """The default (Yahoo!-style) model over 4 items: set encoder, Gaussian decoder squashed to [1, 5]."""
    torch.manual_seed(0)
    return build_model(ModelConfig(n_features=4, latent_dim=2, embedding_dim=3, code_dim=5))


def csr(data, indices, indptr, n_features: int = 4) -> sp.csr_matrix:
    """A CSR matrix taken as given: duplicates and explicit zeros are kept."""
    return sp.csr_matrix((np.asarray(data, dtype=float), np.asarray(indices), np.asarray(indptr)),
                         shape=(len(indptr) - 1, n_features))


@pytest.mark.parametrize("data, message", [
    (csr([1.0, np.nan, 3.0], [0, 1, 2], [0, 2, 3]), "must be finite.*row 0, column 1"),
    (np.array([[1.0, np.inf, np.nan, 2.0], [3.0, np.nan, 4.0, 5.0]]), "must be finite.*row 0, column 1"),
    (np.array([[1.0, 2.0, np.nan, 2.0], [3.0, np.nan, 4.0, -np.inf]]), "must be finite.*row 1, column 3"),
    (csr([1.0, 0.0, 3.0], [0, 1, 2], [0, 2, 3]), "explicit zero at \\(row 0, column 1\\)"),
    (csr([1.0, 2.0, 3.0], [2, 2, 0], [0, 2, 3]), "duplicate entries.*row 0, column 2"),
    # scipy's conversion of a COO matrix to CSR would add the two ratings of (1, 3) up into a 7
    (sp.coo_matrix(([3.0, 4.0, 5.0], ([1, 1, 0], [3, 3, 0])), shape=(2, 4)), "duplicate entries.*row 1, column 3"),
    (np.array([["1", "x", "2", "3"]], dtype=object), "must be numbers.*\\(row 0, column 1\\) is 'x'"),
    (np.array([[1.0, 2.0, 1e39, 3.0]]), "\\(row 0, column 2\\) is 1e\\+39, beyond float32's range"),
    (np.array([[1.0, 6.0, np.nan, 2.0]]), "squashed to \\[1.0, 5.0\\].*outside"),
    (np.array([[1.0, 2.0, 3.0], [2.0, 3.0, 4.0]]), "model has 4 features but the rows have 3"),
])
def test_fit_refuses_bad_rows_naming_the_problem(model, data, message):
    """NaN / inf among observed values, explicit zeros or duplicates in a sparse matrix, entries that are not
    numbers or overflow float32, values outside the squashed decoder's range and a feature count other than
    the model's."""
    with pytest.raises(ValueError, match=message):
        fit(model, data, QUICK)


def test_bound_refuses_fewer_than_one_sample(model):
    batch = as_rows(np.array([[1.0, np.nan, 3.0, 4.0]])).batch(np.arange(1))
    with pytest.raises(ValueError, match="K must be at least 1, got 0"):
        model.bound(batch, 0)


def test_bound_refuses_rows_with_another_number_of_features(model):
    """The bound itself checks the feature count: with the set encoder and MCAR, 3-feature rows would otherwise
    give a 4-feature model a bound without complaint."""
    torch.manual_seed(0)
    miwae = build_model(ModelConfig(n_features=4, latent_dim=2, embedding_dim=3, code_dim=5, missing="mcar"))
    batch = as_rows(np.array([[1.0, 2.0, np.nan]])).batch(np.arange(1))
    for candidate in (model, miwae):
        with pytest.raises(ValueError, match="model has 4 features but the batch has 3"):
            candidate.bound(batch, 3)


@pytest.mark.parametrize("field", ["batch_size", "iterations", "n_samples"])
@pytest.mark.parametrize("value", [0, 20.0, True])
def test_train_config_refuses_counts_that_are_not_positive_integers(field, value):
    """20.0 would pass a range check and fail inside torch's sampling as a bare TypeError."""
    with pytest.raises(ValueError, match=f"{field} must be a positive integer, got {value!r}"):
        TrainConfig(**{field: value})


def test_importance_config_refuses_counts_that_are_not_positive_integers():
    """Checked when the imputer is built, not after a whole training run."""
    for field in ("n_samples", "row_chunk", "chunk_entries", "n_imputations"):
        with pytest.raises(ValueError, match=f"{field} must be a positive integer, got 20.0"):
            ImportanceConfig(**{field: 20.0})
    assert ImportanceConfig(n_samples=np.int64(20)).n_samples == 20
    with pytest.raises(ValueError, match="row_chunk must be a positive integer, got None"):
        ImportanceConfig(row_chunk=None)
    assert ImportanceConfig(chunk_entries=None).chunk_entries is None  # the device's default


@pytest.mark.parametrize("fields, message", [
    ({"decoder": "categorical", "levels": (1.0, 5.0)}, r"levels must be two integers lo < hi.*\(1\.0, 5\.0\)"),
    ({"levels": (5, 1)}, "levels must be two integers lo < hi"),
    ({"decoder": "categorical", "temperature": 0.0}, "temperature must be positive and finite, got 0.0"),
    ({"decoder": "categorical", "temperature": -0.5}, "temperature must be positive and finite, got -0.5"),
    ({"min_variance": -1.0}, "min_variance must be positive and finite, got -1.0"),
    ({"quadrature_points": 0}, "quadrature_points must be a positive integer, got 0"),
    ({"unobserved_samples": 2.0}, "unobserved_samples must be a positive integer, got 2.0"),
    ({"decoder": "categorical", "temperature": "0.5"}, "temperature must be positive and finite, got '0.5'"),
    ({"levels": None}, "levels must be two integers lo < hi"),
])
def test_model_config_refuses_settings_that_fail_later_or_train_wrongly(fields, message):
    """A negative temperature had trained without complaint; a zero one or a negative variance floor had
    surfaced as TrainingDiverged, pointing at the learning rate."""
    with pytest.raises(ValueError, match=message):
        ModelConfig(n_features=4, **fields)


@pytest.mark.parametrize("empty_row", [
    np.array([[np.nan] * 4, [1.0, 2.0, np.nan, 5.0]]),
    csr([1.0, 2.0, 5.0], [0, 1, 3], [0, 0, 3]),
])
def test_a_row_with_nothing_observed_has_a_finite_bound(model, empty_row):
    """The set encoder sees an empty set (a zero code); the row's bound is finite, dense or sparse, and training
    on it works."""
    with torch.no_grad():
        bound = model.bound(as_rows(empty_row).batch(np.arange(2)), 5)
    assert torch.isfinite(bound).all()
    fit(model, empty_row, QUICK)
    assert all(torch.isfinite(p).all() for p in model.parameters())
