"""Many fits in one: R runs of one (not-)MIWAE architecture trained as one vectorised model.

The runs' parameters are stacked along a leading axis (`torch.func.stack_module_state`) and held in one flat
tensor, every dense layer is one batched product for all runs, and a training step is one function of them:
the gradient by `torch.func.grad` and Adam's update, which torch.compile builds as one graph where the job
compiles, with no autograd engine or optimiser call of its own around it. Each run keeps what `fit` gives it:
its split and batch order (numpy streams 0 and 1 of its seed), its noise (torch seeded by `step_seed` before
each draw, as `fit` seeds it), its held-out selection and its history, so that its parameters equal its single
fit's up to float rounding. The stacked pass replaces the models' forward: what it supports is spelt out here.

Supported (the dense UCI models, `unsupported_reason` says why another is not): an MLP encoder; a Gaussian
decoder with a dense trunk (the 'gaussian' and the PPCA-like 'linear' decoders, any variance and squash);
the MCAR missing model (the MIWAE), a per-feature missing model with an affine logit ('self-masking',
'self-masking-known', 'itemwise') and x_m integrated out, or the agnostic model with x_m drawn; no row
offset, no subsampled missing term; dense layers with tanh or ReLU between them; one process. A new
configuration adds its pass to `_stacked_bound` and its case to `unsupported_reason`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import fields
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap
from tqdm.auto import tqdm

from mnar_recsys.data.rows import RowSource
from mnar_recsys.denormals import denormals_flushed
from mnar_recsys.devices import cpu_normal, resolve_device
from mnar_recsys.models.activations import tanh_rational
from mnar_recsys.models.bound import importance_weighted_bound
from mnar_recsys.models.decoders import GaussianDecoder, gaussian_log_prob, sd_from_raw, squashed
from mnar_recsys.models.encoders import LOGVAR_MAX, LOGVAR_MIN, MLPEncoder
from mnar_recsys.models.integrated import compiled
from mnar_recsys.models.integrated.base import gauss_hermite
from mnar_recsys.models.integrated.gaussian_affine import (
    log_expected_sigmoid_composed,
    masked_log_expected_sigmoid_sum,
)
from mnar_recsys.models.missing import Agnostic, bernoulli_log_prob
from mnar_recsys.models.notmiwae import NotMIWAE
from mnar_recsys.training import distributed
from mnar_recsys.training.seeds import step_seed
from mnar_recsys.training.trainer import (
    _BATCHES,
    History,
    TrainConfig,
    TrainingDiverged,
    _batches,
    _row_seed,
    _split_rows,
    non_finite_parameter,
)

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
#: the TrainConfig fields that may differ between the runs of one stacked fit
PER_RUN_FIELDS = ("seed", "log_every", "progress")
_ACTIVATIONS = (nn.Tanh, nn.ReLU)
_VALIDATION_ROWS = 4096  # held-out rows per stacked pass: bounds the (R, rows, K, width) activations
#: torch.optim.Adam's defaults, those of `fit`'s optimiser
_ADAM_BETAS, _ADAM_EPS = (0.9, 0.999), 1e-8


class UnsupportedStack(ValueError):
    """The models cannot be trained as one stacked fit: the message says why."""


def unsupported_reason(model: NotMIWAE) -> str | None:
    """Why `model`'s architecture has no stacked pass (None when it has one; the module docstring lists them)."""
    encoder, decoder, missing = model.encoder, model.decoder, model.missing_model
    if not isinstance(encoder, MLPEncoder):
        return f"the encoder is a {type(encoder).__name__}; the stacked pass has the MLP encoder only"
    if not _is_mlp(encoder.body):
        return "the MLP encoder has layers other than Linear, Tanh and ReLU, which the stacked pass does not have"
    if not isinstance(decoder, GaussianDecoder) or decoder.mean_head is None or not _is_mlp(decoder.trunk):
        return f"the decoder is a {type(decoder).__name__} without a dense trunk; the stacked pass has the Gaussian one"
    if model.row_offset is not None:
        return "the model has a row offset, which the stacked pass does not have"
    if model.unobserved_samples is not None and not missing.is_mcar:
        return "the missing term is subsampled (unobserved_samples), which the stacked pass does not do"
    if isinstance(missing, Agnostic):
        return None if model.missing_factor == "sampled" else "the agnostic model's x_m is sampled, not integrated"
    if not missing.is_mcar and not (missing.per_feature and getattr(missing, "logit_form", None) == "affine"):
        return (f"the missing model is {type(missing).__name__}; the stacked pass has the MCAR one, the agnostic "
                "one and per-feature ones with an affine logit")
    if not missing.is_mcar and not any(True for _ in missing.parameters()):
        return f"the missing model {type(missing).__name__} is fixed (no parameters); the stacked pass learns one"
    if not missing.is_mcar and model.missing_factor != "integrated":
        return "x_m is sampled; the stacked pass integrates it out (missing_factor='integrated')"
    return None


def _is_mlp(module: nn.Module) -> bool:
    """Dense layers and tanh / ReLU activations, in (nested) sequences, or nothing at all."""
    if isinstance(module, nn.Sequential):
        return all(_is_mlp(part) for part in module)
    return isinstance(module, (nn.Linear, nn.Identity, *_ACTIVATIONS))


def check_stackable(models: list[NotMIWAE], configs: list[TrainConfig]) -> None:
    """Raise UnsupportedStack unless the models share one supported architecture and the configs agree on
    everything but PER_RUN_FIELDS."""
    if not models or len(models) != len(configs):
        raise UnsupportedStack(f"a stacked fit takes as many configs as models (at least one), got {len(models)} "
                               f"models and {len(configs)} configs")
    reason = unsupported_reason(models[0])
    if reason is not None:
        raise UnsupportedStack(f"no stacked fit for this model: {reason}")
    template = _signature(models[0])
    for run, model in enumerate(models[1:], 1):
        if _signature(model) != template:
            raise UnsupportedStack(f"model {run} differs from model 0 in its architecture or parameter shapes; a "
                                   "stacked fit trains runs of one architecture")
    for f in fields(TrainConfig):
        values = {repr(getattr(config, f.name)) for config in configs}
        if f.name not in PER_RUN_FIELDS and len(values) > 1:
            raise UnsupportedStack(f"the runs' configs differ in {f.name} ({', '.join(sorted(values))}); only "
                                   f"{', '.join(PER_RUN_FIELDS)} may differ within a stacked fit")
    if distributed.world_size() > 1:
        raise UnsupportedStack("a stacked fit runs in one process; use `fit` in a process group")


def stackable(models: list[NotMIWAE], configs: list[TrainConfig]) -> bool:
    """Whether `fit_stacked` takes these models and configs (`check_stackable` says why not)."""
    try:
        check_stackable(models, configs)
    except UnsupportedStack:
        return False
    return True


def _signature(model: NotMIWAE) -> tuple:
    """What two models of one architecture share: modules, parameter shapes, and the settings the pass reads."""
    decoder, missing = model.decoder, model.missing_model
    settings = (model.missing_factor, model.unobserved_samples, getattr(decoder, "variance", None),
                getattr(decoder, "squash", None), getattr(decoder, "min_variance", None),
                getattr(decoder, "quadrature_points", None), getattr(missing, "sign", None))
    shapes = tuple((name, tuple(p.shape)) for name, p in model.named_parameters())
    return repr(model), settings, shapes


def fit_stacked(models: list[NotMIWAE], data: "np.ndarray | sp.spmatrix | RowSource", configs: list[TrainConfig],
                initialise_missing: bool = True) -> list[History]:
    """Train each model with its config as `fit(model, data, config)` would, all in one vectorised fit; write
    the results back into the models (fitted `NotMIWAE`s, in eval mode) and return their histories.

    Raises UnsupportedStack (a ValueError) for models or configs it cannot stack, before any training, and
    TrainingDiverged, naming the run, where `fit` would raise it.
    """
    check_stackable(models, configs)
    config = configs[0]
    n_shards = config.shards or 1
    splits = [_split_rows(model, data, run_config, n_shards) for model, run_config in zip(models, configs)]
    rows = splits[0][0]
    device = resolve_device(config.device)
    if initialise_missing:  # from each run's training rows alone, as `fit` does
        for model, (_, training, _) in zip(models, splits):
            model.missing_model.initialise(*rows.observed_summary(np.sort(training)))
    for model in models:
        model.to(device).train()
    stack = _StackedModel(models)
    everything = rows.batch(np.arange(rows.n_rows)).to(device)
    values, mask = everything.values, everything.mask
    histories = [History() for _ in models]
    best_values = [-float("inf")] * len(models)
    best = None
    running: list[float] | None = None
    orders = [_batches(training.size, config.batch_size, np.random.default_rng(_row_seed(c.seed, _BATCHES)))
              for (_, training, _), c in zip(splits, configs)]
    validation = np.stack([held_out for _, _, held_out in splits])
    batch_rows = min(config.batch_size, splits[0][1].size)  # every batch's, as `_batches` cuts them
    shard_sizes = [shard.size for shard in distributed.shards_of(np.arange(batch_rows), n_shards)]
    bar = tqdm(range(1, config.iterations + 1), disable=not any(c.progress for c in configs), desc="training (stacked)",
               mininterval=0.5)
    # a short fit runs the quadrature kernels eagerly, as `fit` does (models.integrated.compiled)
    with compiled.job(config.iterations), denormals_flushed():
        for iteration in bar:
            batch = np.stack([training[next(order)] for (_, training, _), order in zip(splits, orders)])
            index = torch.from_numpy(batch).to(device)
            noise = _noise(configs, iteration, 0, shard_sizes, config.n_samples, stack.latent_dim, device,
                           n_features=stack.sampled_features)
            sums = stack.step(index, values, mask, *noise, _adam_schedule(iteration, config.lr, device))  # (R,)
            step_values = (sums.double() / batch.shape[1]).tolist()  # the one host synchronisation a step
            _check_finite(step_values, configs, iteration)
            running = step_values if running is None else [0.98 * r + 0.02 * v for r, v in zip(running, step_values)]
            for history, run_config, value in zip(histories, configs, running):
                if iteration % run_config.log_every == 0 or iteration == config.iterations:
                    history.bound.append((iteration, value))
            if validation.shape[1] and (iteration % config.validation_every == 0 or iteration == config.iterations):
                held_out = stack.mean_bound(values, mask, validation, configs, iteration)
                improved = [run for run, value in enumerate(held_out) if value > best_values[run]]
                for run in improved:
                    best_values[run] = held_out[run]
                    histories[run].best_iteration = iteration
                if improved:
                    best = stack.keep(best, improved)
                for history, value in zip(histories, held_out):
                    history.validation.append((iteration, value))
    stack.write_back(models, best, [history.best_iteration is not None for history in histories])
    for run, (model, run_config) in enumerate(zip(models, configs)):
        bad = non_finite_parameter(model)
        if bad is not None:  # the last step's bound was finite, but the update after it need not be
            raise TrainingDiverged(f"training diverged: run {run} (seed {run_config.seed}), after {config.iterations} "
                                   f"iterations {bad} (lr {config.lr}; a smaller one may train)")
        model.eval()
    return histories


def _check_finite(values: list[float], configs: list[TrainConfig], iteration: int) -> None:
    for run, (value, config) in enumerate(zip(values, configs)):
        if not math.isfinite(value):
            raise TrainingDiverged(f"training diverged at iteration {iteration}: run {run} (seed {config.seed}) has "
                                   f"the batch's mean bound {value} (lr {config.lr}; a smaller one may train)")


def _noise(configs: list[TrainConfig], iteration: int, stream: int, sizes: list[int], n_samples: int,
           latent_dim: int, device: torch.device, first: int = 0,
           n_features: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each run's eps (R, rows, K, d), chunk c (of sizes[c - first] rows) of run r drawn after
    step_seed(seed_r, iteration, stream, c), as `fit` draws a shard's (stream 0) or a held-out chunk's (1); with
    `n_features`, also the noise (R, rows, K, p) of the x_m draws that a sampled missing factor takes next."""
    draws, x_draws = [], []
    for config in configs:
        for chunk, size in enumerate(sizes, first):
            step_seed(config.seed, iteration, stream, chunk)
            draws.append(cpu_normal(size, n_samples, latent_dim, device=device))
            if n_features:  # the decoder's rsample draws randn_like(loc) right after z's noise
                x_draws.append(cpu_normal(size, n_samples, n_features, device=device))
    eps = torch.cat(draws).view(len(configs), -1, n_samples, latent_dim)
    return eps, torch.cat(x_draws).view(len(configs), -1, n_samples, n_features) if n_features else None


class _Linear(NamedTuple):
    """A dense layer by its parameters' names in the stacked state."""

    weight: str
    bias: str


class _Spec(NamedTuple):
    """What the stacked bound reads of the template model, as constants that torch.compile specialises on:
    dense layers by parameter name, activations as 'tanh' / 'relu' between them."""

    encoder: tuple[_Linear | str, ...]  # the MLP encoder's body and head
    trunk: tuple[_Linear | str, ...]  # the decoder's dense trunk
    mean_head: _Linear
    var_head: _Linear | None  # per-row variances
    raw_var: str | None  # variances shared across rows
    squash: tuple[float, float] | None
    min_variance: float
    missing: str  # 'mcar', 'affine' (x_m integrated) or 'sampled' (the agnostic model)
    missing_linear: _Linear | None  # the agnostic model's logits
    nodes: tuple[float, ...]  # the Gauss-Hermite rule's
    weights: tuple[float, ...]


def _spec(model: NotMIWAE) -> _Spec:
    name_of = {id(p): name for name, p in model.named_parameters()}

    def layers(module: nn.Module) -> tuple[_Linear | str, ...]:
        if isinstance(module, nn.Sequential):
            return tuple(entry for part in module for entry in layers(part))
        if isinstance(module, nn.Linear):
            return (_Linear(name_of[id(module.weight)], name_of[id(module.bias)]),)
        if isinstance(module, nn.Tanh):  # the package's Tanh too
            return ("tanh",)
        if isinstance(module, nn.ReLU):
            return ("relu",)
        return ()  # nn.Identity: nothing

    encoder, decoder, missing = model.encoder, model.decoder, model.missing_model
    per_row = decoder.variance == "per_row"
    nodes, weights = gauss_hermite(decoder.quadrature_points)
    kind = "mcar" if missing.is_mcar else "sampled" if isinstance(missing, Agnostic) else "affine"
    return _Spec(encoder=layers(encoder.body) + layers(encoder.head.linear), trunk=layers(decoder.trunk),
                 mean_head=layers(decoder.mean_head)[0], var_head=layers(decoder.var_head)[0] if per_row else None,
                 raw_var=None if per_row else name_of[id(decoder.raw_var)], squash=decoder.squash,
                 min_variance=decoder.min_variance, missing=kind,
                 missing_linear=layers(missing.linear)[0] if kind == "sampled" else None,
                 nodes=nodes, weights=weights)


def _linear(params: dict[str, torch.Tensor], layer: _Linear, x: torch.Tensor) -> torch.Tensor:
    """A dense layer for every run at once: x (R, n, in) -> (R, n, out), its weight held as (R, in, out)."""
    return torch.baddbmm(params[layer.bias][:, None], x, params[layer.weight])


def _mlp(params: dict[str, torch.Tensor], layers: tuple[_Linear | str, ...], x: torch.Tensor,
         tanh: Callable[[torch.Tensor], torch.Tensor] = torch.tanh) -> torch.Tensor:
    for layer in layers:
        x = tanh(x) if layer == "tanh" else F.relu(x) if layer == "relu" else _linear(params, layer, x)
    return x


def _features_first(weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A dense layer for every run, inputs and outputs features first: x (R, in, n) -> (R, out, n), its weight
    held as (R, in, out)."""
    return torch.baddbmm(bias[:, :, None], weight.transpose(1, 2), x)


def _stacked_bound(params: dict[str, torch.Tensor], values: torch.Tensor, mask: torch.Tensor, eps: torch.Tensor,
                   x_noise: torch.Tensor | None, *, spec: _Spec, affine: "_FeatureAffine | None",
                   compiled: bool) -> torch.Tensor:
    """L_K per run and row, (R, B), from the stacked parameters: zero-filled rows `values` (R, B, p), their
    `mask`, eps (R, B, K, d), for a sampled missing factor the x_m draws' noise (R, B, K, p), and for an affine
    missing model the model as `affine`, whose (slope, intercept) the pass maps over the runs' parameters.
    `compiled` is for a pass that torch.compile traces: x_m integrated out by autograd through the quadrature,
    which it fuses, and tanh as `tanh_rational`; otherwise the hand-written quadrature kernel and torch.tanh.

    The decoder's outputs are laid out (R, p, K, B), features first and rows last: the per-entry passes (the
    Gaussian and the quadrature) then run along the rows, a full vector, rather than along p features (4 for
    Banknote, a quarter of one AVX-512 vector). The mean and variance heads are one product."""
    tanh = tanh_rational if compiled else torch.tanh
    mean, logvar = _mlp(params, spec.encoder, values, tanh).chunk(2, dim=-1)
    std = torch.exp(0.5 * logvar.clamp(LOGVAR_MIN, LOGVAR_MAX))
    eps = eps.transpose(1, 2)  # (R, K, B, d): the decoder's rows sample-major
    z = mean[:, None] + std[:, None] * eps
    log_qz = -(0.5 * eps ** 2 + torch.log(std)[:, None] + _HALF_LOG_2PI).sum(-1)  # (R, K, B)
    log_pz = -(0.5 * z ** 2 + _HALF_LOG_2PI).sum(-1)
    runs, n_samples, n_rows = z.shape[:3]
    h = _mlp(params, spec.trunk, z.reshape(runs, n_samples * n_rows, -1), tanh)
    if spec.var_head is not None:
        mean_head, var_head = spec.mean_head, spec.var_head
        heads = _features_first(torch.cat([params[mean_head.weight], params[var_head.weight]], -1),
                                torch.cat([params[mean_head.bias], params[var_head.bias]], -1), h.transpose(1, 2))
        raw_loc, raw_scale = heads.view(runs, -1, n_samples, n_rows).chunk(2, dim=1)
        loc, scale = squashed(raw_loc, spec.squash), sd_from_raw(raw_scale, spec.min_variance)
    else:
        head = _features_first(params[spec.mean_head.weight], params[spec.mean_head.bias], h.transpose(1, 2))
        loc = squashed(head, spec.squash).view(runs, -1, n_samples, n_rows)
        scale = sd_from_raw(params[spec.raw_var], spec.min_variance).view(runs, -1, 1, 1)
    x, observed_mask = values.transpose(1, 2)[:, :, None], mask.transpose(1, 2)[:, :, None]  # (R, p, 1, B)
    log_w = (observed_mask * gaussian_log_prob(loc, scale, x)).sum(1) + log_pz - log_qz  # (R, K, B)
    if spec.missing == "sampled":  # as `NotMIWAE.complete` and `log_ps`: x_m = loc + scale ε, reparameterised
        completed = torch.where(observed_mask > 0, x, loc + scale * x_noise.permute(0, 3, 2, 1))
        linear = spec.missing_linear
        logits = _features_first(params[linear.weight], params[linear.bias], completed.flatten(2)).view_as(loc)
        log_w = log_w + bernoulli_log_prob(logits, observed_mask, dim=1)
    elif spec.missing == "affine":
        slope, intercept = _slope_intercept(params, affine, values.shape[-1], values.device)  # (R, p, 1, 1)
        keep, sd = 1 - observed_mask, slope.abs() * scale
        observed = (observed_mask * F.logsigmoid(slope * x + intercept)).sum(1)  # (R, 1, B)
        if compiled:
            log_missing = log_expected_sigmoid_composed(slope * loc + intercept, sd, spec.nodes, spec.weights)
            unobserved = (keep * log_missing).sum(1)
        else:  # the kernel sums over the last axis
            last = (0, 2, 3, 1)
            unobserved = masked_log_expected_sigmoid_sum(loc.permute(last), slope.permute(last),
                                                         intercept.permute(last), sd.permute(last),
                                                         keep.permute(last), None, len(spec.nodes))
        log_w = log_w + observed + unobserved
    return importance_weighted_bound(log_w.transpose(1, 2))


def _slope_intercept(params: dict[str, torch.Tensor], affine: "_FeatureAffine", n_features: int,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each run's missing-model (slope, intercept) per feature, (R, p, 1, 1) or (R, 1, 1, 1) each, from the
    model's own `feature_affine` mapped over the stacked parameters (inside the compiled graph, where it is)."""
    prefix = "missing_model."
    missing = {"model." + name[len(prefix):]: p for name, p in params.items() if name.startswith(prefix)}
    features = torch.arange(n_features, device=device)
    slope, intercept = vmap(lambda p: functional_call(affine, p, (features,)))(missing)
    runs = slope.shape[0]
    return slope.reshape(runs, -1, 1, 1), intercept.reshape(runs, -1, 1, 1)


def _unflatten(flat: torch.Tensor, layout: tuple[tuple[str, tuple[int, ...]], ...]) -> dict[str, torch.Tensor]:
    """The stacked parameters by name, as views of the flat tensor that holds them in `layout`'s order."""
    parts = flat.split([math.prod(shape) for _, shape in layout])
    return {name: part.view(shape) for (name, shape), part in zip(layout, parts)}


def _adam_schedule(iteration: int, lr: float, device: torch.device) -> torch.Tensor:
    """Adam's step size and the square root of its second bias correction at step `iteration`, as one tensor:
    the compiled step reads them as data (as constants it would be rebuilt for each step, and computed inside its
    loops it would take two powers per vector of parameters)."""
    beta1, beta2 = _ADAM_BETAS
    schedule = torch.tensor([lr / (1 - beta1 ** iteration), math.sqrt(1 - beta2 ** iteration)])
    return schedule if device.type == "cpu" else schedule.to(device, non_blocking=True)


def _train_step(flat: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, index: torch.Tensor,
                values: torch.Tensor, mask: torch.Tensor, eps: torch.Tensor, x_noise: torch.Tensor | None,
                schedule: torch.Tensor, *, layout: tuple[tuple[str, tuple[int, ...]], ...], spec: _Spec,
                affine: "_FeatureAffine | None", compiled: bool) -> torch.Tensor:
    """One step of every run: the gradient of -(each run's mean bound over its batch rows `values[index[r]]`)
    with respect to the flat parameters, then Adam's update of them and of its moments in place, the update of
    `fit`'s Adam (default betas and eps; `schedule` from `_adam_schedule`). Each run's sum of its rows' bounds,
    (R,), is returned. `compiled`: for torch.compile to trace (`_stacked_bound`)."""
    batch_size = index.shape[1]

    def loss(parameters: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bound = _stacked_bound(_unflatten(parameters, layout), values[index], mask[index], eps, x_noise, spec=spec,
                               affine=affine, compiled=compiled)
        sums = bound.sum(-1)
        return -sums.sum() / batch_size, sums.detach()

    if compiled:  # torch.compile traces torch.func's gradient into the step's graph; the autograd engine it cannot
        grad, sums = torch.func.grad(loss, has_aux=True)(flat)
    else:  # autograd, through the hand-written quadrature kernel, whose backward torch.func cannot transform
        with torch.enable_grad():
            parameters = flat.detach().requires_grad_()
            value, sums = loss(parameters)
            (grad,) = torch.autograd.grad(value, parameters)
    beta1, beta2 = _ADAM_BETAS
    step_size, bias_correction2_sqrt = schedule
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    flat.sub_(step_size * exp_avg / (exp_avg_sq.sqrt() / bias_correction2_sqrt + _ADAM_EPS))
    return sums


#: the training step, one compiled graph per architecture and shape
_compiled_step = compiled.Compiled(_train_step, dynamic=False)


class _FeatureAffine(nn.Module):
    """The missing model's (slope, intercept) per feature as a forward pass, for `functional_call`."""

    def __init__(self, missing_model: nn.Module):
        super().__init__()
        self.model = missing_model

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.feature_affine(features)


def _dense_weights(spec: _Spec) -> set[str]:
    """The names of the spec's dense-layer weights."""
    layers = (*spec.encoder, *spec.trunk, spec.mean_head, spec.var_head, spec.missing_linear)
    return {layer.weight for layer in layers if isinstance(layer, _Linear)}


class _StackedModel:
    """R models of one architecture as their stacked parameters (R, ...), held in one flat tensor with Adam's
    moments beside it: the bound, and the training step. Dense weights are held transposed, (R, in, out): the
    layout their gradient comes in, which spares the backward a transposing copy of each (Adam's update is
    elementwise, so the layout does not change it)."""

    def __init__(self, models: list[NotMIWAE]):
        self.template = models[0]
        self.runs = len(models)
        self.latent_dim = self.template.latent_dim
        self.spec = _spec(self.template)
        self.transposed = _dense_weights(self.spec)
        stacked, _ = stack_module_state(models)
        parts = {name: p.detach().transpose(1, 2) if name in self.transposed else p.detach()
                 for name, p in stacked.items()}
        self.layout = tuple((name, tuple(p.shape)) for name, p in parts.items())
        self.flat = torch.cat([p.reshape(-1) for p in parts.values()])
        self.stacked = _unflatten(self.flat, self.layout)
        self.exp_avg, self.exp_avg_sq = torch.zeros_like(self.flat), torch.zeros_like(self.flat)
        self.sampled_features = self.template.n_features if self.spec.missing == "sampled" else 0
        self.affine = _FeatureAffine(self.template.missing_model) if self.spec.missing == "affine" else None
        self.stepped = False  # whether a compiled step has run

    def bound(self, values: torch.Tensor, mask: torch.Tensor, eps: torch.Tensor,
              x_noise: torch.Tensor | None = None) -> torch.Tensor:
        """L_K per run and row, (R, B), for zero-filled rows `values` (R, B, p), their `mask`, eps (R, B, K, d) and,
        for a sampled missing factor, the x_m draws' noise (R, B, K, p)."""
        return _stacked_bound(self.stacked, values, mask, eps, x_noise, spec=self.spec, affine=self.affine,
                              compiled=False)

    def step(self, index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, eps: torch.Tensor,
             x_noise: torch.Tensor | None, schedule: torch.Tensor) -> torch.Tensor:
        """A training step on run r's rows `values[index[r]]` (`_train_step`): on a CPU, where the job compiles
        (`models.integrated.compiled`), one compiled graph; each run's sum of its rows' bounds, (R,)."""
        tensors = (self.flat, self.exp_avg, self.exp_avg_sq, index, values, mask, eps, x_noise, schedule)
        constants = dict(layout=self.layout, spec=self.spec, affine=self.affine)
        if values.device.type == "cpu":
            # every step of a fit passes the same tensors, or new ones of the same shapes, and the same constants:
            # once the first step has picked (or built) the compiled graph, the later ones skip dynamo's checks of
            # them, all but those that tell its graphs apart (a few per cent of a step: docs/performance.md)
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True) if self.stepped else nullcontext():
                sums = _compiled_step(*tensors, **constants, compiled=True)
            if sums is not None:
                self.stepped = True
                return sums
        with torch.no_grad():
            return _train_step(*tensors, **constants, compiled=False)

    @torch.no_grad()
    def mean_bound(self, values: torch.Tensor, mask: torch.Tensor, index: np.ndarray, configs: list[TrainConfig],
                   iteration: int) -> list[float]:
        """Each run's mean L_K over its held-out rows index[r], with the noise `fit` draws for them: chunks of
        batch_size rows, chunk c seeded by (seed, iteration, 1, c), its sum added in float64 as `fit` adds it."""
        batch_size, n_samples = configs[0].batch_size, configs[0].n_samples
        starts = list(range(0, index.shape[1], batch_size))
        per_pass = max(1, _VALIDATION_ROWS // batch_size)
        totals = [0.0] * self.runs
        for first in range(0, len(starts), per_pass):
            chunk_starts = starts[first:first + per_pass]
            end = min(chunk_starts[-1] + batch_size, index.shape[1])
            sizes = [min(batch_size, end - start) for start in chunk_starts]
            noise = _noise(configs, iteration, 1, sizes, n_samples, self.latent_dim, values.device, first,
                           self.sampled_features)
            picked = torch.from_numpy(index[:, chunk_starts[0]:end]).to(values.device)
            bound = self.bound(values[picked], mask[picked], *noise)
            sums = torch.stack([part.sum(-1) for part in bound.split(batch_size, dim=1)], -1).tolist()
            totals = [total + sum(run_sums) for total, run_sums in zip(totals, sums)]
        return [total / index.shape[1] for total in totals]

    @torch.no_grad()
    def keep(self, best: dict[str, torch.Tensor] | None, runs: list[int]) -> dict[str, torch.Tensor]:
        """The kept parameters with runs `runs` replaced by their current ones."""
        if best is None:
            return {name: p.detach().clone() for name, p in self.stacked.items()}
        for name, p in self.stacked.items():
            best[name][runs] = p.detach()[runs]
        return best

    @torch.no_grad()
    def write_back(self, models: list[NotMIWAE], best: dict[str, torch.Tensor] | None, kept: list[bool]) -> None:
        """Each model's parameters from its slice of the stack: the kept ones where held-out rows chose
        (`kept`), else the last ones, as `fit` leaves a run whose held-out bound was never a number."""
        for run, model in enumerate(models):
            source = best if kept[run] else self.stacked
            for name, p in model.named_parameters():
                p.copy_(source[name][run].T if name in self.transposed else source[name][run])
