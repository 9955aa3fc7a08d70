"""log E[sigmoid(-u)] for u ~ N(m, sd²) by Gauss-Hermite quadrature, lean in memory and time; and the
same expectation under a categorical decoder, summed exactly over its levels.

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
from functools import lru_cache
from types import EllipsisType

import numpy as np
import torch


@lru_cache(maxsize=None)  # an eigenproblem per call otherwise, and it is asked for every training step
def gauss_hermite(n_points: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Nodes t_h and weights ω_h with E_{ε~N(0,1)}[f(ε)] ≈ Σ_h ω_h f(t_h)."""
    if n_points < 1:
        raise ValueError(f"quadrature needs at least one point, got {n_points}")
    nodes, weights = np.polynomial.hermite.hermgauss(n_points)
    return tuple((nodes * math.sqrt(2.0)).tolist()), tuple((weights / math.sqrt(math.pi)).tolist())


_BLOCK_ENTRIES = 2 ** 18  # entries per block of rows on a CPU: the loop's five 1 MiB tensors stay in cache


def _row_blocks(shape: torch.Size) -> list[slice | EllipsisType]:
    """Slices of the leading axis holding about _BLOCK_ENTRIES entries each; one block, `...`, for a scalar
    or an empty tensor."""
    if len(shape) == 0 or shape[0] == 0:
        return [...]
    per_row = max(1, math.prod(shape[1:]))
    step = max(1, _BLOCK_ENTRIES // per_row)
    return [slice(start, start + step) for start in range(0, shape[0], step)]


def _node_loop(neg_mean: torch.Tensor, sd: torch.Tensor, nodes: tuple[float, ...], weights: tuple[float, ...],
               total: torch.Tensor, slope_sum: torch.Tensor | None, slope_t_sum: torch.Tensor | None) -> None:
    """Write Σ_h ω_h σ_h, and for the gradient Σ_h ω_h σ_h (1 - σ_h) and Σ_h ω_h t_h σ_h (1 - σ_h), into the
    given tensors, in place."""
    for out in (total, slope_sum, slope_t_sum):
        if out is not None:
            out.zero_()  # here rather than when allocated: one block is in cache, the whole tensor is not
    sig = torch.empty_like(total)
    slope = torch.empty_like(total) if slope_sum is not None else None
    for t, w in zip(nodes, weights):
        torch.sub(neg_mean, sd, alpha=t, out=sig)
        sig.sigmoid_()
        total.add_(sig, alpha=w)
        if slope is not None:
            torch.addcmul(sig, sig, sig, value=-1.0, out=slope)  # σ (1 - σ)
            slope_sum.add_(slope, alpha=w)
            if slope_t_sum is not None:
                slope_t_sum.add_(slope, alpha=w * t)


class _LogExpectedSigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mean: torch.Tensor, sd: torch.Tensor, nodes: tuple[float, ...], weights: tuple[float, ...]):
        neg_mean, sd_full = torch.broadcast_tensors(-mean, sd)  # torch.broadcast_shapes runs in Python, slowly
        shape = neg_mean.shape
        total = torch.empty(shape, dtype=mean.dtype, device=mean.device)
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        # the gradient's sums are gathered here, while each σ_h is at hand, rather than recomputed later
        slope_sum = torch.empty_like(total) if needs_grad else None
        slope_t_sum = torch.empty_like(total) if ctx.needs_input_grad[1] else None
        # on a GPU the whole tensor in one go: more, smaller kernels would only add launch overhead
        for block in _row_blocks(shape) if total.device.type == "cpu" else [...]:
            _node_loop(neg_mean[block], sd_full[block], nodes, weights, total[block],
                       None if slope_sum is None else slope_sum[block],
                       None if slope_t_sum is None else slope_t_sum[block])
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


class _LogExpectedSigmoidPiecewise(torch.autograd.Function):
    """log E[sigmoid(-(g(x) + b))], x ~ N(mean, sd²), g piecewise linear on the knots lo, lo + 1, ...

    The same node loop as `_LogExpectedSigmoid`, with u_h = g(x_h) + b. With ρ_h = ω_h σ_h (1 - σ_h)
    and c_l(x) the weight of knot l in the interpolation of g(x) (so Σ_l c_l = 1 on the clamped range):
      d/dmean = -Σ_h ρ_h g'(x_h) / Σ_h ω_h σ_h,   d/dsd = -Σ_h ρ_h t_h g'(x_h) / Σ_h ω_h σ_h,
      d/dg_l  = -Σ_h ρ_h c_l(x_h) / Σ_h ω_h σ_h,   d/db   = Σ_l d/dg_l.
    """

    @staticmethod
    def forward(ctx, mean: torch.Tensor, sd: torch.Tensor, knot_logits: torch.Tensor, intercept: torch.Tensor,
                lo: float, nodes: tuple[float, ...], weights: tuple[float, ...]):
        shape = torch.broadcast_shapes(mean.shape, sd.shape, intercept.shape)
        last = knot_logits.numel() - 1
        slopes = knot_logits.diff()
        offset = mean - lo
        total = torch.zeros(shape, dtype=mean.dtype, device=mean.device)
        grads = ctx.needs_input_grad
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
        return grad_mean, grad_sd, grad_knots, grad_intercept, None, None, None


def log_expected_sigmoid_piecewise(mean: torch.Tensor, sd: torch.Tensor, knot_logits: torch.Tensor,
                                   intercept: torch.Tensor, lo: float, n_points: int = 8) -> torch.Tensor:
    """log E[sigmoid(-(g(x) + intercept))], x ~ N(mean, sd²), elementwise (mean, sd, intercept broadcast).

    g takes the values `knot_logits` at lo, lo + 1, ..., is linear between them and constant beyond the
    ends (the item-wise level model, `LevelwiseLogistic`). Same Gauss-Hermite nodes as
    `log_expected_sigmoid`; the kinks of g make the rule less accurate than for a smooth logit.
    """
    nodes, weights = gauss_hermite(n_points)
    return _LogExpectedSigmoidPiecewise.apply(mean, sd, knot_logits, intercept, float(lo), nodes, weights)


class _LogExpectedSigmoidCategorical(torch.autograd.Function):
    """log Σ_c π_c σ(-(s_c + a)) with π = softmax(level logits): the categorical decoder's exact sum.

    The level axis is short (5 for ratings) and PyTorch's softmax and logsumexp are slow along a short
    last axis on CPUs (3 times slower at the Yahoo! R3 shape), so the levels are looped over, each step
    a pass over one (rows x samples x items) slice, and the gradient is written out. With
    e_c = exp(l_c - max l), S = Σ_c e_c, q_c = σ(-(s_c + a)) and T = Σ_c e_c q_c, the value is
    log T - log S and
      d/dl_c = e_c q_c / T - e_c / S,   d/ds_c = d/da_c = -e_c q_c (1 - q_c) / T.
    """

    @staticmethod
    def forward(ctx, level_logits: torch.Tensor, selection: torch.Tensor, offset: torch.Tensor | None):
        shape = level_logits.shape[:-1]
        if torch.broadcast_shapes(shape, selection.shape[:-1], *(() if offset is None else (offset.shape,))) != shape:
            raise ValueError(f"the level logits {tuple(level_logits.shape)} must have the full shape: selection "
                             f"{tuple(selection.shape)} and offset {None if offset is None else tuple(offset.shape)} "
                             "may only broadcast against them")
        top = level_logits.amax(-1)
        scaled_sum = level_logits.new_zeros(shape)
        tilted_sum = level_logits.new_zeros(shape)
        keep = any(ctx.needs_input_grad)  # without gradients (imputation) each level is freed as it goes
        exps, missing = [], []
        for c in range(level_logits.shape[-1]):
            exp_c = torch.sub(level_logits[..., c], top).exp_()
            neg_logit_c = selection[..., c].neg()
            missing_c = (neg_logit_c if offset is None else neg_logit_c - offset).sigmoid()
            scaled_sum.add_(exp_c)
            tilted_sum.addcmul_(exp_c, missing_c)
            if keep:
                exps.append(exp_c)
                missing.append(missing_c)
        # as in `_LogExpectedSigmoid`, a floor for entries missing with probability below 1e-38
        tilted_sum.clamp_min_(torch.finfo(tilted_sum.dtype).tiny)
        ctx.save_for_backward(scaled_sum, tilted_sum, *exps, *missing)
        ctx.shapes = (level_logits.shape, selection.shape, None if offset is None else offset.shape)
        return tilted_sum.log() - scaled_sum.log()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        scaled_sum, tilted_sum, *saved = ctx.saved_tensors
        n_levels = len(saved) // 2
        logits_shape, selection_shape, offset_shape = ctx.shapes
        wants_levels, wants_selection, wants_offset = ctx.needs_input_grad
        per_tilted = grad_out / tilted_sum
        per_scaled = grad_out / scaled_sum if wants_levels else None
        levels = grad_out.new_empty(logits_shape) if wants_levels else None
        grad_selection, grad_offset = [], None
        for c, (exp_c, missing_c) in enumerate(zip(saved[:n_levels], saved[n_levels:])):
            exp_missing = exp_c * missing_c
            if wants_levels:
                torch.mul(exp_missing, per_tilted, out=levels[..., c]).addcmul_(exp_c, per_scaled, value=-1)
            if not (wants_selection or wants_offset):
                continue
            weighted = exp_missing.mul_(per_tilted)
            grad_logit = torch.addcmul(weighted, weighted, missing_c, value=-1).neg_()
            if wants_selection:
                grad_selection.append(grad_logit.sum_to_size(selection_shape[:-1]))
            if wants_offset:
                grad_c = grad_logit.sum_to_size(offset_shape)
                grad_offset = grad_c if grad_offset is None else grad_offset + grad_c
        return levels, torch.stack(grad_selection, -1) if wants_selection else None, grad_offset


def log_expected_sigmoid_categorical(level_logits: torch.Tensor, selection: torch.Tensor,
                                     offset: torch.Tensor | None = None) -> torch.Tensor:
    """log E[sigmoid(-(s_x + offset))] over x ~ Categorical(softmax(level_logits)), exactly.

    level_logits (..., p, C); selection (..., p, C), the missing model's logit at each level, and offset,
    which shifts every level's logit (the row offset), broadcast against the level logits without
    enlarging them.
    """
    return _LogExpectedSigmoidCategorical.apply(level_logits, selection, offset)
