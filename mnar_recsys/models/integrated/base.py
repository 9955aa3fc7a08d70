"""The integrated missing factor's plug-in point: log Pr(s_j = 0 | z) = log E_{p(x_j|z)}[Pr(s_j = 0 | x_j)].

A factor is keyed by what the decoder and the missing model declare: the decoder's `family` ('gaussian',
'categorical', ...) and the per-feature missing model's `logit_form` ('affine', 'piecewise-linear', or None for
any elementwise logit). `factor_for` picks the factor registered for that pair, else one registered for the
family and any form (`ANY_FORM`), else `GenericQuadrature`, which integrates on the decoder's own quadrature
nodes. A new decoder or missing model with a kernel of its own registers one `IntegratedFactor` subclass.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

Params = tuple[torch.Tensor, ...]
#: the form key of a factor that takes a family's decoder with any per-feature logit
ANY_FORM = "*"


@lru_cache(maxsize=None)  # an eigenproblem per call otherwise, and it is asked for every training step
def gauss_hermite(n_points: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Nodes t_h and weights ω_h with E_{ε~N(0,1)}[f(ε)] ≈ Σ_h ω_h f(t_h)."""
    if n_points < 1:
        raise ValueError(f"quadrature needs at least one point, got {n_points}")
    nodes, weights = np.polynomial.hermite.hermgauss(n_points)
    return tuple((nodes * math.sqrt(2.0)).tolist()), tuple((weights / math.sqrt(math.pi)).tolist())


class IntegratedFactor:
    """log Pr(s_j = 0 | z) for one (decoder family, logit form); stateless, given the two modules at each call.

    `log_prob_missing` is the factor per entry of `params`: `features` gives each entry's feature index and
    `offset` (broadcast against the entries, or None) shifts the logits (the row offset). `masked_sum` is the
    bound's missing term Σ_j keep_j log Pr(s_j = 0 | z) over the feature axis of full parameters (B, K, p, ...),
    with offset (B, K, 1) or None; a factor with a fused kernel for it overrides it.
    """

    def log_prob_missing(self, decoder: nn.Module, missing_model: nn.Module, params: Params,
                         features: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def masked_sum(self, decoder: nn.Module, missing_model: nn.Module, params: Params, keep: torch.Tensor,
                   offset: torch.Tensor | None) -> torch.Tensor:
        features = torch.arange(params[0].shape[2], device=params[0].device)
        return (keep * self.log_prob_missing(decoder, missing_model, params, features, offset)).sum(-1)


class GenericQuadrature(IntegratedFactor):
    """Any integrable decoder and any per-feature logit, on the decoder's `quadrature` nodes and log-weights."""

    def log_prob_missing(self, decoder: nn.Module, missing_model: nn.Module, params: Params,
                         features: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        nodes, log_w = decoder.quadrature(params)
        support = getattr(decoder, "support", None)
        if support is not None and features.dim() <= 1:
            nodes = support  # discrete nodes do not depend on z: score them once per (feature, level)
        logits = missing_model.feature_logits(nodes, features[..., None])
        if offset is not None:
            logits = logits + offset[..., None]
        return torch.logsumexp(log_w + F.logsigmoid(-logits), dim=-1)


_FACTORS: dict[tuple[str, str | None], IntegratedFactor] = {}
GENERIC = GenericQuadrature()


def register_factor(family: str, logit_form: str | None):
    """Class decorator: use an instance of the class for decoders of `family` and missing models whose
    `logit_form` is `logit_form` (`ANY_FORM`: any). A later registration of the same pair replaces the earlier."""
    def register(cls: type[IntegratedFactor]) -> type[IntegratedFactor]:
        if not (isinstance(cls, type) and issubclass(cls, IntegratedFactor)):
            raise TypeError(f"register_factor takes an IntegratedFactor subclass, got {cls!r}")
        _FACTORS[family, logit_form] = cls()
        return cls
    return register


def unregister_factor(family: str, logit_form: str | None) -> None:
    """Drop the factor registered for the pair (a KeyError names it when there is none)."""
    try:
        del _FACTORS[family, logit_form]
    except KeyError:
        raise KeyError(f"no integrated factor is registered for decoder family {family!r} and logit form "
                       f"{logit_form!r}") from None


def factor_for(decoder: nn.Module, missing_model: nn.Module) -> IntegratedFactor:
    """The factor for this decoder and per-feature missing model: the pair's own, the family's, or the generic."""
    family = getattr(decoder, "family", None)
    form = getattr(missing_model, "logit_form", None)
    return _FACTORS.get((family, form)) or _FACTORS.get((family, ANY_FORM)) or GENERIC
