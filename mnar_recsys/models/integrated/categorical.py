"""A categorical decoder and any per-feature missing model: log Σ_c π_c sigmoid(-(s_c + a)), exact over the levels.

The level axis is short (5 for ratings) and PyTorch's softmax and logsumexp are slow along a short last axis on
CPUs, so the levels are looped over (unrolled, and compiled on a CPU, for the bound's masked sum) and the
gradient is written out.
"""

from __future__ import annotations

import torch

from mnar_recsys.models.integrated.base import ANY_FORM, IntegratedFactor, Params, register_factor
from mnar_recsys.models.integrated.compiled import Compiled


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


_compiled_level_sums = Compiled(_fused_level_sums)


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


@register_factor("categorical", ANY_FORM)
class Categorical(IntegratedFactor):
    """A decoder with level logits (B, K, p, C) over its `support` and a missing model with `feature_logits`."""

    @staticmethod
    def _selection(decoder: torch.nn.Module, missing_model: torch.nn.Module, features: torch.Tensor) -> torch.Tensor:
        """The missing model's logit at each level, for the given features: (..., C)."""
        return missing_model.feature_logits(decoder.support, features[..., None])

    def log_prob_missing(self, decoder: torch.nn.Module, missing_model: torch.nn.Module, params: Params,
                         features: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        return log_expected_sigmoid_categorical(params[0], self._selection(decoder, missing_model, features), offset)

    def masked_sum(self, decoder: torch.nn.Module, missing_model: torch.nn.Module, params: Params,
                   keep: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        features = torch.arange(params[0].shape[2], device=params[0].device)
        return masked_log_expected_sigmoid_categorical_sum(params[0], self._selection(decoder, missing_model, features),
                                                           keep, offset)
