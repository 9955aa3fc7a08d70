"""Gaussian-VAE: its fit on low-rank ratings, the masked loss against a hand computation, the invariances
and seeding its predictions must have, and its input checks."""

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from baselines.mf import MatrixFactorization
from baselines.vae_cf import (
    GaussianVAE,
    GaussianVAENetwork,
    VAEConfig,
    kl_weight,
    make_batch,
    negative_elbo,
)
from mnar_recsys.evaluation.metrics import mse

# 600 steps of a smaller network than the paper's, which this 300 x 200 matrix needs no more than
SMALL = {"hidden": 100, "latent": 20, "batch_size": 50, "epochs": 100, "dropout": 0.0, "mean_start": True}


def unobserved_cells(data):
    u, i = np.nonzero(data.mask == 0)
    return u, i, data.truth[u, i]


def test_beats_the_train_mean_and_nears_mf_on_unobserved_cells(mcar_data):
    """Measured: MSE on the unobserved cells 0.483 (0.489, 0.487 at seeds 1, 2) against 1.85 for the train
    mean and 0.393 for biased MF; without the mean start 0.706, and 0.763 with dropout 0.5."""
    u, i, y = unobserved_cells(mcar_data)
    train = mcar_data.train
    vae = mse(y, GaussianVAE(**SMALL).fit(train).predict(u, i))
    assert vae < 0.3 * mse(y, np.full_like(y, train.data.mean()))
    assert vae < mse(y, MatrixFactorization().fit(train).predict(u, i)) + 0.15


def small_network(n_items: int, seed: int = 0) -> GaussianVAENetwork:
    network = GaussianVAENetwork(n_items, hidden=5, latent=3, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():  # away from the initial s^2 = 1, so that a missing or misplaced s^2 shows
        network.log_variance.fill_(math.log(0.7))
        network.decoder_out_bias.add_(2.5)
    return network


def ratings_with_an_empty_row() -> sp.csr_matrix:
    dense = np.array([[5.0, 0, 3, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0, 0], [2, 4, 0, 0, 1, 0, 0], [0, 0, 0, 4, 0, 0, 5]])
    return sp.csr_matrix(dense)


def test_the_loss_is_the_masked_gaussian_likelihood_plus_beta_kl_by_hand():
    ratings = ratings_with_an_empty_row()
    network = small_network(ratings.shape[1]).double()
    noise = torch.from_numpy(np.random.default_rng(0).normal(size=(4, 3)))
    batch = make_batch(ratings)
    batch = batch._replace(inputs=batch.inputs.double(), targets=batch.targets.double())
    loss = negative_elbo(network, batch, beta=0.3, noise=noise).item()

    p = {name: value.detach().numpy() for name, value in network.named_parameters()}
    x = ratings.toarray()
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    h = np.tanh(np.divide(x, norms, out=np.zeros_like(x), where=norms > 0) @ p["encoder_in"] + p["encoder_in_bias"])
    out = h @ p["encoder_out.weight"].T + p["encoder_out.bias"]
    mu, logvar = out[:, :3], out[:, 3:]
    z = mu + np.exp(logvar / 2) * noise.numpy()
    f = np.tanh(z @ p["decoder_in.weight"].T + p["decoder_in.bias"]) @ p["decoder_out"].T + p["decoder_out_bias"]
    s2 = 0.7
    nll = (((x - f) ** 2 / (2 * s2) + 0.5 * np.log(2 * np.pi * s2)) * (x != 0)).sum(1)
    kl = 0.5 * (mu ** 2 + np.exp(logvar) - 1 - logvar).sum(1)
    assert loss == pytest.approx(np.mean(nll + 0.3 * kl), rel=1e-7)  # make_batch normalises in float32


def test_unrated_cells_never_enter_the_loss():
    """Items 1 and 4 are rated by no user of the batch: their decoder outputs may be anything, and get no gradient."""
    ratings = ratings_with_an_empty_row()[[0, 3]]
    network = small_network(ratings.shape[1])
    batch, noise = make_batch(ratings), torch.randn(2, 3, generator=torch.Generator().manual_seed(1))
    loss = negative_elbo(network, batch, 0.2, noise)
    loss.backward()
    assert network.decoder_out.grad[[1, 4]].abs().max() == 0 and network.decoder_out_bias.grad[[1, 4]].abs().max() == 0
    assert network.decoder_out_bias.grad[[0, 2, 3, 5, 6]].abs().min() > 0
    with torch.no_grad():
        network.decoder_out_bias[[1, 4]] += 7.0
        network.decoder_out[[1, 4]] -= 3.0
        assert negative_elbo(network, batch, 0.2, noise).item() == loss.item()
        network.decoder_out_bias[0] += 0.1
        assert negative_elbo(network, batch, 0.2, noise).item() != loss.item()


def test_the_loss_does_not_depend_on_the_order_of_the_batch():
    ratings = ratings_with_an_empty_row()
    network = small_network(ratings.shape[1])
    noise = torch.randn(4, 3, generator=torch.Generator().manual_seed(2))
    order = [2, 0, 3, 1]
    loss = negative_elbo(network, make_batch(ratings), 1.0, noise).item()
    assert negative_elbo(network, make_batch(ratings[order]), 1.0, noise[order]).item() == pytest.approx(loss, rel=1e-6)


def test_a_users_prediction_does_not_depend_on_who_else_is_predicted(mcar_data):
    train = mcar_data.train
    model = GaussianVAE(hidden=16, latent=4, epochs=2).fit(train)
    users, items = np.repeat(np.arange(300), 200), np.tile(np.arange(200), 300)
    everyone = model.predict(users, items).reshape(300, 200)
    order = np.random.default_rng(0).permutation(len(users))
    np.testing.assert_allclose(model.predict(users[order], items[order]), everyone.ravel()[order], rtol=1e-6)
    np.testing.assert_allclose(model.predict(np.full(200, 17), np.arange(200)), everyone[17], rtol=1e-6)


def test_beta_reaches_its_cap_at_the_anneal_fraction_of_the_steps():
    betas = np.array([kl_weight(step, 1000, 0.2, 0.8) for step in range(1000)])
    assert betas[0] == 0 and np.all(np.diff(betas) >= 0)
    assert betas[399] == pytest.approx(0.2 * 399 / 800, rel=1e-12) and betas[800:].min() == betas.max() == 0.2


def test_inputs_are_unit_rows_and_dropout_zeroes_or_rescales_entries():
    ratings = sp.csr_matrix(np.random.default_rng(0).integers(0, 6, size=(40, 30)).astype(float))
    batch = make_batch(ratings)
    rows = batch.rows.numpy()
    np.testing.assert_allclose(np.bincount(rows, weights=batch.inputs.numpy() ** 2), 1.0, rtol=1e-6)
    dropped = make_batch(ratings, dropout=0.25, generator=torch.Generator().manual_seed(0)).inputs.numpy()
    kept = dropped != 0
    assert 0.7 < kept.mean() < 0.8
    np.testing.assert_allclose(dropped[kept], batch.inputs.numpy()[kept] / 0.75, rtol=1e-6)
    np.testing.assert_array_equal(make_batch(ratings, dropout=0.25).targets.numpy(), ratings.data)


def test_normalised_inputs_hide_the_users_level_and_unnormalised_ones_keep_it():
    """Liang et al.'s L2 normalisation maps ratings (1, 2, 2) and (2, 4, 4) of the same items to one input."""
    ratings = sp.csr_matrix(np.array([[1.0, 2, 2, 0], [2, 4, 4, 0]]))
    network = small_network(4)
    normalised, scaled = make_batch(ratings), make_batch(ratings, scale=5.0)
    with torch.no_grad():
        mu, _ = network.encode(normalised)
        np.testing.assert_allclose(mu[0], mu[1], rtol=1e-6)
        mu, _ = network.encode(scaled)
        assert not np.allclose(mu[0], mu[1])
    np.testing.assert_allclose(scaled.inputs.numpy(), ratings.data / 5.0, rtol=1e-6)


def test_unnormalised_inputs_are_divided_by_the_largest_train_rating_in_predict_too(mcar_data):
    train = mcar_data.train[:, :150]
    train.eliminate_zeros()
    model = GaussianVAE(hidden=16, latent=4, epochs=2, normalise=False, rating_scale=None).fit(train)
    assert model.input_scale == train.data.max() == 5.0
    with torch.no_grad():
        mu, _ = model.network.encode(make_batch(train[[7]], scale=5.0))
        np.testing.assert_allclose(model.predict(np.full(150, 7), np.arange(150)), model.network.decode(mu)[0],
                                   rtol=1e-6)


def test_same_seed_same_predictions_clipped_to_the_scale(mcar_data):
    """Unclipped, since three epochs leave most predictions below 1."""
    u, i, _ = unobserved_cells(mcar_data)

    def fit(seed: int, rating_scale: tuple[float, float] | None = None) -> GaussianVAE:
        return GaussianVAE(hidden=32, latent=8, epochs=3, batch_size=100, seed=seed, rating_scale=rating_scale
                           ).fit(mcar_data.train)

    a = fit(3).predict(u, i)
    np.testing.assert_array_equal(a, fit(3).predict(u, i))
    assert not np.allclose(a, fit(4).predict(u, i))
    np.testing.assert_array_equal(fit(3, (1.0, 5.0)).predict(u, i), np.clip(a, 1.0, 5.0))


def test_users_without_train_ratings_are_decoded_from_the_zero_vector(mcar_data):
    train = mcar_data.train.tolil()
    train[[5, 9], :] = 0
    train = train.tocsr()
    train.eliminate_zeros()
    model = GaussianVAE(hidden=16, latent=4, epochs=2, rating_scale=None).fit(train)
    items = np.arange(200)
    empty = model.predict(np.full(200, 5), items)
    assert np.isfinite(empty).all()
    np.testing.assert_array_equal(empty, model.predict(np.full(200, 9), items))
    with torch.no_grad():
        mu, _ = model.network.encode(make_batch(sp.csr_matrix((1, 200))))
        np.testing.assert_allclose(empty, model.network.decode(mu).numpy()[0], rtol=1e-6)
    assert not np.allclose(empty, model.predict(np.full(200, 6), items))


def test_bad_input_is_refused():
    train = sp.csr_matrix(np.array([[1.0, 0.0, 3.0], [0.0, 5.0, 2.0]]))
    tiny = {"hidden": 4, "latent": 2, "epochs": 1}
    with pytest.raises(ValueError, match="not fitted"):
        GaussianVAE().predict(np.array([0]), np.array([0]))
    with pytest.raises(ValueError, match="no stored ratings"):
        GaussianVAE(**tiny).fit(sp.csr_matrix((2, 3)))
    with pytest.raises(ValueError, match="sparse"):
        GaussianVAE(**tiny).fit(train.toarray())
    with pytest.raises(ValueError, match=r"outside rating_scale \(1.0, 5.0\), the first 7 at \(user 1, item 1\)"):
        GaussianVAE(**tiny).fit(sp.csr_matrix(np.array([[1.0, 0.0, 3.0], [0.0, 7.0, 2.0]])))
    bad = {"hidden": 8.0, "latent": 0, "epochs": -1, "batch_size": True, "lr": float("nan"), "beta_cap": -0.1,
           "anneal_fraction": 0.0, "dropout": 1.0, "normalise": None,
           "mean_start": 1}
    for name, value in bad.items():
        with pytest.raises(ValueError, match=f"VAEConfig.{name} must"):
            GaussianVAE(**{**tiny, name: value}).fit(train)
    with pytest.raises(TypeError):
        GaussianVAE(n_factors=3)
    fitted = GaussianVAE(**tiny).fit(train)
    with pytest.raises(ValueError, match="item index out of range"):
        fitted.predict(np.array([0]), np.array([3]))
    with pytest.raises(ValueError, match="user index out of range"):
        fitted.predict(np.array([2]), np.array([0]))
    assert GaussianVAE(VAEConfig(epochs=3), seed=2).config == VAEConfig(epochs=3, seed=2)
