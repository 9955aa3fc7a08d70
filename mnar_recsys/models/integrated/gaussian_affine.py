"""A Gaussian decoder and a missing model whose logit is affine in x_j: log E[sigmoid(-u)], u ~ N(m, sd²), by
Gauss-Hermite quadrature, lean in memory and time.

u_j = slope_j x_j + intercept_j is Gaussian given z, with m = slope·loc + intercept and sd = |slope|·scale.
Autograd through a (rows x samples x features x nodes) tensor costs several times more memory traffic than the
quadrature itself, so the nodes are looped over with in-place updates and the gradient is written out: with
σ_h = sigmoid(-(m + sd t_h)),
  d/dm  log Σ_h ω_h σ_h = -Σ_h ω_h σ_h (1 - σ_h) / Σ_h ω_h σ_h,
  d/dsd log Σ_h ω_h σ_h = -Σ_h ω_h t_h σ_h (1 - σ_h) / Σ_h ω_h σ_h.
Where sd is shared along an axis (one decoder variance per feature), σ_h = 1 / (1 + e^m e^{sd t_h}) needs one
exponential per entry rather than one per (entry, node), and on a CPU torch.compile fuses the node loop, the
affine map in front and the masked sum behind into one pass. The rule integrates a smooth sigmoid well and a
steep one badly (docs/inference.md has its error by slope x decoder sd): for steep missing processes sample x_m.
"""

from __future__ import annotations

import math
from types import EllipsisType

import torch

from mnar_recsys.models.integrated.base import IntegratedFactor, Params, gauss_hermite, register_factor
from mnar_recsys.models.integrated.compiled import Compiled

_BLOCK_ENTRIES = 2 ** 18  # entries per block of rows on a CPU: the loop's five 1 MiB tensors stay in cache


def _row_blocks(shape: torch.Size) -> list[slice | EllipsisType]:
    """Slices of the leading axis holding about _BLOCK_ENTRIES entries each; one block, `...`, for a scalar
    or an empty tensor."""
    if len(shape) == 0 or shape[0] == 0:
        return [...]
    per_row = max(1, math.prod(shape[1:]))
    step = max(1, _BLOCK_ENTRIES // per_row)
    return [slice(start, start + step) for start in range(0, shape[0], step)]


def _node_loop(mean: torch.Tensor, sd: torch.Tensor, node_scales: list[torch.Tensor] | None,
               nodes: tuple[float, ...], weights: tuple[float, ...],
               log_total: torch.Tensor, d_mean: torch.Tensor | None, d_sd: torch.Tensor | None) -> None:
    """Write log Σ_h ω_h σ_h and its derivatives in m and sd (where asked for) into the given tensors, in
    place. With `node_scales` e^{sd t_h}, σ_h comes from them and e^m (`_node_scales`)."""
    total = log_total  # the sum, until its log is taken in place at the end
    for out in (total, d_mean, d_sd):
        if out is not None:
            out.zero_()  # here rather than when allocated: one block is in cache, the whole tensor is not
    sig = torch.empty_like(total)
    slope = torch.empty_like(total) if d_mean is not None or d_sd is not None else None
    if node_scales is None:
        neg_mean = mean.neg()
    else:
        exp_mean, one = mean.exp(), total.new_ones(())
    for h, (t, w) in enumerate(zip(nodes, weights)):
        if node_scales is None:
            torch.sub(neg_mean, sd, alpha=t, out=sig).sigmoid_()
        else:
            torch.addcmul(one, exp_mean, node_scales[h], out=sig).reciprocal_()
        total.add_(sig, alpha=w)
        if slope is not None:
            torch.addcmul(sig, sig, sig, value=-1.0, out=slope)  # σ (1 - σ)
            for out, alpha in ((d_mean, w), (d_sd, w * t)):
                if out is not None:
                    out.add_(slope, alpha=alpha)
    # the floor only matters for entries missing with probability below 1e-38, where the model is absurd
    total.clamp_min_(torch.finfo(total.dtype).tiny)
    for out in (d_mean, d_sd):
        if out is not None:
            out.div_(total).neg_()
    total.log_()


def _fused_node_sums(mean: torch.Tensor, node_scales: list[torch.Tensor], *, nodes: tuple[float, ...],
                     weights: tuple[float, ...],
                     needs_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """`_node_loop` with node scales, written for torch.compile, which fuses it into one pass over the
    entries rather than six per node: (log Σ_h ω_h σ_h, d/dm, d/dsd), the derivatives None without grad."""
    exp_mean = mean.exp()
    total = slope_sum = slope_t_sum = 0.0
    for scale, t, w in zip(node_scales, nodes, weights):
        sig = 1 / (1 + exp_mean * scale)
        total = total + w * sig
        if needs_grad:
            slope = sig * (1 - sig)
            slope_sum = slope_sum + w * slope
            slope_t_sum = slope_t_sum + w * t * slope
    total = total.clamp_min(torch.finfo(mean.dtype).tiny)
    if not needs_grad:
        return total.log(), None, None
    return total.log(), -slope_sum / total, -slope_t_sum / total


_compiled_node_sums = Compiled(_fused_node_sums)


def _node_scales(mean: torch.Tensor, sd: torch.Tensor, nodes: tuple[float, ...],
                 shape: torch.Size) -> list[torch.Tensor] | None:
    """e^{sd t_h} for each node, broadcast to `shape`, where factoring e^{m + sd t_h} = e^m e^{sd t_h} saves
    exponentials (sd smaller than the mean) and neither factor can overflow; None where it cannot be used.
    Only on a CPU: on a GPU the exponentials are cheap next to the kernel launches, and the overflow check
    would wait for the device."""
    if mean.device.type != "cpu" or sd.numel() >= mean.numel() or mean.numel() == 0:
        return None
    # |m|, |sd t| <= half the largest exponent keep both factors and their product finite
    limit = math.log(torch.finfo(mean.dtype).max) / 2 - 1
    low, high = torch.aminmax(mean)
    if max(-low.item(), high.item(), sd.abs().amax().item() * max(map(abs, nodes))) > limit:
        return None
    return [torch.exp(sd * t).expand(shape) for t in nodes]


class _LogExpectedSigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mean: torch.Tensor, sd: torch.Tensor, nodes: tuple[float, ...], weights: tuple[float, ...],
                grad_enabled: bool):
        mean_full, sd_full = torch.broadcast_tensors(mean, sd)  # torch.broadcast_shapes runs in Python, slowly
        shape = mean_full.shape
        # needs_input_grad stays True under torch.no_grad (imputation), where no derivative is wanted
        wants_mean, wants_sd = (grad_enabled and wants for wants in ctx.needs_input_grad[:2])
        node_scales = _node_scales(mean, sd, nodes, shape)
        fused = None if node_scales is None else _compiled_node_sums(
            mean_full, node_scales, nodes=nodes, weights=weights, needs_grad=wants_mean or wants_sd)
        if fused is not None:
            log_total, d_mean, d_sd = fused
        else:
            # the derivatives are gathered here, while each σ_h is at hand, rather than recomputed later
            log_total = torch.empty(shape, dtype=mean.dtype, device=mean.device)
            d_mean = torch.empty_like(log_total) if wants_mean else None
            d_sd = torch.empty_like(log_total) if wants_sd else None
            # on a GPU the whole tensor in one go: more, smaller kernels would only add launch overhead
            for block in _row_blocks(shape) if mean.device.type == "cpu" else [...]:
                _node_loop(mean_full[block], sd_full[block],
                           None if node_scales is None else [scale[block] for scale in node_scales],
                           nodes, weights, log_total[block],
                           None if d_mean is None else d_mean[block], None if d_sd is None else d_sd[block])
        if wants_mean or wants_sd:
            ctx.save_for_backward(d_mean, d_sd)
            ctx.shapes = (mean.shape, sd.shape)
        return log_total

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        d_mean, d_sd = ctx.saved_tensors
        mean_shape, sd_shape = ctx.shapes
        grad_mean = (grad_out * d_mean).sum_to_size(mean_shape) if ctx.needs_input_grad[0] else None
        grad_sd = (grad_out * d_sd).sum_to_size(sd_shape) if ctx.needs_input_grad[1] else None
        return grad_mean, grad_sd, None, None, None


def log_expected_sigmoid(mean: torch.Tensor, sd: torch.Tensor, n_points: int = 8) -> torch.Tensor:
    """log E[sigmoid(-u)], u ~ N(mean, sd²), elementwise (mean and sd broadcast)."""
    nodes, weights = gauss_hermite(n_points)
    return _LogExpectedSigmoid.apply(mean, sd, nodes, weights, torch.is_grad_enabled())


def log_expected_sigmoid_composed(mean: torch.Tensor, sd: torch.Tensor, nodes: tuple[float, ...],
                                  weights: tuple[float, ...]) -> torch.Tensor:
    """`log_expected_sigmoid` by the rule (nodes, weights) written as plain tensor operations, for autograd and
    torch.compile (which fuses them) inside a larger compiled graph. The nodes are a sum of H elementwise terms,
    not a trailing (..., H) axis: inductor vectorises along the entries then, where a length-H inner axis
    compiles to scalar code."""
    total = sum(w * torch.sigmoid(-(mean + sd * t)) for t, w in zip(nodes, weights))
    return total.clamp_min(torch.finfo(mean.dtype).tiny).log()


def _fused_masked_sums(loc: torch.Tensor, keep: torch.Tensor, slope: torch.Tensor, intercept: torch.Tensor,
                       offset: torch.Tensor | None, node_scales: list[torch.Tensor], *, nodes: tuple[float, ...],
                       weights: tuple[float, ...], needs_grad: bool) -> tuple[torch.Tensor, ...]:
    """`_fused_node_sums` with the affine map in front and the masked sum over the last axis behind, for
    torch.compile: (Σ_j keep_j log Σ_h ω_h σ_h, and with needs_grad keep·d/dm and keep·d/dsd per entry and
    Σ_j keep·d/dm), m = slope loc + intercept (+ offset)."""
    mean = slope * loc + intercept
    if offset is not None:
        mean = mean + offset
    log_total, d_mean, d_sd = _fused_node_sums(mean, node_scales, nodes=nodes, weights=weights,
                                               needs_grad=needs_grad)
    value = (keep * log_total).sum(-1)
    if not needs_grad:
        return (value,)
    d_mean, d_sd = keep * d_mean, keep * d_sd
    return value, d_mean, d_sd, d_mean.sum(-1)


_compiled_masked_sums = Compiled(_fused_masked_sums)


class _PrecomputedGradient(torch.autograd.Function):
    """Hands autograd the masked sum that `_fused_masked_sums` computed, with its per-entry derivatives
    (computed while each σ_h was at hand) chained to the inputs: for Σ over the batch axes of the
    upstream gradient g,  d/dloc = g d_m slope,  d/dslope = Σ g d_m loc,  d/dintercept = Σ g d_m,
    d/dsd = Σ g d_sd,  d/doffset = g Σ_j d_m."""

    @staticmethod
    def forward(ctx, loc: torch.Tensor, slope: torch.Tensor, intercept: torch.Tensor, sd: torch.Tensor,
                offset: torch.Tensor | None, fused: tuple[torch.Tensor, ...]):
        value, d_mean, d_sd, d_offset = fused
        ctx.save_for_backward(d_mean, d_sd, d_offset, loc, slope)
        ctx.shapes = (intercept.shape, sd.shape, None if offset is None else offset.shape)
        return value

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        d_mean, d_sd, d_offset, loc, slope = ctx.saved_tensors
        intercept_shape, sd_shape, offset_shape = ctx.shapes
        wants_loc, wants_slope, wants_intercept, wants_sd, wants_offset = ctx.needs_input_grad[:5]
        n_features = d_mean.shape[-1]
        # sums over the batch axes as one vector-matrix product each, without a (batch x features) product
        flat_grad = grad_out.reshape(1, -1)
        grad_loc = grad_slope = grad_intercept = grad_sd = grad_offset = None
        if wants_loc or wants_slope:
            weighted = grad_out[..., None] * d_mean
            if wants_slope and slope.numel() == 1 and loc.shape == weighted.shape:
                # the item-wise model's one slope: a dot product reads both once and writes nothing
                grad_slope = torch.dot(weighted.reshape(-1), loc.reshape(-1)).reshape(slope.shape)
            elif wants_slope:
                grad_slope = (weighted * loc).sum_to_size(slope.shape)
            if wants_loc:
                grad_loc = weighted.mul_(slope)
        if wants_intercept:
            grad_intercept = (flat_grad @ d_mean.reshape(-1, n_features)).view(n_features).sum_to_size(intercept_shape)
        if wants_sd:
            grad_sd = (flat_grad @ d_sd.reshape(-1, n_features)).view(n_features).sum_to_size(sd_shape)
        if wants_offset:
            grad_offset = (grad_out * d_offset)[..., None].sum_to_size(offset_shape)
        return grad_loc, grad_slope, grad_intercept, grad_sd, grad_offset, None


def _fusable(loc: torch.Tensor, slope: torch.Tensor, intercept: torch.Tensor, sd: torch.Tensor,
             offset: torch.Tensor | None, nodes: tuple[float, ...]) -> bool:
    """Whether `_fused_masked_sums` applies: on a CPU, with slope, intercept and sd one per feature (or one),
    and e^m and e^{sd t_h} both finite (`_node_scales`' bound, with |m| bounded through loc's range)."""
    if loc.device.type != "cpu" or loc.dim() == 0 or loc.numel() == 0 \
            or max(slope.dim(), intercept.dim(), sd.dim()) > 1:
        return False
    limit = math.log(torch.finfo(loc.dtype).max) / 2 - 1
    low, high = torch.aminmax(loc.detach())
    bound = (slope.detach().abs().amax() * max(-low, high) + intercept.detach().abs().amax()
             + (0 if offset is None else offset.detach().abs().amax()))
    return max(bound.item(), sd.detach().abs().amax().item() * max(map(abs, nodes))) <= limit


def masked_log_expected_sigmoid_sum(loc: torch.Tensor, slope: torch.Tensor, intercept: torch.Tensor,
                                    sd: torch.Tensor, keep: torch.Tensor, offset: torch.Tensor | None = None,
                                    n_points: int = 8) -> torch.Tensor:
    """Σ_j keep_j log E[sigmoid(-u_j)] over the last axis, u_j ~ N(slope_j loc_j + intercept_j + offset, sd_j²).

    The integrated missing term of a Gaussian decoder and an affine missing model: loc the decoder mean
    (..., p), keep 1 where s_j = 0, sd the logit's sd |slope_j| x decoder sd; slope, intercept and sd per
    feature (or one), offset broadcast against loc (the row offset, (B, K, 1)). On a CPU with sd one per
    feature, one compiled pass does the affine map, the quadrature, the mask and the sum, and writes the
    derivatives out, sparing the passes over memory between them (docs/performance.md); elsewhere it is the
    composition of `log_expected_sigmoid` with the mask and the sum.
    """
    nodes, weights = gauss_hermite(n_points)
    fused = None
    if _fusable(loc, slope, intercept, sd, offset, nodes):
        needs_grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (loc, slope, intercept, sd, offset))
        node_scales = [torch.exp(sd.detach() * t) for t in nodes]
        fused = _compiled_masked_sums(loc.detach(), keep, slope.detach(), intercept.detach(),
                                      None if offset is None else offset.detach(), node_scales,
                                      nodes=nodes, weights=weights, needs_grad=needs_grad)
    if fused is None:
        mean = slope * loc + intercept
        return (keep * log_expected_sigmoid(mean if offset is None else mean + offset, sd, n_points)).sum(-1)
    if len(fused) == 1:
        return fused[0]
    return _PrecomputedGradient.apply(loc, slope, intercept, sd, offset, fused)


@register_factor("gaussian", "affine")
class GaussianAffine(IntegratedFactor):
    """A Gaussian decoder (params (loc, scale), `shared_scale`, `quadrature_points`) and a missing model with
    `feature_affine`: the kernels above, the masked sum fused where the decoder's sd is one per feature."""

    @staticmethod
    def _affine(decoder: torch.nn.Module, missing_model: torch.nn.Module, params: Params,
                features: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(loc, slope, intercept, the logit's sd |slope| x decoder sd)."""
        scale = decoder.shared_scale(features)
        slope, intercept = missing_model.feature_affine(features)
        return params[0], slope, intercept, slope.abs() * (params[1] if scale is None else scale)

    def log_prob_missing(self, decoder: torch.nn.Module, missing_model: torch.nn.Module, params: Params,
                         features: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        loc, slope, intercept, sd = self._affine(decoder, missing_model, params, features)
        mean = slope * loc + intercept
        return log_expected_sigmoid(mean if offset is None else mean + offset, sd, decoder.quadrature_points)

    def masked_sum(self, decoder: torch.nn.Module, missing_model: torch.nn.Module, params: Params,
                   keep: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        features = torch.arange(params[0].shape[2], device=params[0].device)
        loc, slope, intercept, sd = self._affine(decoder, missing_model, params, features)
        return masked_log_expected_sigmoid_sum(loc, slope, intercept, sd, keep, offset, decoder.quadrature_points)
