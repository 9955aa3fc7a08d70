"""Where one training step's time goes, by torch.profiler, at two shapes.

  yahoo:    15,400 x 1,000 sparse ratings (~20 a row), batch 100, K = 20, set encoder, Gaussian decoder,
            item-wise missing model, x_m integrated (the shape of bench/core_speed.py);
  banknote: 1,372 x 4 dense rows, the paper's self-masking amputation, batch 16, K = 20, MLPs of 2 x 128
            tanh units, self-masking missing model (the UCI protocol's notmiwae-self-masking).

Each shape: a 5-step fit first (torch.compile's build; MNAR_RECSYS_COMPILE=1 unless set otherwise), three
unprofiled fits for the step's wall time (their median), then a profiled fit whose events are grouped by
labels this script wraps around the model's parts (the trainer itself is unchanged). Printed per group:
milliseconds per step, share of the profiled step, the part spent inside PyTorch operators (kernels and
their C++ dispatch; the rest is Python) and the operators run per step (for host syncs: the `.item()` reads,
most of them inside fused Adam's CPU kernel, which reads each parameter's step count). The profiler adds a
few microseconds an operator, so shares are of the profiled step.

    python bench/profile_step.py [--shape yahoo|banknote|both] [--iterations 40] [--threads 1]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections import defaultdict
from contextlib import ExitStack, contextmanager

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from core_speed import ITEMS, PER_ROW, USERS, yahoo_shaped  # bench/, on the path when this script runs
from mnar_recsys.data.rows import as_rows
from mnar_recsys.estimators.imputer import NotMIWAEImputer
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.pipelines.uci import masked_dataset
from mnar_recsys.training import trainer
from mnar_recsys.training.trainer import TrainConfig, fit

GROUPS = ("encoder", "decoder", "missing term", "bound, rest", "backward", "optimiser", "batch and seeding",
          "host syncs", "trainer loop")
_OPTIMISER = ("Optimizer.step#Adam.step", "Optimizer.zero_grad#Adam.zero_grad")
_STEP = "profile_step: iteration"


def shape(name: str):
    """(model config, rows, train config) of one shape."""
    if name == "yahoo":
        config = ModelConfig(n_features=ITEMS, missing_factor="integrated", missing="itemwise")
        return config, yahoo_shaped(USERS, ITEMS, PER_ROW), TrainConfig(batch_size=100, n_samples=20)
    imputer = NotMIWAEImputer(decoder="gaussian", missing="self-masking", missing_sign=-1)
    data = np.random.default_rng(0).standard_normal((1372, 4))
    return imputer.model_config(4), masked_dataset(data, 0.0)[2], TrainConfig(batch_size=16, n_samples=20)


def _labelled(function, label: str):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with record_function(label):
            return function(*args, **kwargs)
    return wrapper


@contextmanager
def _patched(target, name: str, label: str):
    original = getattr(target, name)
    setattr(target, name, _labelled(original, label))
    try:
        yield
    finally:
        setattr(target, name, original)


@contextmanager
def labels(model, rows_type):
    """Record-function ranges around the model's parts, the backward pass, row batches and the step."""
    with ExitStack() as stack:
        for target, name, label in (
                (model, "forward", "bound, rest"), (model.encoder, "forward", "encoder"),
                (model.decoder, "forward", "decoder"), (model.decoder, "forward_entries", "decoder"),
                (model.decoder, "log_prob", "decoder"), (model, "log_ps", "missing term"),
                (model, "_subsampled_log_ps", "missing term"), (torch.Tensor, "backward", "backward"),
                (rows_type, "batch", "batch and seeding"), (trainer, "step_seed", "batch and seeding"),
                (trainer, "_step", _STEP)):
            stack.enter_context(_patched(target, name, label))
        yield


def _group(event) -> str | None:
    name = event.name
    if name in _OPTIMISER:
        return "optimiser"
    if name in ("aten::item", "aten::_local_scalar_dense"):
        return "host syncs"
    return name if name in GROUPS else None


def breakdown(events) -> tuple[dict, dict, float, int, dict]:
    """Per group: exclusive µs and µs inside operators; the µs between the first and the last step's start,
    the number of steps in that window, and per group the operators run."""
    steps = sorted(e.time_range.start for e in events if e.name == _STEP)
    start, end = steps[0], steps[-1]
    inside = [e for e in events if start <= e.time_range.start < end]
    exclusive, in_ops, count = defaultdict(float), defaultdict(float), defaultdict(int)
    for event in inside:
        if event.name == _STEP:
            continue
        group = _group(event)
        parent = event.cpu_parent
        while parent is not None and _group(parent) is None and parent.name != _STEP:
            parent = parent.cpu_parent
        enclosing = _group(parent) if parent is not None else None
        duration = event.time_range.end - event.time_range.start
        if group is not None and group != enclosing:
            exclusive[group] += duration
            count[group] += group == "host syncs"
            if enclosing is not None:
                exclusive[enclosing] -= duration
        elif group is None and (event.cpu_parent is None or _group(event.cpu_parent) is not None
                                or event.cpu_parent.name == _STEP):
            owner = enclosing or "trainer loop"
            in_ops[owner] += duration
            count[owner] += 1
    exclusive["trainer loop"] = (end - start) - sum(exclusive.values())
    return exclusive, in_ops, end - start, len(steps) - 1, count


def run(name: str, iterations: int) -> None:
    model_config, data, train = shape(name)
    quiet = dict(progress=False, device="cpu")
    fit(build_model(model_config), data, TrainConfig(**{**train.to_dict(), **quiet, "iterations": 5}))
    config = TrainConfig(**{**train.to_dict(), **quiet, "iterations": iterations})
    plain = []
    for _ in range(3):  # the median of three: the machine may be shared
        model = build_model(model_config)
        started = time.perf_counter()
        fit(model, data, config)
        plain.append((time.perf_counter() - started) * 1e3 / iterations)
    plain = statistics.median(plain)
    model = build_model(model_config)
    with labels(model, type(as_rows(data))), profile(activities=[ProfilerActivity.CPU]) as prof:
        fit(model, data, config)
    exclusive, in_ops, window, steps, count = breakdown(prof.events())
    step = window / steps / 1e3
    print(f"\n{name}: {plain:.2f} ms per step unprofiled, {step:.2f} profiled ({torch.get_num_threads()} threads)")
    print(f"  {'group':20s} {'ms/step':>8s} {'share':>6s} {'in ops':>7s} {'ops/step':>8s}")
    for group in GROUPS:
        ms = exclusive.get(group, 0.0) / steps / 1e3
        print(f"  {group:20s} {ms:8.3f} {ms / step:6.0%} {in_ops.get(group, 0.0) / steps / 1e3:7.3f} "
              f"{count.get(group, 0) / steps:8.1f}")
    python = step - sum(in_ops.values()) / steps / 1e3
    print(f"  outside operators (Python, including the profiler's own): {python:.3f} ms ({python / step:.0%}); "
          f"operators per step {sum(count.values()) / steps:.0f}")


def main() -> None:
    # these fits are short, which would run the quadrature kernels eagerly: profile the long jobs' compiled step
    os.environ.setdefault("MNAR_RECSYS_COMPILE", "1")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("yahoo", "banknote", "both"), default="both")
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}")
    for name in ("yahoo", "banknote") if args.shape == "both" else (args.shape,):
        run(name, args.iterations if name == "yahoo" else 5 * args.iterations)


if __name__ == "__main__":
    main()
