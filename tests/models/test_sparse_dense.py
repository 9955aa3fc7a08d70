"""One model path for sparse and dense rows, and a set encoder that ignores the order of items."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from mnar_recsys.data.rows import as_rows
from mnar_recsys.models.config import ModelConfig, build_model


def ratings(n_rows: int = 8, n_features: int = 12, seed: int = 0) -> np.ndarray:
    """Integer ratings 1..5 with NaN where missing (about 60%); the last row has no observed entry."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(1, 6, size=(n_rows, n_features)).astype(float)
    rows[rng.random(rows.shape) < 0.6] = np.nan
    rows[-1] = np.nan
    return rows


def csr_of(dense: np.ndarray) -> sp.csr_matrix:
    return sp.csr_matrix(np.nan_to_num(dense, nan=0.0))


def bound_with_seed(model, data, n_samples: int = 7, seed: int = 3) -> torch.Tensor:
    source = as_rows(data)
    torch.manual_seed(seed)
    with torch.no_grad():
        return model.bound(source.batch(np.arange(source.n_rows)), n_samples)


@pytest.mark.parametrize("factor", ["sampled", "integrated"])
@pytest.mark.parametrize("decoder", ["gaussian", "categorical"])
@pytest.mark.parametrize("encoder", ["set", "mlp"])
def test_csr_and_dense_rows_give_the_same_bound(encoder, decoder, factor):
    """The same rows as CSR (stored = observed) and as a dense NaN array give L_K equal to 1e-5 under one seed,
    including a row with no observed entry."""
    dense = ratings()
    torch.manual_seed(0)
    model = build_model(ModelConfig(n_features=dense.shape[1], latent_dim=4, encoder=encoder, encoder_hidden=(16,),
                                    embedding_dim=6, code_dim=10, decoder=decoder, missing="itemwise",
                                    missing_factor=factor))
    from_dense = bound_with_seed(model, dense)
    from_csr = bound_with_seed(model, csr_of(dense))
    assert torch.isfinite(from_dense).all()
    torch.testing.assert_close(from_csr, from_dense, rtol=0, atol=1e-5)


def test_set_encoder_reads_the_ratings_not_only_which_items_were_rated():
    """Two users who rated the same items, low and high, are encoded apart (measured: 1.18 in the mean)."""
    torch.manual_seed(0)
    encoder = build_model(ModelConfig(n_features=6, latent_dim=3, encoder="set", embedding_dim=4, code_dim=8)).encoder
    rows = np.full((2, 6), np.nan)
    rows[:, [0, 2, 4]] = [[1.0, 2.0, 1.0], [5.0, 4.0, 5.0]]
    with torch.no_grad():
        mean, _ = encoder(as_rows(rows).batch(np.arange(2)))
    assert (mean[0] - mean[1]).abs().max() > 0.1


def test_set_encoder_is_invariant_to_permuting_items_with_their_embeddings():
    """Permuting the columns of the data together with the rows of `encoder.embedding` leaves q(z|x_o)
    unchanged; permuting the data alone changes it (so the comparison can fail)."""
    dense = ratings()
    torch.manual_seed(0)
    model = build_model(ModelConfig(n_features=dense.shape[1], latent_dim=4, encoder="set", embedding_dim=6,
                                    code_dim=10))
    encoder = model.encoder
    perm = np.random.default_rng(1).permutation(dense.shape[1])
    full = np.arange(dense.shape[0])
    with torch.no_grad():
        mean, logvar = encoder(as_rows(dense).batch(full))
        shuffled = as_rows(dense[:, perm]).batch(full)
        mean_items_only, _ = encoder(shuffled)
        encoder.embedding.copy_(encoder.embedding[torch.from_numpy(perm)])
        mean_perm, logvar_perm = encoder(shuffled)
    torch.testing.assert_close(mean_perm, mean, rtol=0, atol=1e-5)
    torch.testing.assert_close(logvar_perm, logvar, rtol=0, atol=1e-5)
    assert (mean_items_only - mean).abs().max() > 1e-3
