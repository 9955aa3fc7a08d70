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

Speed on a CPU: where sd is shared along an axis (one decoder variance per feature, as in the paper's
models), σ_h = 1 / (1 + e^m e^{sd t_h}) needs one exponential per entry and one per (feature, node)
rather than one per (entry, node), and torch.compile fuses the node loop into one pass over the entries.
At the Yahoo! R3 shape (100 x 20 x 1,000) forward and backward took 9.3 ms against 18.9 ms for the
eager loop (`bench/core_speed.py`, 2 threads). The eager loop remains for per-entry sd, for GPUs and
where torch.compile has no C++ compiler. For the bound's missing term, `masked_log_expected_sigmoid_sum`
puts the affine map from the decoder mean to the logit in front of the same pass and the masked sum
over features behind it, so that no (rows x samples x features) tensor but the derivatives is written.
`masked_log_expected_sigmoid_categorical_sum` does the same for the categorical decoder's sum over its
levels, unrolled: 75 against 132 ms forward and backward for the looped kernel, 5 levels at that shape.
"""

from __future__ import annotations

import math
import warnings
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


_RECOMPILE_LIMIT = 64


class _Compiled:
    """A kernel compiled by torch.compile; the quadrature rule and whether gradients are needed are keyword
    constants, which the compiled code specialises on, so each combination (and each new input layout)
    compiles once. Dynamo stops recompiling a function after 8 versions and runs it eagerly from then on, a
    few times slower than the node loop; a process that fits several models (ranks, feature counts, shapes
    with a dimension of 1, grad or not) can need more, so the limit is raised for these calls. The function
    itself is compiled rather than a partial of it, which would share that limit with every other partial.
    Calls run without autograd, which the callers do by hand, and return None from the one on where
    compiling failed (no C++ compiler), after one warning; the caller then runs eagerly."""

    def __init__(self, function):
        self.function = function
        self.compiled = None  # built at the first call: torch.compile's machinery takes seconds to import
        self.eager = False

    def __call__(self, *tensors, **constants):
        if self.eager:
            return None
        if self.compiled is None:
            self.compiled = torch.compile(self.function, dynamic=True)
        try:
            with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT):
                return self.compiled(*tensors, **constants)
        except torch._dynamo.exc.BackendCompilerFailed as error:
            warnings.warn(f"torch.compile could not build the quadrature kernel ({str(error).splitlines()[0]}); "
                          "it runs eagerly from now on, 2 to 3 times slower", RuntimeWarning, stacklevel=3)
            self.eager = True
            return None


_compiled_node_sums = _Compiled(_fused_node_sums)


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


_compiled_masked_sums = _Compiled(_fused_masked_sums)


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
    derivatives out, sparing the passes over memory between them: at the Yahoo! R3 shape on the 2-core
    machine, 8.0 against 14.0 ms forward alone (imputation) and 23.5 against 28.3 ms with the backward pass,
    against composing `log_expected_sigmoid` with the mask and sum (`bench/core_speed.py`). Elsewhere it is
    that composition.
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
    def forward(ctx, level_logits: torch.Tensor, selection: torch.Tensor, offset: torch.Tensor | None,
                grad_enabled: bool):
        shape = level_logits.shape[:-1]
        if torch.broadcast_shapes(shape, selection.shape[:-1], *(() if offset is None else (offset.shape,))) != shape:
            raise ValueError(f"the level logits {tuple(level_logits.shape)} must have the full shape: selection "
                             f"{tuple(selection.shape)} and offset {None if offset is None else tuple(offset.shape)} "
                             "may only broadcast against them")
        top = level_logits.amax(-1)
        scaled_sum = level_logits.new_zeros(shape)
        tilted_sum = level_logits.new_zeros(shape)
        # without gradients (imputation: needs_input_grad stays True under torch.no_grad) each level is freed
        keep = grad_enabled and any(ctx.needs_input_grad)
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
        wants_levels, wants_selection, wants_offset = ctx.needs_input_grad[:3]
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
        return levels, torch.stack(grad_selection, -1) if wants_selection else None, grad_offset, None


def log_expected_sigmoid_categorical(level_logits: torch.Tensor, selection: torch.Tensor,
                                     offset: torch.Tensor | None = None) -> torch.Tensor:
    """log E[sigmoid(-(s_x + offset))] over x ~ Categorical(softmax(level_logits)), exactly.

    level_logits (..., p, C); selection (..., p, C), the missing model's logit at each level, and offset,
    which shifts every level's logit (the row offset), broadcast against the level logits without
    enlarging them.
    """
    return _LogExpectedSigmoidCategorical.apply(level_logits, selection, offset, torch.is_grad_enabled())


def _fused_level_sums(level_logits: torch.Tensor, keep: torch.Tensor, selection: torch.Tensor,
                      offset: torch.Tensor | None, *, needs_grad: bool) -> tuple[torch.Tensor, ...]:
    """`_LogExpectedSigmoidCategorical`'s forward for torch.compile, the levels unrolled so that it is one
    pass over the entries: log T - log S per entry (..., p), and with needs_grad keep·d/dl (..., p, C) laid
    out level-major, keep·d/ds level-major (..., C, p), and Σ_c keep·d/ds (..., p)."""
    levels = level_logits.unbind(-1)
    top = levels[0]
    for logits in levels[1:]:
        top = torch.maximum(top, logits)
    exps = [(logits - top).exp() for logits in levels]
    missing = [torch.sigmoid(-(s if offset is None else s + offset)) for s in selection.unbind(-1)]
    scaled, tilted = exps[0], exps[0] * missing[0]
    for exp_c, missing_c in zip(exps[1:], missing[1:]):
        scaled, tilted = scaled + exp_c, tilted + exp_c * missing_c
    tilted = tilted.clamp_min(torch.finfo(level_logits.dtype).tiny)
    value = tilted.log() - scaled.log()
    if not needs_grad:
        return (value,)
    per_tilted, per_scaled = keep / tilted, keep / scaled
    d_levels = torch.stack([e * q * per_tilted - e * per_scaled for e, q in zip(exps, missing)], -2)
    d_selection = torch.stack([-e * q * (1 - q) * per_tilted for e, q in zip(exps, missing)], -2)
    return value, d_levels.transpose(-1, -2), d_selection, d_selection.sum(-2)


_compiled_level_sums = _Compiled(_fused_level_sums)


class _PrecomputedLevelGradient(torch.autograd.Function):
    """Hands autograd the masked sum Σ_j keep_j value_j of `_fused_level_sums`' per-entry values, with the
    derivatives it wrote chained to the inputs: for the upstream gradient g (...,),  d/dl = g d_l,
    d/ds = Σ over the batch axes of g d_s,  d/doffset = g Σ_j,c d_s."""

    @staticmethod
    def forward(ctx, level_logits: torch.Tensor, selection: torch.Tensor, offset: torch.Tensor | None,
                keep: torch.Tensor, fused: tuple[torch.Tensor, ...]):
        value, d_levels, d_selection, d_offset = fused
        ctx.save_for_backward(d_levels, d_selection, d_offset)
        ctx.offset_shape = None if offset is None else offset.shape
        return (keep * value).sum(-1)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        d_levels, d_selection, d_offset = ctx.saved_tensors
        wants_levels, wants_selection, wants_offset = ctx.needs_input_grad[:3]
        grad_levels = grad_out[..., None, None] * d_levels if wants_levels else None
        grad_selection = grad_offset = None
        if wants_selection:  # a sum over the batch axes as one vector-matrix product, as in `_PrecomputedGradient`
            n_levels, n_features = d_selection.shape[-2:]
            grad_selection = (grad_out.reshape(1, -1) @ d_selection.reshape(-1, n_levels * n_features)
                              ).view(n_levels, n_features).T
        if wants_offset:
            grad_offset = (grad_out * d_offset.sum(-1))[..., None].sum_to_size(ctx.offset_shape)
        return grad_levels, grad_selection, grad_offset, None, None


def masked_log_expected_sigmoid_categorical_sum(level_logits: torch.Tensor, selection: torch.Tensor,
                                                keep: torch.Tensor, offset: torch.Tensor | None = None
                                                ) -> torch.Tensor:
    """Σ_j keep_j log E[sigmoid(-(s_x + offset))] over the last feature axis, x ~ Categorical(softmax(l_j)).

    The categorical decoder's integrated missing term: level_logits (..., p, C), selection (p, C) the missing
    model's logit at each level, keep 1 where s_j = 0, broadcast against (..., p), and offset the row offset
    (..., 1). On a CPU one compiled pass computes every entry's sum over levels and its derivatives; fastest
    with level-major logits, the categorical decoder's layout. Elsewhere it is the masked sum of
    `log_expected_sigmoid_categorical`.
    """
    fused = None
    if level_logits.device.type == "cpu" and level_logits.dim() >= 3 and level_logits.numel() > 0 \
            and selection.shape == level_logits.shape[-2:] \
            and (offset is None or offset.shape == (*level_logits.shape[:-2], 1)):
        needs_grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (level_logits, selection, offset))
        fused = _compiled_level_sums(level_logits.detach(), keep, selection.detach(),
                                     None if offset is None else offset.detach(), needs_grad=needs_grad)
    if fused is None:
        return (keep * log_expected_sigmoid_categorical(level_logits, selection, offset)).sum(-1)
    if len(fused) == 1:
        return (keep * fused[0]).sum(-1)
    return _PrecomputedLevelGradient.apply(level_logits, selection, offset, keep, fused)
