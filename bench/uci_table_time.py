"""How long `mnar-recsys uci --dataset all --runs 5 --jobs 2` takes at the paper's 100,000 iterations,
estimated from short fits of every (data set, model) of the table on the real data sets.

Each neural model's runs are fitted as `uci` fits them (one stacked fit of all runs where `stacks` says so)
three times: `--short` iterations in a fresh shape (which pays for building or loading the compiled step),
`--short` again and `--long`; its fit at `--iterations` is the first fit plus the rate between the other two
over the remaining iterations. One run's imputation and score (`transform_and_score`, K =
`--importance-samples`) after the long fit stands for each run's; one run of each dense baseline for each of
its runs. The measurements run in `--jobs` worker processes of one thread each, as `uci --jobs` runs the
table. The tasks are then replayed in `uci`'s order onto `--jobs` workers, each next task to the first worker
free, as `run_tasks` hands them out; the last line is the replay's wall time. Kernels come from the
persistent cache as it is (TORCHINDUCTOR_CACHE_DIR pointed at an empty folder measures a first run).

    MNAR_RECSYS_UCI_DIR=... python bench/uci_table_time.py [--datasets all] [--short 1000] [--long 3000]
"""

from __future__ import annotations

import argparse
import heapq
import time
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from mnar_recsys.data.uci import UCI_DATASETS, load_uci
from mnar_recsys.estimators.imputer import fit_imputers
from mnar_recsys.pipelines.uci import MODELS, NEURAL_MODELS, UCIConfig, make_imputer, masked_dataset, stacks
from mnar_recsys.pipelines.workers import run_tasks


@dataclass
class Measured:
    """One (data set, model): its tasks' estimated seconds, the share of them spent fitting."""

    dataset: str
    model: str
    task_seconds: list[float]  # one entry a task of `uci`: a stacked fit with its runs' imputations, or one run
    fit_seconds: float  # of all its tasks together


def timed_fit(imputers: list, masked: np.ndarray) -> float:
    start = time.perf_counter()
    fit_imputers(imputers, masked)
    return time.perf_counter() - start


def measure(dataset: str, model: str, data_dir: str | None, config: UCIConfig, short: int,
            long: int) -> Measured:
    """The estimated seconds of the tasks `uci` makes of (dataset, model) at config.iterations."""
    _, _, masked = masked_dataset(load_uci(dataset, data_dir), config.offset)
    if model not in NEURAL_MODELS:
        start = time.perf_counter()
        make_imputer(model, config, config.seed).fit(masked).transform(masked)
        return Measured(dataset, model, [time.perf_counter() - start] * config.runs, 0.0)
    together = config.runs if stacks(model, config, masked.shape[1]) else 1

    def imputers(iterations: int) -> list:
        return [make_imputer(model, replace(config, iterations=iterations), config.seed + run)
                for run in range(together)]

    first = timed_fit(imputers(short), masked)
    again = timed_fit(imputers(short), masked)
    fitted = imputers(long)
    longer = timed_fit(fitted, masked)
    fit = extrapolated(first, again, longer, short, long, config.iterations)
    start = time.perf_counter()
    fitted[0].transform_and_score(masked)
    imputation = time.perf_counter() - start
    tasks = config.runs // together
    return Measured(dataset, model, [fit + together * imputation] * tasks, fit * tasks)


def extrapolated(first: float, again: float, longer: float, short: int, long: int, iterations: int) -> float:
    """A fit's seconds at `iterations`: the first fit of `short` iterations (kernels built or loaded) and the
    rate between the second fit of `short` and the fit of `long` over the other iterations."""
    return first + (longer - again) / (long - short) * (iterations - short)


def replay(task_seconds: list[float], jobs: int) -> float:
    """The wall time of tasks handed in order to `jobs` workers, each to the first one free."""
    free = [0.0] * jobs
    for seconds in task_seconds:
        heapq.heappush(free, heapq.heappop(free) + seconds)
    return max(free)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["all"], choices=[*UCI_DATASETS, "all"])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--data-dir", default=None, help="the UCI files' folder (default $MNAR_RECSYS_UCI_DIR)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--short", type=int, default=1000, help="iterations of the short fits (compiled at 1,000)")
    parser.add_argument("--long", type=int, default=3000)
    parser.add_argument("--iterations", type=int, default=UCIConfig.iterations)
    parser.add_argument("--importance-samples", type=int, default=UCIConfig.importance_samples)
    parser.add_argument("--runs", type=int, default=UCIConfig.runs)
    args = parser.parse_args()
    if not 0 < args.short < args.long <= args.iterations:
        parser.error(f"need 0 < --short < --long <= --iterations, got {args.short}, {args.long}, {args.iterations}")
    datasets = list(UCI_DATASETS) if "all" in args.datasets else args.datasets
    config = UCIConfig(iterations=args.iterations, importance_samples=args.importance_samples, runs=args.runs,
                       device="cpu")
    items = [(dataset, model, args.data_dir, config, args.short, args.long) for dataset in datasets
             for model in args.models]
    start = time.perf_counter()
    measured = {(m.dataset, m.model): m for _, m in run_tasks(measure, items, args.jobs)}
    print(f"measured in {(time.perf_counter() - start) / 60:.1f} min with {args.jobs} workers")
    per_dataset: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for (dataset, model), m in measured.items():
        total = sum(m.task_seconds)
        part = per_dataset[dataset]
        part[0] += m.fit_seconds
        part[1] += total - m.fit_seconds if model in NEURAL_MODELS else 0.0
        part[2] += 0.0 if model in NEURAL_MODELS else total
    print(f"hours on one core at {args.iterations:,} iterations, {args.runs} runs, K = {args.importance_samples:,}:")
    print(f"{'data set':10s} {'fits':>6s} {'imputations':>12s} {'baselines':>10s}")
    for dataset in datasets:
        fit, imputation, dense = (seconds / 3600 for seconds in per_dataset[dataset])
        print(f"{dataset:10s} {fit:6.2f} {imputation:12.2f} {dense:10.2f}")
    longest = max(measured.values(), key=lambda m: max(m.task_seconds))
    print(f"longest task: {longest.dataset} {longest.model}, {max(longest.task_seconds) / 3600:.2f} h")
    in_order = [seconds for dataset, model, *_ in items for seconds in measured[dataset, model].task_seconds]
    one_core = sum(in_order) / 3600
    wall = replay(in_order, args.jobs)
    print(f"in all {one_core:.2f} h on one core; `uci --jobs {args.jobs}` replayed in its task order: "
          f"{wall / 3600:.2f} h ({wall / 60:.0f} min)")


if __name__ == "__main__":
    main()
