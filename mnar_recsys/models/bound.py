"""The importance-weighted bound L_K, a short function of four log-terms."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class BoundTerms:
    """Per-row, per-sample log-terms, each of shape (B, K)."""

    log_px_obs: torch.Tensor
    log_ps: torch.Tensor
    log_pz: torch.Tensor
    log_qz: torch.Tensor

    @property
    def log_weights(self) -> torch.Tensor:
        """log w_k = log p(x_o|z_k) + log p(s|x_o, x_m,k) + log p(z_k) - log q(z_k|x_o)."""
        return self.log_px_obs + self.log_ps + self.log_pz - self.log_qz


def importance_weighted_bound(log_weights: torch.Tensor) -> torch.Tensor:
    """L_K per row: log (1/K) Σ_k w_k, with logsumexp over the last axis."""
    return torch.logsumexp(log_weights, dim=-1) - math.log(log_weights.shape[-1])
