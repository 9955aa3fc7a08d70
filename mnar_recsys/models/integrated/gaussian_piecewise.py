"""A Gaussian decoder and the level-wise missing model: log E[sigmoid(-(g(x) + b))], x ~ N(mean, sd²), with g
piecewise linear on the rating levels, by Gauss-Hermite quadrature with its gradient written out."""

from __future__ import annotations

import torch

from mnar_recsys.models.gather import take
from mnar_recsys.models.integrated.base import IntegratedFactor, Params, gauss_hermite, register_factor


class _LogExpectedSigmoidPiecewise(torch.autograd.Function):
    """log E[sigmoid(-(g(x) + b))], x ~ N(mean, sd²), g piecewise linear on the knots lo, lo + 1, ...

    The same node loop as `_LogExpectedSigmoid`, with u_h = g(x_h) + b. With ρ_h = ω_h σ_h (1 - σ_h)
    and c_l(x) the weight of knot l in the interpolation of g(x) (so Σ_l c_l = 1 on the clamped range):
      d/dmean = -Σ_h ρ_h g'(x_h) / Σ_h ω_h σ_h,   d/dsd = -Σ_h ρ_h t_h g'(x_h) / Σ_h ω_h σ_h,
      d/dg_l  = -Σ_h ρ_h c_l(x_h) / Σ_h ω_h σ_h,   d/db   = Σ_l d/dg_l.
    """

    @staticmethod
    def forward(ctx, mean: torch.Tensor, sd: torch.Tensor, knot_logits: torch.Tensor, intercept: torch.Tensor,
                lo: float, nodes: tuple[float, ...], weights: tuple[float, ...], grad_enabled: bool):
        shape = torch.broadcast_shapes(mean.shape, sd.shape, intercept.shape)
        last = knot_logits.numel() - 1
        slopes = knot_logits.diff()
        offset = mean - lo
        total = torch.zeros(shape, dtype=mean.dtype, device=mean.device)
        grads = [grad_enabled and wants for wants in ctx.needs_input_grad]  # none under torch.no_grad
        slope_sum = torch.zeros_like(total) if grads[0] or grads[1] else None
        slope_t_sum = torch.zeros_like(total) if grads[1] else None
        knot_sum = total.new_zeros((last + 1, *shape)) if grads[2] or grads[3] else None
        for t, w in zip(nodes, weights):
            position = torch.add(offset, sd, alpha=t).expand(shape).clamp(0, last)
            left = position.floor().clamp_(max=last - 1)
            fraction = position - left
            left = left.long()
            segment = slopes[left]
            sig = torch.neg_(knot_logits[left].addcmul_(fraction, segment).add_(intercept)).sigmoid_()
            total.add_(sig, alpha=w)
            if slope_sum is None and knot_sum is None:
                continue
            rho = sig.mul_(1 - sig).mul_(w)
            if slope_sum is not None:
                inside = (position > 0) & (position < last)  # g is flat beyond the end knots
                slope_rho = segment.mul_(rho).mul_(inside)
                slope_sum.add_(slope_rho)
                if slope_t_sum is not None:
                    slope_t_sum.add_(slope_rho, alpha=t)
            if knot_sum is not None:
                knot_sum.scatter_add_(0, left[None], (rho * (1 - fraction))[None])
                knot_sum.scatter_add_(0, left[None] + 1, (rho * fraction)[None])
        total.clamp_min_(torch.finfo(total.dtype).tiny)
        ctx.save_for_backward(total, slope_sum, slope_t_sum, knot_sum)
        ctx.shapes = (mean.shape, sd.shape, intercept.shape)
        return total.log()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        total, slope_sum, slope_t_sum, knot_sum = ctx.saved_tensors
        mean_shape, sd_shape, intercept_shape = ctx.shapes
        grads = ctx.needs_input_grad
        scale = -grad_out / total
        grad_mean = (slope_sum * scale).sum_to_size(mean_shape) if grads[0] else None
        grad_sd = (slope_t_sum * scale).sum_to_size(sd_shape) if grads[1] else None
        grad_knots = grad_intercept = None
        if knot_sum is not None:
            per_knot = knot_sum * scale
            grad_knots = per_knot.flatten(1).sum(1) if grads[2] else None
            grad_intercept = per_knot.sum(0).sum_to_size(intercept_shape) if grads[3] else None
        return grad_mean, grad_sd, grad_knots, grad_intercept, None, None, None, None


def log_expected_sigmoid_piecewise(mean: torch.Tensor, sd: torch.Tensor, knot_logits: torch.Tensor,
                                   intercept: torch.Tensor, lo: float, n_points: int = 8) -> torch.Tensor:
    """log E[sigmoid(-(g(x) + intercept))], x ~ N(mean, sd²), elementwise (mean, sd, intercept broadcast).

    g takes the values `knot_logits` at lo, lo + 1, ..., is linear between them and constant beyond the
    ends (the item-wise level model, `LevelwiseLogistic`). Same Gauss-Hermite nodes as
    `log_expected_sigmoid`; the kinks of g make the rule less accurate than for a smooth logit.
    """
    nodes, weights = gauss_hermite(n_points)
    return _LogExpectedSigmoidPiecewise.apply(mean, sd, knot_logits, intercept, float(lo), nodes, weights,
                                              torch.is_grad_enabled())


@register_factor("gaussian", "piecewise-linear")
class GaussianPiecewise(IntegratedFactor):
    """A Gaussian decoder and a missing model with `level_logits()`, per-feature `bias` and knots from `lo`."""

    def log_prob_missing(self, decoder: torch.nn.Module, missing_model: torch.nn.Module, params: Params,
                         features: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        scale = decoder.shared_scale(features)
        bias = take(missing_model.bias, features)
        return log_expected_sigmoid_piecewise(params[0], params[1] if scale is None else scale,
                                              missing_model.level_logits(), bias if offset is None else bias + offset,
                                              missing_model.lo, decoder.quadrature_points)
