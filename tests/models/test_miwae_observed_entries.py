"""The MIWAE's p(s) is constant, so its bound, log-likelihood and imputations need the decoder at the observed
entries and the imputation targets only. The full (B, K, p) forward pass is never run, and the numbers agree
with a not-MIWAE whose missing model ignores x, which computes that pass."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mnar_recsys.data.rows import as_rows
from mnar_recsys.inference import importance
from mnar_recsys.inference.importance import ImportanceConfig, impute, log_likelihood
from mnar_recsys.models.bound import importance_weighted_bound
from mnar_recsys.models.config import ModelConfig, build_model

FEATURES = 30


def ratings(n_rows: int = 12, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dense = rng.integers(1, 6, (n_rows, FEATURES)).astype(float)
    dense[rng.random(dense.shape) < 0.7] = np.nan
    dense[0, :3] = [1.0, 2.0, 3.0]  # at least one rating per row
    return dense


def models(decoder: str):
    """(MIWAE, not-MIWAE with an item-wise missing model of weight 0), sharing encoder and decoder."""
    config = dict(n_features=FEATURES, latent_dim=4, embedding_dim=6, code_dim=8, decoder=decoder,
                  missing_factor="integrated")
    torch.manual_seed(0)
    miwae = build_model(ModelConfig(**config, missing="mcar"))
    flat = build_model(ModelConfig(**config, missing="itemwise", missing_sign=None))
    flat.load_state_dict(miwae.state_dict(), strict=False)
    with torch.no_grad():
        flat.missing_model.raw_weight.zero_()
        flat.missing_model.bias.normal_(0.0, 1.0)
    return miwae, flat


def without_full_forward(model, monkeypatch):
    def refuse(z):
        raise AssertionError("the MIWAE ran its decoder over every feature")
    monkeypatch.setattr(model.decoder, "forward", refuse)
    return model


@pytest.mark.parametrize("decoder", ["gaussian", "categorical"])
def test_the_miwae_bound_and_its_gradients_equal_the_full_computation(decoder, monkeypatch):
    miwae, _ = models(decoder)
    batch = as_rows(ratings()).batch(np.arange(12))
    torch.manual_seed(1)
    full = importance_weighted_bound(miwae.sample(batch, 7).terms.log_weights)
    full.sum().backward()
    expected = {name: p.grad.clone() for name, p in miwae.named_parameters() if p.grad is not None}
    miwae.zero_grad()
    without_full_forward(miwae, monkeypatch)
    torch.manual_seed(1)
    bound = miwae.bound(batch, 7)
    bound.sum().backward()
    torch.testing.assert_close(bound, full)
    assert expected.keys() == {name for name, p in miwae.named_parameters() if p.grad is not None}
    for name, grad in expected.items():
        torch.testing.assert_close(dict(miwae.named_parameters())[name].grad, grad, msg=name)


@pytest.mark.parametrize("decoder", ["gaussian", "categorical"])
def test_the_miwae_imputes_like_a_missing_model_that_ignores_x(decoder, monkeypatch):
    """A missing model with weight 0 shifts every weight of a row by the same constant and tilts nothing,
    so the two impute alike (mean, median, effective sample size); the MIWAE without forming (B, K, p)."""
    miwae, flat = models(decoder)
    data = ratings()
    rows, cols = np.repeat(np.arange(12), 4), np.tile([0, 5, 17, 29], 12)
    config = ImportanceConfig(n_samples=300, chunk_entries=10 ** 9, seed=3)  # one sub-chunk for both
    methods = ("mean", "median", "multiple")
    expected = impute(flat, data, rows, cols, methods, config)
    got = impute(without_full_forward(miwae, monkeypatch), data, rows, cols, methods, config)
    np.testing.assert_allclose(got.mean, expected.mean, rtol=1e-5)
    np.testing.assert_allclose(got.median, expected.median, rtol=1e-4)
    np.testing.assert_allclose(got.ess, expected.ess, rtol=1e-4)
    assert got.mean.std() > 0.05  # the imputations differ between entries: the comparison has content
    # the draws come from other random streams (the flat model's tilt is drawn by rejection): same shape only
    assert got.draws.shape == expected.draws.shape


def test_the_miwae_log_likelihood_is_the_flat_models_less_its_constant_log_ps(monkeypatch):
    """log p(x_o, s) of the weight-0 model is log p(x_o) plus Σ_j log Pr(s_j) with Pr(s_j = 1) = σ(b_j)."""
    miwae, flat = models("gaussian")
    data = ratings()
    config = ImportanceConfig(n_samples=200, seed=5)
    expected = log_likelihood(flat, data, config)
    got = log_likelihood(without_full_forward(miwae, monkeypatch), data, config)
    observed = torch.from_numpy(~np.isnan(data))
    bias = flat.missing_model.bias.detach().double().cpu()  # log_likelihood moved the model to its device
    log_ps = torch.where(observed, F.logsigmoid(bias), F.logsigmoid(-bias)).sum(1).numpy()
    np.testing.assert_allclose(got + log_ps, expected, rtol=1e-5)


def test_the_miwae_sizes_its_sub_chunks_by_the_entries_it_computes(monkeypatch):
    """config.chunk_entries bounds the values one sub-chunk computes: rows x (features + the decoder's widest
    hidden layer) for the not-MIWAE, observed plus target entries (and each row's z and hidden layer) for the
    MIWAE, which therefore takes more samples."""
    data = ratings()
    batch = as_rows(data).batch(np.arange(12))
    rows, cols = np.repeat(np.arange(12), 4), np.tile([0, 5, 17, 29], 12)
    width = models("gaussian")[0].decoder.hidden_width
    config = ImportanceConfig(n_samples=300, chunk_entries=12 * (FEATURES + width) * 10)
    sizes = {}
    for name, model in zip(("miwae", "notmiwae"), models("gaussian")):
        sizes[name] = []
        sample = model.sample
        monkeypatch.setattr(model, "sample", lambda b, k, targets=None, sample=sample, out=sizes[name]:
                            out.append(k) or sample(b, k, targets))
        impute(model, data, rows, cols, config=config)
    assert sum(sizes["miwae"]) == sum(sizes["notmiwae"]) == 300
    assert max(sizes["notmiwae"]) == 10
    per_sample = batch.obs_row.numel() + rows.size + 12 * 4 + 12 * width  # and each row's z, of latent size 4
    assert max(sizes["miwae"]) == config.chunk_entries // per_sample > 10


def test_a_sub_chunk_counts_the_decoders_widest_hidden_layer_per_row(monkeypatch):
    """With a dense trunk, each row's widest hidden layer counts among the values of a sample, beside its
    features: with few features it holds most of them (the paper's UCI decoder: 128 units, 4 to 30 features)."""
    model = build_model(ModelConfig(n_features=FEATURES, latent_dim=4, embedding_dim=6, code_dim=8,
                                    decoder_hidden=(90, 60), missing="itemwise", missing_factor="integrated"))
    assert model.decoder.hidden_width == 90
    sizes, sample = [], model.sample
    monkeypatch.setattr(model, "sample", lambda b, k, targets=None: sizes.append(k) or sample(b, k, targets))
    impute(model, ratings(), config=ImportanceConfig(n_samples=25, chunk_entries=12 * (FEATURES + 90) * 10))
    assert sizes == [10, 10, 5]


def test_without_chunk_entries_a_sub_chunk_takes_the_default_of_the_rows_device(monkeypatch):
    """chunk_entries=None sizes each sub-chunk by DEFAULT_CHUNK_ENTRIES for the device the rows are on (a CPU
    here), for imputation and log-likelihood alike."""
    data = ratings()
    _, model = models("gaussian")
    monkeypatch.setitem(importance.DEFAULT_CHUNK_ENTRIES, "cpu", 12 * (FEATURES + model.decoder.hidden_width) * 7)
    config = ImportanceConfig(n_samples=30)
    for method, run in (("sample", lambda: impute(model, data, np.array([0, 3]), np.array([5, 17]), config=config)),
                        ("exact_terms", lambda: log_likelihood(model, data, config))):
        sizes, original = [], getattr(model, method)
        with monkeypatch.context() as patch:  # each counted on its own: exact_terms calls sample
            patch.setattr(model, method, lambda b, k, **rest: sizes.append(k) or original(b, k, **rest))
            run()
        assert sizes == [7, 7, 7, 7, 2], method


def test_a_conv_decoders_widest_feature_map_bounds_its_sub_chunks():
    """The conv decoder's feature maps (16 times the pixels with the paper's channels) count as its hidden width,
    so that no tensor of its forward pass holds more than chunk_entries values in an importance pass."""
    model = build_model(ModelConfig(n_features=16 * 16, latent_dim=4, encoder="conv", decoder="conv-gaussian",
                                    conv_channels=(8, 16, 32), activation="relu", squash=(0.0, 1.0),
                                    missing="self-masking", missing_factor="sampled"))
    largest = []
    for layer in model.decoder.mean_net.modules():
        if isinstance(layer, (torch.nn.Linear, torch.nn.ConvTranspose2d)):
            layer.register_forward_hook(lambda module, args, out: largest.append(out.numel()))
    widest = max(32 * 2 ** 2, 16 * 4 ** 2, 8 * 8 ** 2)  # the decoder's channels mirror the encoder's
    assert model.decoder.hidden_width == widest
    rng = np.random.default_rng(0)
    images = rng.random((6, 256)).astype(np.float32)
    images[images > 0.7] = np.nan
    config = ImportanceConfig(n_samples=40, row_chunk=6, chunk_entries=6 * (256 + widest) * 5)
    impute(model, images, config=config)
    assert max(largest) <= config.chunk_entries
    assert max(largest) == 6 * 5 * widest  # five samples a sub-chunk, the widest map filled
