"""The not-MIWAE: encoder q(z|x_o), decoder p(x|z) and missing model p(s|x) tied by the bound L_K."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mnar_recsys.data.rows import RowBatch
from mnar_recsys.models.bound import BoundTerms, importance_weighted_bound
from mnar_recsys.models.decoders import GaussianDecoder, ObservationModel, Params
from mnar_recsys.models.missing import LevelwiseLogistic, MissingModel
from mnar_recsys.models.quadrature import log_expected_sigmoid, log_expected_sigmoid_piecewise
from mnar_recsys.devices import cpu_normal

MISSING_FACTORS = ("sampled", "integrated")
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


@dataclass
class Samples:
    """Everything one pass of K importance samples produces for a batch."""

    z: torch.Tensor  # (B, K, d)
    params: Params  # decoder parameters, feature axis at 2: (B, K, p, ...)
    terms: BoundTerms


class NotMIWAE(nn.Module):
    """p(z) p(x|z) p(s|x) fit by L_K; with the MCAR missing model it is the MIWAE.

    missing_factor='sampled' draws x_m ~ p(x_m|z_k) (reparameterised) and scores the completed row;
    'integrated' (per-feature missing models only) replaces each missing feature's factor by
    log E_{p(x_j|z_k)}[Pr(s_j = 0 | x_j)], exact for discrete decoders and by Gauss-Hermite
    quadrature for the Gaussian one. Both give lower bounds on log p(x_o, s); the integrated one is
    an IWAE bound on z alone, so it is at least as tight in expectation and its weights are less noisy.
    """

    def __init__(self, encoder: nn.Module, decoder: ObservationModel, missing_model: MissingModel,
                 latent_dim: int, n_features: int, missing_factor: str = "sampled"):
        super().__init__()
        if missing_factor not in MISSING_FACTORS:
            raise ValueError(f"missing_factor must be one of {MISSING_FACTORS}, got {missing_factor!r}")
        if missing_factor == "integrated" and not (missing_model.per_feature or missing_model.is_mcar):
            raise ValueError(f"{type(missing_model).__name__} couples features, so x_m cannot be integrated out "
                             "feature by feature: use missing_factor='sampled'")
        self.encoder, self.decoder, self.missing_model = encoder, decoder, missing_model
        self.latent_dim, self.n_features = latent_dim, n_features
        self.missing_factor = missing_factor

    def sample(self, batch: RowBatch, n_samples: int) -> Samples:
        """Draw K samples per row and compute the bound's four log-terms."""
        if n_samples < 1:
            raise ValueError(f"the number of importance samples K must be at least 1, got {n_samples}")
        if batch.n_features != self.n_features:
            raise ValueError(f"the model has {self.n_features} features but the batch has {batch.n_features}")
        mu, logvar = self.encoder(batch)
        std = torch.exp(0.5 * logvar)
        eps = cpu_normal(mu.shape[0], n_samples, mu.shape[1], device=mu.device)
        z = mu[:, None] + std[:, None] * eps
        log_qz = -(0.5 * eps ** 2 + torch.log(std)[:, None] + _HALF_LOG_2PI).sum(-1)
        log_pz = -(0.5 * z ** 2 + _HALF_LOG_2PI).sum(-1)
        params = self.decoder(z)
        terms = BoundTerms(self.log_px_obs(batch, params), self.log_ps(batch, params), log_pz, log_qz)
        return Samples(z, params, terms)

    def forward(self, batch: RowBatch, n_samples: int) -> torch.Tensor:
        """The bound, so that DistributedDataParallel's forward hooks see the training computation."""
        return self.bound(batch, n_samples)

    def bound(self, batch: RowBatch, n_samples: int) -> torch.Tensor:
        """L_K for each row of the batch, shape (B,)."""
        return importance_weighted_bound(self.sample(batch, n_samples).terms.log_weights)

    def log_px_obs(self, batch: RowBatch, params: Params) -> torch.Tensor:
        """Σ_{j observed} log p(x_j | z_k), computed on the observed entries only: (B, K)."""
        observed = tuple(t[batch.obs_row, :, batch.obs_col] for t in params)  # (nnz, K, ...)
        per_entry = self.decoder.log_prob(observed, batch.obs_value[:, None])
        n_samples = params[0].shape[1]
        return per_entry.new_zeros(batch.n_rows, n_samples).index_add_(0, batch.obs_row, per_entry)

    def log_ps(self, batch: RowBatch, params: Params) -> torch.Tensor:
        """log p(s | x_o, x_m,k), or its integrated form: (B, K)."""
        model = self.missing_model
        if model.is_mcar:
            return params[0].new_zeros(params[0].shape[:2])
        mask = batch.mask[:, None]
        if self.missing_factor == "sampled":
            completed = torch.where(mask > 0, batch.values[:, None], self.decoder.rsample(params))
            return model.log_prob(completed, mask)
        observed = F.logsigmoid(model.feature_logits(batch.obs_value, batch.obs_col))
        log_ps_observed = observed.new_zeros(batch.n_rows).index_add_(0, batch.obs_row, observed)
        log_p_missing = self.log_prob_missing(params)
        return log_ps_observed[:, None] + ((1 - mask) * log_p_missing).sum(-1)

    def log_prob_missing(self, params: Params, features: torch.Tensor | None = None) -> torch.Tensor:
        """log Pr(s_j = 0 | z) = log E_{p(x_j|z)}[Pr(s_j = 0 | x_j)] per feature, by quadrature.

        `features` gives the feature index of each entry of params (default: the last axis is all features).
        """
        decoder, model = self.decoder, self.missing_model
        if features is None:
            features = torch.arange(self.n_features, device=params[0].device)
        if isinstance(decoder, GaussianDecoder) and model.affine:
            slope, intercept = model.feature_affine(features)
            loc, scale = params
            return log_expected_sigmoid(slope * loc + intercept, slope.abs() * _compact(scale),
                                        decoder.quadrature_points)
        if isinstance(decoder, GaussianDecoder) and isinstance(model, LevelwiseLogistic):
            loc, scale = params
            return log_expected_sigmoid_piecewise(loc, _compact(scale), model.level_logits(), model.bias[features],
                                                  model.lo, decoder.quadrature_points)
        nodes, log_w = decoder.quadrature(params)
        support = getattr(decoder, "support", None)
        if support is not None and features.dim() <= 1:
            nodes = support  # discrete nodes do not depend on z: score them once per (feature, level)
        logits = model.feature_logits(nodes, features[..., None])
        return torch.logsumexp(log_w + F.logsigmoid(-logits), dim=-1)


def _compact(t: torch.Tensor) -> torch.Tensor:
    """Undo broadcasting: keep one copy along every axis with stride 0 (a shared variance stays (1, 1, p))."""
    return t[tuple(slice(0, 1) if stride == 0 and size > 1 else slice(None)
                   for stride, size in zip(t.stride(), t.shape))]
