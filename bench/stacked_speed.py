"""R single fits against one stacked fit of the same R runs, at Banknote's size, on one thread.

Data: 1,372 x 4 Gaussian rows with correlated features, the first two self-masked above their mean (the UCI
protocol's shape); the UCI imputer's model (2 x 128 tanh layers in encoder and decoder, latent 3, per-row
variances, x_m integrated), batch 16, K = 20. Each round times R `fit`s one after the other, then one
`fit_stacked` of the same R runs, alternating so that both see the same machine load; each line prints
run-iterations per second (R x iterations / seconds), and the last line the ratio of the medians.

    python bench/stacked_speed.py [--runs 5] [--iterations 500] [--rounds 3] [--model notmiwae-self-masking-known]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from mnar_recsys.data.amputation import apply_mask, paper_self_masking
from mnar_recsys.models.config import build_model
from mnar_recsys.pipelines.uci import NEURAL_MODELS, UCIConfig, make_imputer
from mnar_recsys.training.seeds import seeded
from mnar_recsys.training.stacked import fit_stacked
from mnar_recsys.training.trainer import TrainConfig, fit


def banknote_sized(seed: int = 0) -> np.ndarray:
    """1,372 x 4 standardised rows with correlated features, self-masked as the UCI protocol masks them."""
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((1372, 2)) @ rng.standard_normal((2, 4)) + 0.5 * rng.standard_normal((1372, 4))
    data = (data - data.mean(0)) / data.std(0)
    return apply_mask(data, paper_self_masking(data, offset=0.0))


def models_and_configs(model: str, runs: int, iterations: int) -> tuple[list, list[TrainConfig]]:
    imputer = make_imputer(model, UCIConfig(iterations=iterations), seed=0)
    built = []
    for run in range(runs):
        with seeded(run, torch.device("cpu")):
            built.append(build_model(imputer.model_config(4)))
    configs = [TrainConfig(iterations=iterations, batch_size=16, n_samples=20, seed=run, device="cpu", progress=False)
               for run in range(runs)]
    return built, configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="notmiwae-self-masking-known", choices=NEURAL_MODELS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = banknote_sized()
    # warm-up fits, untimed: first calls pay for lazy imports and allocations (and any kernel compilation)
    warm_models, warm_configs = models_and_configs(args.model, args.runs, 5)
    fit(warm_models[0], rows, warm_configs[0])
    warm_models, warm_configs = models_and_configs(args.model, args.runs, 5)
    fit_stacked(warm_models, rows, warm_configs)
    rates: dict[str, list[float]] = {"single": [], "stacked": []}
    work = args.runs * args.iterations
    for round_number in range(1, args.rounds + 1):
        models, configs = models_and_configs(args.model, args.runs, args.iterations)
        start = time.perf_counter()
        for model, config in zip(models, configs):
            fit(model, rows, config)
        rates["single"].append(work / (time.perf_counter() - start))
        models, configs = models_and_configs(args.model, args.runs, args.iterations)
        start = time.perf_counter()
        fit_stacked(models, rows, configs)
        rates["stacked"].append(work / (time.perf_counter() - start))
        print(f"round {round_number}: {args.runs} single fits {rates['single'][-1]:.0f} run-iterations/s, one stacked "
              f"fit of {args.runs} {rates['stacked'][-1]:.0f} run-iterations/s", flush=True)
    single, stacked = statistics.median(rates["single"]), statistics.median(rates["stacked"])
    print(f"{args.model}, {args.runs} runs x {args.iterations} iterations, 1 thread: stacked / single run-iterations "
          f"per second = {stacked:.0f} / {single:.0f} = {stacked / single:.2f}")


if __name__ == "__main__":
    main()
