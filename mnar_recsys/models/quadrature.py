"""log E[sigmoid(-u)] for u ~ N(m, sd²) by Gauss-Hermite quadrature, lean in memory and time.

This is the integrated missing-model factor log Pr(s_j = 0 | z) for a Gaussian decoder and a missing
model whose logit is affine in x_j. Autograd through a (rows x samples x features x nodes) tensor
costs several times more memory traffic than the quadrature itself, so the nodes are looped over
with in-place updates and the gradient is written out: with σ_h = sigmoid(-(m + sd t_h)),
  d/dm  log Σ_h ω_h σ_h = -Σ_h ω_h σ_h (1 - σ_h) / Σ_h ω_h σ_h,
  d/dsd log Σ_h ω_h σ_h = -Σ_h ω_h t_h σ_h (1 - σ_h) / Σ_h ω_h σ_h.

Accuracy: the rule integrates a smooth sigmoid well, a steep one badly. With 8 points the largest error in
log Pr(s = 0 | z), against adaptive quadrature, is 8e-6 nats for sd = |slope| x decoder sd = 1, 3e-3 at 2,
0.03 at 3, 0.1 at 4 and 0.3 at 6; more points help slowly. For steep missing processes (SVHN clipping,
slope 50) sample x_m instead (missing_factor='sampled').
"""

from __future__ import annotations

import math

import numpy as np
import torch


def gauss_hermite(n_points: int) -> tuple[list[float], list[float]]:
    """Nodes t_h and weights ω_h with E_{ε~N(0,1)}[f(ε)] ≈ Σ_h ω_h f(t_h)."""
    if n_points < 1:
        raise ValueError(f"quadrature needs at least one point, got {n_points}")
    nodes, weights = np.polynomial.hermite.hermgauss(n_points)
    return (nodes * math.sqrt(2.0)).tolist(), (weights / math.sqrt(math.pi)).tolist()


class _LogExpectedSigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mean: torch.Tensor, sd: torch.Tensor, nodes: list[float], weights: list[float]):
        neg_mean = -mean
        total = torch.zeros(torch.broadcast_shapes(mean.shape, sd.shape), dtype=mean.dtype, device=mean.device)
        sig = torch.empty_like(total)
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        # the gradient's sums are gathered here, while each σ_h is at hand, rather than recomputed later
        slope_sum = torch.zeros_like(total) if needs_grad else None
        slope_t_sum = torch.zeros_like(total) if ctx.needs_input_grad[1] else None
        slope = torch.empty_like(total) if needs_grad else None
        for t, w in zip(nodes, weights):
            torch.sub(neg_mean, sd, alpha=t, out=sig)
            sig.sigmoid_()
            total.add_(sig, alpha=w)
            if needs_grad:
                torch.addcmul(sig, sig, sig, value=-1.0, out=slope)  # σ (1 - σ)
                slope_sum.add_(slope, alpha=w)
                if slope_t_sum is not None:
                    slope_t_sum.add_(slope, alpha=w * t)
        total.clamp_min_(torch.finfo(total.dtype).tiny)
        if needs_grad:
            ctx.save_for_backward(total, slope_sum, slope_t_sum)
            ctx.shapes = (mean.shape, sd.shape)
        # the floor only matters for entries missing with probability below 1e-38, where the model is absurd
        return total.log()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        total, slope_sum, slope_t_sum = ctx.saved_tensors
        mean_shape, sd_shape = ctx.shapes
        scale = -grad_out / total
        grad_mean = (slope_sum * scale).sum_to_size(mean_shape) if ctx.needs_input_grad[0] else None
        grad_sd = (slope_t_sum * scale).sum_to_size(sd_shape) if ctx.needs_input_grad[1] else None
        return grad_mean, grad_sd, None, None


def log_expected_sigmoid(mean: torch.Tensor, sd: torch.Tensor, n_points: int = 8) -> torch.Tensor:
    """log E[sigmoid(-u)], u ~ N(mean, sd²), elementwise (mean and sd broadcast)."""
    nodes, weights = gauss_hermite(n_points)
    return _LogExpectedSigmoid.apply(mean, sd, nodes, weights)
