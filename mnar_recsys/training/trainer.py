"""Fit a (not-)MIWAE by stochastic gradient ascent on L_K: Adam, row mini-batches, fixed iterations.

By default there is no early stopping, as in the paper: on real MNAR data the imputation error cannot
be monitored. On small data sets a fixed 10,000 iterations over-fits, so `validation_fraction` can hold
out rows and keep the parameters with the best bound on them, a choice that needs no MCAR data.
"""

from __future__ import annotations

import copy
import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from mnar_recsys.checks import check_positive_finite, check_positive_integer
from mnar_recsys.data.rows import RowSource
from mnar_recsys.denormals import denormals_flushed
from mnar_recsys.devices import resolve_device
from mnar_recsys.models.integrated import compiled
from mnar_recsys.models.notmiwae import NotMIWAE, prepare_rows
from mnar_recsys.training import distributed
from mnar_recsys.training.seeds import step_seed


@dataclass
class TrainConfig:
    """iterations: gradient steps; batch_size: rows per step (the global batch, over all processes);
    n_samples: K; lr: Adam's step size; seed: seeds batch order and sampling; device: 'auto' (CUDA when
    available), 'cpu' or 'cuda', resolved when training starts; progress: show a tqdm bar;
    log_every: iterations between entries of the returned history (the bound's moving average, decay 0.98);
    validation_fraction: share of rows held out to select the iteration with the best held-out bound
    (0: train on all rows for all iterations); validation_every: iterations between those checks;
    shards: each batch is cut into this many shards, each with its own noise seeded by (seed,
    iteration, shard); None means one per process. With the same shards a run gives the same
    parameters on one process or on several (up to rounding), so a distributed run can be checked."""

    iterations: int = 10_000
    batch_size: int = 100
    n_samples: int = 20
    lr: float = 1e-3
    seed: int = 0
    device: str = "auto"
    progress: bool = True
    log_every: int = 100
    validation_fraction: float = 0.0
    validation_every: int = 250
    shards: int | None = None

    def __post_init__(self) -> None:
        for name in ("iterations", "batch_size", "n_samples", "log_every", "validation_every"):
            check_positive_integer(name, getattr(self, name))
        check_positive_finite("lr", self.lr)
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(f"validation_fraction must lie in [0, 1), got {self.validation_fraction}")
        if self.shards is not None:
            check_positive_integer("shards", self.shards)

    def to_dict(self) -> dict:
        return asdict(self)


class TrainingDiverged(FloatingPointError):
    """The bound on a batch came out NaN or infinite: the parameters are no longer a fit."""


@dataclass
class History:
    """bound: (iteration, moving average of L_K per row, decay 0.98 from the first step) pairs; validation:
    (iteration, mean L_K on the held-out rows) pairs; best_iteration: the iteration whose parameters were kept
    (None: the last)."""

    bound: list[tuple[int, float]] = field(default_factory=list)
    validation: list[tuple[int, float]] = field(default_factory=list)
    best_iteration: int | None = None


def _batches(n_rows: int, batch_size: int, rng: np.random.Generator):
    """Endless row mini-batches: shuffled epochs, the short remainder of each epoch dropped."""
    size = min(batch_size, n_rows)
    while True:
        order = rng.permutation(n_rows)
        for start in range(0, n_rows - size + 1, size):
            yield order[start:start + size]


def fit(model: NotMIWAE, data: "np.ndarray | sp.spmatrix | RowSource", config: TrainConfig,
        initialise_missing: bool = True) -> History:
    """Train `model` in place and return its history.

    In a process group (see :mod:`mnar_recsys.training.distributed`) every rank runs this with the same
    data and config: all ranks draw the same batch order, each computes the bound on its shards of the
    global batch, and DistributedDataParallel averages the gradients. The bounds stay on the device until
    the next log or validation point (at most 100 steps apart): a step whose bound is NaN or infinite is
    found there and raises TrainingDiverged naming that step.
    """
    n_shards = config.shards or distributed.world_size()
    failure = None
    try:
        rows, training, validation = _split_rows(model, data, config, n_shards)
        device = resolve_device(config.device)
        compiled.compile_mode()  # a misspelt MNAR_RECSYS_COMPILE fails here, not at the first kernel call
    except Exception as error:  # any rank's failure stops every rank (see distributed.agree)
        failure = error
    distributed.agree(failure)
    if initialise_missing:  # from the training rows alone: the held-out ones pick the kept parameters
        model.missing_model.initialise(*rows.observed_summary(np.sort(training)))
    model.to(device).train()
    step_model = _data_parallel(model, device)
    # fused: one kernel for all parameters; the per-tensor loop took a tenth of a small model's step
    optimiser = torch.optim.Adam(model.parameters(), lr=config.lr, fused=True)
    history = History()
    best_state, best_value = None, -float("inf")
    running = None
    pending: list[torch.Tensor] = []  # the bounds of the steps since the last check, still on the device
    main = distributed.is_main_process()
    bar = tqdm(range(1, config.iterations + 1), disable=not (config.progress and main), desc="training",
               mininterval=0.5)
    batches = _batches(training.size, config.batch_size, np.random.default_rng(_row_seed(config.seed, _BATCHES)))
    # a short fit runs the quadrature kernels eagerly, sparing torch.compile's build (models.integrated.compiled)
    with compiled.job(config.iterations), denormals_flushed():
        for iteration in bar:
            batch = training[next(batches)]
            optimiser.zero_grad(set_to_none=True)  # not the model's: that walks its module tree every step
            try:
                pending.append(_step(step_model, rows, batch, n_shards, config, iteration, device))
            except Exception as error:
                # an earlier step may have diverged unseen, and its NaN update broken this one: say so, not
                # this step's error (checked on this rank alone: the others need not be here)
                _checked_bounds(pending, iteration - len(pending), batch.size, config, across_ranks=False)
                bad = non_finite_parameter(model)
                if bad is not None:
                    raise TrainingDiverged(f"training diverged before iteration {iteration}: {bad} (lr {config.lr}; "
                                           "a smaller one may train)") from error
                raise
            optimiser.step()
            last = iteration == config.iterations
            logging = last or iteration % config.log_every == 0
            validating = validation.size and (last or iteration % config.validation_every == 0)
            if logging or validating or len(pending) == _CHECK_EVERY:
                # one read-back for the steps since the last check: a diverged step is found here, named by its
                # iteration, before its parameters are logged, validated or kept
                for value in _checked_bounds(pending, iteration - len(pending) + 1, batch.size, config):
                    running = value if running is None else 0.98 * running + 0.02 * value
                pending = []
            if logging:
                history.bound.append((iteration, running))
                bar.set_postfix(bound=f"{running:.3f}")
            if validating:
                held_out = _mean_bound(model, rows, validation, config, device, iteration)
                history.validation.append((iteration, held_out))
                if held_out > best_value:
                    best_value, history.best_iteration = held_out, iteration
                    best_state = copy.deepcopy(model.state_dict())
    if best_state is not None:
        model.load_state_dict(best_state)
    bad = non_finite_parameter(model)
    if bad is not None:  # the last step's bound was finite, but the update after it need not be
        raise TrainingDiverged(f"training diverged: after {config.iterations} iterations {bad} (lr {config.lr}; a "
                               "smaller one may train)")
    model.eval()
    return history


def non_finite_parameter(model: nn.Module) -> str | None:
    """Which parameter or buffer holds a NaN or an infinity, in words (None when all are finite)."""
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return f"{name} holds {int((~torch.isfinite(tensor)).sum())} non-finite values"
    return None


def _split_rows(model: NotMIWAE, data: "np.ndarray | sp.spmatrix | RowSource", config: TrainConfig,
                n_shards: int) -> tuple[RowSource, np.ndarray, np.ndarray]:
    """Validated rows, and the (training, validation) row indices; checks the shards can be filled."""
    rows = prepare_rows(model, data)
    if rows.n_rows == 0:
        raise ValueError("cannot train on zero rows")
    order = np.random.default_rng(_row_seed(config.seed, _SPLIT)).permutation(rows.n_rows)
    n_validation = int(round(config.validation_fraction * rows.n_rows))
    if config.validation_fraction > 0 and not 0 < n_validation < rows.n_rows:
        raise ValueError(f"validation_fraction {config.validation_fraction} of {rows.n_rows} rows leaves no "
                         "validation or no training rows")
    training = order[n_validation:]
    if n_shards % distributed.world_size():
        raise ValueError(f"{n_shards} shards cannot be shared evenly by {distributed.world_size()} processes")
    if min(config.batch_size, training.size) < n_shards:
        raise ValueError(f"each batch is cut into {n_shards} shards (one per process at least) but holds only "
                         f"{min(config.batch_size, training.size)} rows ({training.size} training rows, batch "
                         f"size {config.batch_size}): use fewer processes or more rows")
    return rows, training, np.sort(order[:n_validation])


_BATCHES, _SPLIT = 0, 1  # independent streams: the batch order and the training / validation split


def _row_seed(seed: int, stream: int) -> np.random.SeedSequence:
    """The same on every process, so all ranks agree on the split and on each global batch."""
    return np.random.SeedSequence([seed, stream])


def _data_parallel(model: NotMIWAE, device: torch.device) -> nn.Module:
    if distributed.world_size() == 1:
        return model
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def _step(step_model: nn.Module, rows: RowSource, batch: np.ndarray, n_shards: int, config: TrainConfig,
          iteration: int, device: torch.device) -> torch.Tensor:
    """Accumulate the gradient of -(mean bound over the global batch) from this rank's shards into the zeroed
    gradients; return the sum of this rank's shards' bounds, a float64 scalar left on the device (reading it
    would wait for the device every step). DDP averages over ranks, hence the factor world_size."""
    shards = distributed.shards_of(batch, n_shards) if n_shards > 1 else [batch]
    mine = distributed.my_shards(n_shards)
    scale = distributed.world_size() / batch.size
    total = None
    for shard in mine:
        step_seed(config.seed, iteration, 0, shard)
        last = shard == mine[-1]
        with nullcontext() if last or distributed.world_size() == 1 else step_model.no_sync():
            bound = step_model(rows.batch(shards[shard]).to(device), config.n_samples).sum()
            (-scale * bound).backward()
        bound = bound.detach().to(torch.float64)
        total = bound if total is None else total + bound
    return total


_CHECK_EVERY = 100  # steps between read-backs of the bound at most, whatever log_every says


def _checked_bounds(pending: list[torch.Tensor], first_iteration: int, batch_size: int, config: TrainConfig,
                    across_ranks: bool = True) -> list[float]:
    """The global batch's mean bound at each pending step (summed over the ranks unless `across_ranks` is
    False), read back at once; TrainingDiverged names the first step whose bound is NaN or infinite."""
    if not pending:
        return []
    totals = torch.stack(pending)
    if across_ranks and distributed.world_size() > 1:
        torch.distributed.all_reduce(totals)
    values = [total / batch_size for total in totals.tolist()]
    for offset, value in enumerate(values):
        if not math.isfinite(value):
            raise TrainingDiverged(f"training diverged at iteration {first_iteration + offset}: the batch's mean "
                                   f"bound is {value} (lr {config.lr}; a smaller one may train)")
    return values


@torch.no_grad()
def _mean_bound(model: NotMIWAE, rows: RowSource, index: np.ndarray, config: TrainConfig, device: torch.device,
                iteration: int) -> float:
    """Mean L_K per row over `index`, in training-sized chunks shared out among the ranks; each chunk's
    noise is seeded by its position, so the value does not depend on the number of processes. It is the
    estimate training uses: with `unobserved_samples` set, the subsampled one (the exact missing term over
    every unobserved item of every held-out row would cost more than training does)."""
    model.eval()
    sums = []  # read back together at the end rather than one wait for the device per chunk
    starts = range(0, index.size, config.batch_size)
    for chunk in range(distributed.rank(), len(starts), distributed.world_size()):
        step_seed(config.seed, iteration, 1, chunk)
        start = starts[chunk]
        batch = rows.batch(index[start:start + config.batch_size]).to(device)
        sums.append(model.bound(batch, config.n_samples).sum())
    model.train()
    total = sum(torch.stack(sums).tolist()) if sums else 0.0
    return distributed.sum_across_ranks(total, device) / index.size
