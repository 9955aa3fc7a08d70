"""The not-MIWAE: encoder q(z|x_o), decoder p(x|z) and missing model p(s|x) tied by the bound L_K.

unobserved_samples=m (per-feature or MCAR missing models): log p(x_o|z_k) and the missing-model factors of the
observed entries stay exact, and the sum of the missing factors over a row's n_unobserved unobserved entries is
replaced by n_unobserved / m times their sum over m unobserved columns drawn uniformly with replacement; decoder
parameters are computed at those entries only, so no (B, K, p) tensor is formed. The scaled sum is an unbiased
estimate of the missing term for each z_k, but inside the log-mean-exp it no longer gives an exact lower bound on
log p(x_o, s): log-sum-exp is convex in the K estimates, so on average the estimated L_K lies at or above the exact
one (equal for K = 1) and may exceed log p(x_o, s). It is a training objective only: `sample`, which inference
calls and whose `params` it reads, is always exact. The MIWAE (MCAR missing model) has no missing term, so its
bound is exact at that cost anyway: its decoder runs at the observed entries (and, in `sample` with targets, at
the targets) and nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from mnar_recsys.checks import is_positive_integer
from mnar_recsys.data.rows import RowBatch, RowSource, as_rows
from mnar_recsys.devices import cpu_normal
from mnar_recsys.models.bound import BoundTerms, importance_weighted_bound
from mnar_recsys.models.decoders import ObservationModel, Params
from mnar_recsys.models.gather import sum_by_row, take
from mnar_recsys.models.integrated import IntegratedFactor, factor_for
from mnar_recsys.models.missing import MissingModel, RowOffset, bernoulli_log_prob
from mnar_recsys.models.unobserved import UnobservedDraw, draw_unobserved

MISSING_FACTORS = ("sampled", "integrated")
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


@dataclass
class Samples:
    """Everything one pass of K importance samples produces for a batch."""

    z: torch.Tensor  # (B, K, d)
    params: Params  # decoder parameters, feature axis at 2: (B, K, p, ...), or (B, K, T, ...) at T targets
    terms: BoundTerms
    offset: torch.Tensor | None  # the row offset a(z_k) of every selection logit, (B, K); None without one
    completed: torch.Tensor | None  # the rows with the x_m,k the sampled factor scored drawn in, (B, K, p or T)


class NotMIWAE(nn.Module):
    """p(z) p(x|z) p(s|x) fit by L_K; with the MCAR missing model it is the MIWAE.

    missing_factor='sampled' draws x_m ~ p(x_m|z_k) (reparameterised) and scores the completed row;
    'integrated' (per-feature missing models only) replaces each missing feature's factor by
    log E_{p(x_j|z_k)}[Pr(s_j = 0 | x_j)], exact for discrete decoders and by Gauss-Hermite
    quadrature for the Gaussian one. Both give lower bounds on log p(x_o, s); the integrated one is
    an IWAE bound on z alone, so it is at least as tight in expectation and its weights are less noisy.

    unobserved_samples=m makes `bound` cheap for large catalogues (the module docstring says how, and what it
    costs the bound).

    row_offset (a `RowOffset`) adds a per-row shift a(z_k) to every selection logit: p(s | x, z).
    """

    def __init__(self, encoder: nn.Module, decoder: ObservationModel, missing_model: MissingModel,
                 latent_dim: int, n_features: int, missing_factor: str = "sampled",
                 unobserved_samples: int | None = None, row_offset: RowOffset | None = None):
        super().__init__()
        if missing_factor not in MISSING_FACTORS:
            raise ValueError(f"missing_factor must be one of {MISSING_FACTORS}, got {missing_factor!r}")
        if missing_factor == "integrated" and not (missing_model.per_feature or missing_model.is_mcar):
            raise ValueError(f"{type(missing_model).__name__} couples features, so x_m cannot be integrated out "
                             "feature by feature: use missing_factor='sampled'")
        if missing_factor == "integrated" and not (decoder.integrable or missing_model.is_mcar):
            raise ValueError(f"{type(decoder).__name__} has no quadrature nodes to integrate x_m out over: "
                             "use missing_factor='sampled'")
        _check_unobserved_samples(unobserved_samples, missing_model)
        if row_offset is not None and missing_model.is_mcar:
            raise ValueError("a row offset shifts the missing model's logits: the MCAR model has none")
        self.encoder, self.decoder, self.missing_model = encoder, decoder, missing_model
        self.row_offset = row_offset
        self.latent_dim, self.n_features = latent_dim, n_features
        self.missing_factor = missing_factor
        self.unobserved_samples = unobserved_samples

    def sample(self, batch: RowBatch, n_samples: int, targets: torch.Tensor | None = None) -> Samples:
        """Draw K samples per row and compute the bound's four log-terms exactly.

        With `targets`, columns of shape (B, T), `params` and `completed` hold those columns only,
        (B, K, T, ...). The MIWAE then computes its decoder at the observed entries and the targets alone:
        its p(s) is constant, so no other output enters the weights.
        """
        z, log_pz, log_qz = self._latent(batch, n_samples)
        if self.missing_model.is_mcar and targets is not None:
            observed, at_targets = self._at_observed_and_targets(batch, z, targets)
            terms = BoundTerms(self._sum_log_px_obs(batch, observed), z.new_zeros(z.shape[:2]), log_pz, log_qz)
            return Samples(z, at_targets, terms, None, None)
        params = self.decoder(z)
        offset = self._row_offset(z)
        completed = self.complete(batch, params)
        terms = BoundTerms(self.log_px_obs_from_params(batch, params), self.log_ps(batch, params, offset, completed),
                           log_pz, log_qz)
        if targets is not None:
            params = _at_columns(params, targets)
            completed = None if completed is None else _at_columns((completed,), targets)[0]
        return Samples(z, params, terms, offset, completed)

    def entries_per_sample(self, batch: RowBatch, n_targets: int = 0) -> int:
        """How many values one sample of `sample(batch, K, targets)` computes, with `n_targets` targets in all:
        every feature of every row, or for the MIWAE the observed and target entries and each row's z, and
        each row's widest hidden layer of the decoder, which outgrows the rest where features are few."""
        hidden = batch.n_rows * self.decoder.hidden_width
        if self.missing_model.is_mcar:
            return max(1, batch.obs_row.numel() + n_targets + batch.n_rows * self.latent_dim + hidden)
        return max(1, batch.n_rows * self.n_features + hidden)

    def exact_terms(self, batch: RowBatch, n_samples: int) -> BoundTerms:
        """The bound's four log-terms, exactly, whatever `unobserved_samples` says; the MIWAE's from the
        observed entries alone."""
        if not self.missing_model.is_mcar:
            return self.sample(batch, n_samples).terms
        z, log_pz, log_qz = self._latent(batch, n_samples)
        return BoundTerms(self._log_px_obs_from_z(batch, z), z.new_zeros(z.shape[:2]), log_pz, log_qz)

    def forward(self, batch: RowBatch, n_samples: int) -> torch.Tensor:
        """The bound, so that DistributedDataParallel's forward hooks see the training computation."""
        return self.bound(batch, n_samples)

    def bound(self, batch: RowBatch, n_samples: int) -> torch.Tensor:
        """L_K for each row of the batch, shape (B,); its subsampled estimate when `unobserved_samples` is set
        (the MIWAE's is always exact: it has no missing term)."""
        if self.unobserved_samples is None or self.missing_model.is_mcar:
            return importance_weighted_bound(self.exact_terms(batch, n_samples).log_weights)
        return importance_weighted_bound(self.subsampled_terms(batch, n_samples).log_weights)

    def subsampled_terms(self, batch: RowBatch, n_samples: int) -> BoundTerms:
        """The four log-terms with the missing term estimated from `unobserved_samples` draws per row."""
        z, log_pz, log_qz = self._latent(batch, n_samples)
        log_px_obs, log_ps = self.subsampled_log_likelihood(batch, z)
        return BoundTerms(log_px_obs, log_ps, log_pz, log_qz)

    def subsampled_log_likelihood(self, batch: RowBatch, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log p(x_o | z_k) exactly, the subsampled estimate of log p(s | ...)) for z of shape (B, K, d).

        Uses the observed entries and the drawn unobserved ones only, never `batch.values` or `batch.mask`.
        """
        if self.unobserved_samples is None:
            raise ValueError("subsampling needs unobserved_samples to be set on the model")
        if self.missing_model.is_mcar:
            return self._log_px_obs_from_z(batch, z), z.new_zeros(z.shape[:2])
        draw = draw_unobserved(batch, self.unobserved_samples)
        offset = self._row_offset(z)
        params = self.decoder.forward_entries(z, torch.cat([batch.obs_row, draw.rows]),
                                              torch.cat([batch.obs_col, draw.cols]))
        n_observed = batch.obs_row.numel()
        observed = tuple(t[:n_observed] for t in params)
        unobserved = tuple(t[n_observed:] for t in params)
        return self._sum_log_px_obs(batch, observed), self._subsampled_log_ps(batch, draw, unobserved, offset)

    def _latent(self, batch: RowBatch, n_samples: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """z ~ q(z | x_o), K per row, with log p(z) and log q(z | x_o): (B, K, d), (B, K), (B, K)."""
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
        return z, log_pz, log_qz

    def _row_offset(self, z: torch.Tensor) -> torch.Tensor | None:
        """The rows' logit shifts a(z_k), (B, K), or None without a row offset."""
        return None if self.row_offset is None else self.row_offset(z)

    def log_px_obs_from_params(self, batch: RowBatch, params: Params) -> torch.Tensor:
        """Σ_{j observed} log p(x_j | z_k) from the decoder's full parameters (B, K, p, ...), read at the observed
        entries: (B, K)."""
        return self._sum_log_px_obs(batch, self.decoder.at_entries(params, batch.obs_row, batch.obs_col))

    def _log_px_obs_from_z(self, batch: RowBatch, z: torch.Tensor) -> torch.Tensor:
        """Σ_{j observed} log p(x_j | z_k) from z (B, K, d), the decoder run at the observed entries only: (B, K)."""
        return self._sum_log_px_obs(batch, self.decoder.forward_entries(z, batch.obs_row, batch.obs_col))

    def _at_observed_and_targets(self, batch: RowBatch, z: torch.Tensor,
                                 targets: torch.Tensor) -> tuple[Params, Params]:
        """The decoder's parameters, computed in one pass at the observed entries (nnz, K, ...) and at columns
        `targets` (B, T) of each row (B, K, T, ...), and nowhere else."""
        n_rows, width = targets.shape
        target_rows = torch.arange(n_rows, device=targets.device).repeat_interleave(width)
        params = self.decoder.forward_entries(z, torch.cat([batch.obs_row, target_rows]),
                                              torch.cat([batch.obs_col, targets.reshape(-1)]))
        n_observed = batch.obs_row.numel()
        return (tuple(t[:n_observed] for t in params),
                tuple(t[n_observed:].view(n_rows, width, *t.shape[1:]).movedim(1, 2) for t in params))

    def _sum_log_px_obs(self, batch: RowBatch, observed: Params) -> torch.Tensor:
        """Σ_{j observed} log p(x_j | z_k) from the parameters at the observed entries (nnz, K, ...): (B, K)."""
        per_entry = self.decoder.log_prob(observed, batch.obs_value[:, None])
        return sum_by_row(per_entry, batch.obs_row, batch.n_rows)

    def complete(self, batch: RowBatch, params: Params) -> torch.Tensor | None:
        """The rows with x_m,k ~ p(x_m | z_k) drawn in (reparameterised), (B, K, p), where the missing factor
        samples x_m; None where it does not (the MIWAE, the integrated factor)."""
        if self.missing_model.is_mcar or self.missing_factor != "sampled":
            return None
        return torch.where(batch.mask[:, None] > 0, batch.values[:, None], self.draw_missing_values(params))

    def draw_missing_values(self, params: Params) -> torch.Tensor:
        """x_m,k ~ p(x_m | z_k): reparameterised while gradients are on, as the bound is trained (a discrete
        decoder's draws relaxed, Gumbel-Softmax), and exact otherwise, so that log-likelihoods and imputations
        weigh the missing model at values the data can take: relaxed draws had put a categorical model's
        log p(x_o, s) 1.9 nats a row too low, eight missing items a row at the item-wise slope 2."""
        return self.decoder.rsample(params) if torch.is_grad_enabled() else self.decoder.sample(params)

    def log_ps(self, batch: RowBatch, params: Params, offset: torch.Tensor | None = None,
               completed: torch.Tensor | None = None) -> torch.Tensor:
        """log p(s | x_o, x_m,k), or its integrated form: (B, K). `offset`: the rows' logit shifts (B, K);
        `completed`: the sampled factor's completed rows (drawn here when not given)."""
        model = self.missing_model
        if model.is_mcar:
            return params[0].new_zeros(params[0].shape[:2])
        mask = batch.mask[:, None]
        if self.missing_factor == "sampled":
            logits = model.logits(self.complete(batch, params) if completed is None else completed)
            return bernoulli_log_prob(logits if offset is None else logits + offset[..., None], mask)
        return self._log_ps_observed(batch, offset) + self._log_ps_missing(params, 1 - mask,
                                                                          None if offset is None else offset[..., None])

    @property
    def integrated_factor(self) -> IntegratedFactor:
        """The plug-in that integrates x_m out, chosen by the decoder's family and the missing model's logit form
        (`models.integrated`)."""
        return factor_for(self.decoder, self.missing_model)

    def _log_ps_missing(self, params: Params, keep: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        """Σ_j keep_j log Pr(s_j = 0 | z), integrated, over all features: (B, K). `offset` (B, K, 1) or None."""
        return self.integrated_factor.masked_sum(self.decoder, self.missing_model, params, keep, offset)

    def _log_ps_observed(self, batch: RowBatch, offset: torch.Tensor | None) -> torch.Tensor:
        """Σ_{j observed} log Pr(s_j = 1 | x_j) for a per-feature missing model: (B, 1), or (B, K) with an offset."""
        logits = self.missing_model.feature_logits(batch.obs_value, batch.obs_col)[:, None]
        if offset is not None:
            logits = logits + take(offset, batch.obs_row)
        observed = F.logsigmoid(logits)
        return sum_by_row(observed, batch.obs_row, batch.n_rows)

    def _subsampled_log_ps(self, batch: RowBatch, draw: UnobservedDraw, unobserved: Params,
                           offset: torch.Tensor | None) -> torch.Tensor:
        """Exact observed factors plus the weighted sum of the drawn unobserved ones: (B, K)."""
        features = draw.cols[:, None]
        draw_offset = None if offset is None else take(offset, draw.rows)
        if self.missing_factor == "integrated":
            per_draw = self.log_prob_missing(unobserved, features=features, offset=draw_offset)
        else:
            logits = self.missing_model.feature_logits(self.draw_missing_values(unobserved), features)
            per_draw = F.logsigmoid(-(logits if draw_offset is None else logits + draw_offset))
        return self._log_ps_observed(batch, offset) + sum_by_row(per_draw * draw.weight[:, None], draw.rows,
                                                                 batch.n_rows)

    def log_prob_missing(self, params: Params, features: torch.Tensor | None = None,
                         offset: torch.Tensor | None = None) -> torch.Tensor:
        """log Pr(s_j = 0 | z) = log E_{p(x_j|z)}[Pr(s_j = 0 | x_j)] per feature, integrated.

        `features` gives the feature index of each entry of params (default: the last axis is all features);
        `offset`, broadcastable to the parameters' shape, shifts the logits (the row offset).
        """
        if features is None:
            features = torch.arange(self.n_features, device=params[0].device)
        return self.integrated_factor.log_prob_missing(self.decoder, self.missing_model, params, features, offset)


def _at_columns(tensors: tuple[torch.Tensor, ...], cols: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Columns cols (B, T) of each row out of tensors (B, K, p, ...): each (B, K, T, ...)."""
    out = []
    for t in tensors:
        index = cols[:, None, :].expand(t.shape[0], t.shape[1], cols.shape[1])
        if t.dim() == 4:
            index = index[..., None].expand(-1, -1, -1, t.shape[3])
        out.append(t.gather(2, index))
    return tuple(out)


def _check_unobserved_samples(unobserved_samples: int | None, missing_model: MissingModel) -> None:
    if unobserved_samples is None:
        return
    if not is_positive_integer(unobserved_samples):
        raise ValueError(f"unobserved_samples must be None (the exact missing term) or an integer >= 1, "
                         f"got {unobserved_samples!r}")
    if not (missing_model.per_feature or missing_model.is_mcar):
        raise ValueError(f"{type(missing_model).__name__} couples features, so its missing term cannot be "
                         "subsampled entry by entry: leave unobserved_samples unset")


CHECK_CHUNK = 1 << 22  # observed values per chunk of prepare_rows' checks (16 MB of float32)


def prepare_rows(model: NotMIWAE, data: np.ndarray | sp.spmatrix | RowSource) -> RowSource:
    """Validate rows for this model, as training and inference take them: shape and the decoder's support."""
    rows = as_rows(data)
    if rows.n_features != model.n_features:
        raise ValueError(f"the model has {model.n_features} features but the rows have {rows.n_features}")
    values = rows.observed_values()
    # a chunk at a time: rows on disk are memory-mapped, and a check over the whole array at once would hold
    # a few bytes per rating in memory
    for start in range(0, values.size, CHECK_CHUNK):
        part = np.asarray(values[start:start + CHECK_CHUNK])
        among = "" if values.size <= CHECK_CHUNK else f" among observed entries {start}..{start + part.size - 1}"
        if not np.isfinite(part).all():  # a stored NaN in sparse rows, or an infinity, would make the bound NaN
            raise ValueError(f"{int((~np.isfinite(part)).sum())} observed values{among} are NaN or infinite (e.g. "
                             f"{part[~np.isfinite(part)][0]}); sparse rows store observed values only, and dense "
                             "rows mark a missing one with NaN")
        try:
            model.decoder.check_values(part)
        except ValueError as error:
            raise ValueError(f"{error}{among}") from None
    return rows
