"""Gaussian-VAE for ratings (after Liang, Krishnan, Hoffman & Jebara, WWW 2018, "Variational autoencoders
for collaborative filtering"): a VAE over each user's rating vector, fitted to the observed ratings only.

A user's ratings x_u (zero where unrated), L2-normalised and, in training, dropped out, are encoded as
q(z | x_u) = N(mu, diag(exp(logvar))) by a tanh layer; z decodes through a tanh layer to a linear output
f_u, one value per item, and the fit minimises the batch mean of

    sum_{i observed} [(x_ui - f_ui)^2 / (2 s^2) + log(2 pi s^2) / 2] + beta * KL(q(z | x_u) || N(0, I))

with one learned scalar variance s^2: the Gaussian likelihood masked to the observed entries, so the
zero-filled cells never enter the loss (the paper's implicit-feedback form scores the whole vector).
beta grows linearly to its cap. The input layer (a weighted gather of the rated items' rows) and the
output at the rated cells cost O(ratings x hidden) per step. Ratings are predicted raw, the normalisation
only shapes what the encoder sees; prediction encodes the train ratings, takes z = mu and clips f_ui.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from mnar_recsys.checks import check_positive_finite, check_positive_integer
from mnar_recsys.checks.ratings import check_fitted, check_on_scale, check_pairs, check_ratings

# the grid to choose the recipe's knobs from on held-out train ratings (`baselines.selection.select_config`):
# on small data the paper's dropout and weak KL weight overfit, and its normalisation and near-0 output
# biases cost accuracy on ratings (see VAEConfig)
VAE_GRID: tuple[dict[str, float | bool], ...] = tuple(
    {"dropout": d, "beta_cap": b, "normalise": n, "mean_start": m}
    for d in (0.0, 0.5) for b in (0.2, 1.0) for n in (True, False) for m in (False, True))

_PREDICT_CHUNK = 4096  # users decoded at once: bounds the dense (users x items) output


@dataclass
class VAEConfig:
    """Hyper-parameters of the Gaussian-VAE; the defaults are the paper's recipe. On a data set as small as
    Coat, choose dropout, beta_cap, normalise and mean_start from ``VAE_GRID`` on held-out train ratings.
    """

    #: units of the encoder's and the decoder's tanh layer (the paper's 600).
    hidden: int = 600
    #: dimension of z (the paper's 200).
    latent: int = 200
    #: passes over the users with at least one train rating.
    epochs: int = 200
    #: users per gradient step.
    batch_size: int = 500
    #: Adam step size.
    lr: float = 1e-3
    #: the largest weight of the KL term; 0 fits a (noisy) autoencoder.
    beta_cap: float = 0.2
    #: share of the steps after which beta stays at its cap (it grows linearly from 0).
    anneal_fraction: float = 0.8
    #: probability of dropping each observed input entry in training (kept ones scale by 1 / (1 - dropout)); 0 disables
    #: it.
    dropout: float = 0.5
    #: L2-normalise each user's input row, as the paper does; it hides the user's rating level (ratings 1, 1 and 5, 5
    #: of the same items encode alike), so False divides by the largest train rating instead.
    normalise: bool = True
    #: add the train mean to the output biases' N(0, 0.001^2) start, so that the first steps fit the structure rather
    #: than the offset (the paper's biases start near 0, natural for clicks).
    mean_start: bool = False
    #: predictions are clipped to this (low, high); None disables clipping.
    rating_scale: tuple[float, float] | None = (1.0, 5.0)
    #: seeds the initialisation, the batch order, the dropout and the sampled z.
    seed: int = 0

    def validate(self) -> None:
        """Refuse values that would fail deep inside torch or train silently wrong."""
        for name in ("hidden", "latent", "epochs", "batch_size"):
            check_positive_integer(f"VAEConfig.{name}", getattr(self, name))
        check_positive_finite("VAEConfig.lr", self.lr)
        if isinstance(self.beta_cap, bool) or not (isinstance(self.beta_cap, (int, float))
                                                   and math.isfinite(self.beta_cap) and self.beta_cap >= 0):
            raise ValueError(f"VAEConfig.beta_cap must be finite and >= 0, got {self.beta_cap!r}")
        if isinstance(self.anneal_fraction, bool) or not (isinstance(self.anneal_fraction, (int, float))
                                                          and 0 < self.anneal_fraction <= 1):
            raise ValueError(f"VAEConfig.anneal_fraction must be in (0, 1], got {self.anneal_fraction!r}")
        if isinstance(self.dropout, bool) or not (isinstance(self.dropout, (int, float)) and 0 <= self.dropout < 1):
            raise ValueError(f"VAEConfig.dropout must be in [0, 1), got {self.dropout!r}")
        for name in ("normalise", "mean_start"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"VAEConfig.{name} must be a bool, got {getattr(self, name)!r}")


def kl_weight(step: int, total_steps: int, cap: float, anneal_fraction: float) -> float:
    """beta at gradient step ``step`` (from 0) of ``total_steps``: linear from 0, at ``cap`` from
    ``anneal_fraction * total_steps`` on (the paper's fixed horizon would leave it near 0 on small data)."""
    return cap * min(1.0, step / (anneal_fraction * total_steps))


class Batch(NamedTuple):
    """Some users' rows in the flat (CSR) form the network reads: entry k is user ``rows[k]``'s rating
    ``targets[k]`` of item ``items[k]``, which the encoder sees as ``inputs[k]``; user j's entries are
    ``indptr[j]:indptr[j + 1]``."""

    indptr: torch.Tensor
    rows: torch.Tensor
    items: torch.Tensor
    inputs: torch.Tensor
    targets: torch.Tensor


def make_batch(ratings: sp.csr_matrix, dropout: float = 0.0, generator: torch.Generator | None = None,
               scale: float | None = None) -> Batch:
    """The rows of ``ratings`` as a Batch: each row L2-normalised (an empty one stays zero), or divided by
    ``scale`` if given, then each entry dropped with probability ``dropout`` and the kept ones scaled by
    1 / (1 - dropout)."""
    counts = np.diff(ratings.indptr)
    rows = np.repeat(np.arange(ratings.shape[0]), counts)
    norms = np.sqrt(np.asarray(ratings.multiply(ratings).sum(1)).ravel())[rows] if scale is None else scale
    targets = torch.from_numpy(ratings.data).float()
    inputs = targets / torch.as_tensor(norms).float()
    if dropout > 0:
        keep = torch.rand(ratings.nnz, generator=generator) >= dropout
        inputs = inputs * keep / (1.0 - dropout)
    return Batch(torch.from_numpy(ratings.indptr).long(), torch.from_numpy(rows).long(),
                 torch.from_numpy(ratings.indices).long(), inputs, targets)


class GaussianVAENetwork(torch.nn.Module):
    """Encoder items-hidden-(mu, logvar), decoder latent-hidden-items, tanh hidden layers, and the
    likelihood's log variance; Xavier-uniform weights and N(0, 0.001^2) biases, as in the paper's code."""

    def __init__(self, n_items: int, hidden: int, latent: int, generator: torch.Generator) -> None:
        super().__init__()
        # item-major (items x hidden) input and output weights, so both layers gather the rated items' rows
        self.encoder_in = torch.nn.Parameter(torch.empty(n_items, hidden))
        self.encoder_in_bias = torch.nn.Parameter(torch.empty(hidden))
        self.encoder_out = torch.nn.Linear(hidden, 2 * latent)
        self.decoder_in = torch.nn.Linear(latent, hidden)
        self.decoder_out = torch.nn.Parameter(torch.empty(n_items, hidden))
        self.decoder_out_bias = torch.nn.Parameter(torch.empty(n_items))
        self.log_variance = torch.nn.Parameter(torch.zeros(()))
        for weight in (self.encoder_in, self.encoder_out.weight, self.decoder_in.weight, self.decoder_out):
            torch.nn.init.xavier_uniform_(weight, generator=generator)
        for bias in (self.encoder_in_bias, self.encoder_out.bias, self.decoder_in.bias, self.decoder_out_bias):
            bias.data.normal_(0.0, 1e-3, generator=generator)

    def encode(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(mu, logvar) of q(z | x_u), one row per user of the batch."""
        hidden = F.embedding_bag(batch.items, self.encoder_in, batch.indptr[:-1], mode="sum",
                                 per_sample_weights=batch.inputs)
        mu, logvar = self.encoder_out(torch.tanh(hidden + self.encoder_in_bias)).chunk(2, dim=1)
        return mu, logvar

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """f_u for every item, one row per row of z."""
        return torch.tanh(self.decoder_in(z)) @ self.decoder_out.T + self.decoder_out_bias

    def decode_at(self, z: torch.Tensor, batch: Batch) -> torch.Tensor:
        """f_ui at the batch's rated cells only, in its entries' order (a sampled matrix product)."""
        with warnings.catch_warnings():  # PyTorch flags sparse CSR tensors as beta on every construction
            warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta state")
            # the structure is a canonical scipy CSR's, so torch's invariant checks would only cost time
            cells = torch.sparse_csr_tensor(batch.indptr, batch.items, torch.ones(len(batch.items), dtype=z.dtype),
                                            size=(len(z), len(self.decoder_out_bias)), check_invariants=False)
        hidden = torch.tanh(self.decoder_in(z))
        return (torch.sparse.sampled_addmm(cells, hidden, self.decoder_out.T, beta=0.0).values()
                + self.decoder_out_bias[batch.items])


def negative_elbo(network: GaussianVAENetwork, batch: Batch, beta: float, noise: torch.Tensor) -> torch.Tensor:
    """The batch mean over users of -log N(x_o | f, s^2) + beta * KL, with z = mu + exp(logvar / 2) * noise."""
    mu, logvar = network.encode(batch)
    z = mu + torch.exp(0.5 * logvar) * noise
    mean = network.decode_at(z, batch)
    nll_terms = 0.5 * ((batch.targets - mean) ** 2 * torch.exp(-network.log_variance)
                       + network.log_variance + math.log(2 * math.pi))
    nll = torch.zeros(len(mu), dtype=mu.dtype).index_add_(0, batch.rows, nll_terms)
    kl = 0.5 * (mu ** 2 + torch.exp(logvar) - 1.0 - logvar).sum(1)
    return (nll + beta * kl).mean()


class GaussianVAE:
    """Gaussian-VAE recommender (Recommender protocol). A user without train ratings is decoded from the
    code of the zero vector."""

    name = "gaussian-vae"

    def __init__(self, config: VAEConfig | None = None, **overrides: object) -> None:
        """Build from a ``VAEConfig`` or keyword overrides of its fields (``GaussianVAE(epochs=50)``)."""
        base = config or VAEConfig()
        self.config = VAEConfig(**{**base.__dict__, **overrides})
        self.network: GaussianVAENetwork | None = None
        self.train_ratings: sp.csr_matrix | None = None  # what predict encodes
        self.input_scale: float | None = None  # make_batch's scale: None for L2-normalised rows

    def fit(self, train: sp.csr_matrix) -> GaussianVAE:
        """Fit to the stored ratings of ``train`` (users x items CSR), with Adam on batches of the users that
        have ratings; the same seed and torch thread count give the same fit."""
        cfg = self.config
        cfg.validate()
        train = check_ratings(train)
        check_on_scale(train, cfg.rating_scale)
        generator = torch.Generator().manual_seed(cfg.seed)
        network = GaussianVAENetwork(train.shape[1], cfg.hidden, cfg.latent, generator)
        if cfg.mean_start:
            network.decoder_out_bias.data += float(train.data.mean())
        scale = None if cfg.normalise else float(np.abs(train.data).max())
        optimiser = torch.optim.Adam(network.parameters(), lr=cfg.lr)
        rated = np.flatnonzero(np.diff(train.indptr) > 0)  # a user without ratings has no likelihood term
        total_steps = cfg.epochs * math.ceil(len(rated) / cfg.batch_size)
        step = 0
        for _ in range(cfg.epochs):
            order = rated[torch.randperm(len(rated), generator=generator).numpy()]
            for start in range(0, len(rated), cfg.batch_size):
                batch = make_batch(train[order[start:start + cfg.batch_size]], cfg.dropout, generator, scale)
                noise = torch.randn(len(batch.indptr) - 1, cfg.latent, generator=generator)
                beta = kl_weight(step, total_steps, cfg.beta_cap, cfg.anneal_fraction)
                optimiser.zero_grad()
                negative_elbo(network, batch, beta, noise).backward()
                optimiser.step()
                step += 1
        self.network, self.train_ratings, self.input_scale = network.eval(), train, scale
        return self

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Predicted ratings for the (users[k], items[k]) pairs: f_ui at z = mu of the user's train ratings
        (no dropout), clipped to ``rating_scale``."""
        check_fitted(self, "network")
        u, i = check_pairs(users, items, self.train_ratings.shape)
        known, index = np.unique(u, return_inverse=True)
        pred = np.empty(len(u))
        with torch.no_grad():
            for start in range(0, len(known), _PREDICT_CHUNK):
                rows = self.train_ratings[known[start:start + _PREDICT_CHUNK]]
                mu, _ = self.network.encode(make_batch(rows, scale=self.input_scale))
                here = (index >= start) & (index < start + _PREDICT_CHUNK)
                pred[here] = self.network.decode(mu).numpy()[index[here] - start, i[here]]
        if self.config.rating_scale is not None:
            pred = np.clip(pred, *self.config.rating_scale)
        return pred
