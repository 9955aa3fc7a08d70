"""Speed and accuracy against the PyPI package `notmiwae-pytorch` on one UCI cell, on one CPU thread.

Both packages fit the cell of `mnar-recsys uci --models notmiwae-self-masking`: the data standardised over
the complete rows, in the first half of the features the values above the mean missing (the paper's
self-masking MNAR), a not-MIWAE with 2 x 128 tanh layers in encoder and decoder, a learnt per-entry
decoder sd, latent size D - 1, K = 20, Adam at 1e-3 on batches of 16 rows drawn in shuffled epochs and
a self-masking missing model of unknown sign. Each package fits `--runs` runs a round, run i of round r seeded
`--seed` + r x runs + i, this package as `uci --runs` does, all runs in one stacked fit (`--one-by-one`: each
alone); the packages alternate, which one goes first switching each round, so the drift of a shared machine
falls on both.

This package is used through `NotMIWAEImputer` and `fit_imputers`; the peer as its README shows: `NotMIWAE`,
its `Trainer` (which clips the gradient's norm at 1; without RMSE tracking, which would impute at every step) on a
DataLoader whose sampler yields exactly `--iterations` batches, and `utils.impute`, missing entries
filled with 0. Each package's speed is its run-iterations per second (runs x iterations over the fits'
seconds: model construction and training, not imputation), after one short untimed warm-up fit each that
pays the per-process costs; the warm-up's seconds are printed too. RMSE is over the missing entries in
standardised units, the conditional mean from `--importance-samples` each. The last line is the ratio of
the speeds, this package's over the peer's.

    pip install -e '.[bench]'
    python bench/peers.py [--dataset banknote] [--runs 5] [--rounds 2] [--iterations 2000] [--one-by-one]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from mnar_recsys.checks import check_positive_integer
from mnar_recsys.data.uci import UCI_NAMES, load_uci
from mnar_recsys.estimators.imputer import NotMIWAEImputer, fit_imputers
from mnar_recsys.evaluation.metrics import imputation_rmse
from mnar_recsys.pipelines.uci import masked_dataset

try:
    from notmiwae_pytorch import NotMIWAE, Trainer
    from notmiwae_pytorch.utils import impute, set_seed
except ModuleNotFoundError as error:  # the peer, or the tensorboard its Trainer imports, is missing
    raise SystemExit(f"bench/peers.py needs the bench extra: pip install -e '.[bench]' ({error})") from error

OURS, PEER = "mnar_recsys", "notmiwae-pytorch"
DATA_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "uci"
HIDDEN, N_SAMPLES, BATCH_SIZE, LR = 128, 20, 16, 1e-3
WARM_UP_ITERATIONS = 20


@dataclass
class Cell:
    """One UCI cell: the complete standardised data, its mask (1 = observed) and the masked copy (NaN)."""

    complete: np.ndarray
    mask: np.ndarray
    masked: np.ndarray

    @property
    def latent_dim(self) -> int:
        return max(self.complete.shape[1] - 1, 1)  # the paper's D - 1


@dataclass
class Runs:
    """Each run's fit seconds and imputation RMSE for one package."""

    seconds: list[float] = field(default_factory=list)  # a round's, all its runs
    rmse: list[float] = field(default_factory=list)  # a run's
    runs: int = 0

    def run_iterations_per_second(self, iterations: int) -> float:
        return self.runs * iterations / sum(self.seconds)


def our_imputer(iterations: int, importance_samples: int, seed: int) -> NotMIWAEImputer:
    # as `uci` builds it: standardize=False, the data being standardised over the complete rows already
    return NotMIWAEImputer(decoder="gaussian", missing="self-masking", missing_sign=-1, hidden=HIDDEN,
                           n_samples=N_SAMPLES, iterations=iterations, batch_size=BATCH_SIZE, lr=LR,
                           importance_samples=importance_samples, standardize=False, random_state=seed,
                           device="cpu", progress=False)


def fit_ours(cell: Cell, iterations: int, importance_samples: int,
             seeds: list[int]) -> tuple[float, list[np.ndarray]]:
    """This package's fit seconds for the runs `seeds`, trained in one stacked fit, and each run's imputation."""
    imputers = [our_imputer(iterations, importance_samples, seed) for seed in seeds]
    start = time.perf_counter()
    fit_imputers(imputers, cell.masked)
    seconds = time.perf_counter() - start
    return seconds, [imputer.transform(cell.masked) for imputer in imputers]


def fit_ours_one_by_one(cell: Cell, iterations: int, importance_samples: int,
                        seeds: list[int]) -> tuple[float, list[np.ndarray]]:
    """`fit_ours` with each run fitted alone."""
    imputers = [our_imputer(iterations, importance_samples, seed) for seed in seeds]
    start = time.perf_counter()
    for imputer in imputers:
        imputer.fit(cell.masked)
    seconds = time.perf_counter() - start
    return seconds, [imputer.transform(cell.masked) for imputer in imputers]


def peer_batches(dataset: TensorDataset, iterations: int) -> DataLoader:
    """Exactly `iterations` batches of BATCH_SIZE rows in shuffled epochs, for one epoch of the peer's Trainer."""
    # without replacement the sampler runs through whole permutations, as many rows as the iterations need
    sampler = RandomSampler(dataset, num_samples=iterations * BATCH_SIZE)
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)


def fit_peer_run(cell: Cell, iterations: int, importance_samples: int, seed: int) -> tuple[float, np.ndarray]:
    """The peer's fit seconds and imputed data for one run, through its README's API."""
    filled = torch.as_tensor(np.nan_to_num(cell.masked, nan=0.0), dtype=torch.float32)
    mask = torch.as_tensor(cell.mask, dtype=torch.float32)
    dataset = TensorDataset(filled, mask)
    set_seed(seed)
    loader = peer_batches(dataset, iterations)
    # its Trainer writes TensorBoard logs and checkpoints, and prints: kept out of the repository and the output
    with tempfile.TemporaryDirectory() as logs, contextlib.redirect_stdout(io.StringIO()):
        start = time.perf_counter()
        model = NotMIWAE(input_dim=cell.complete.shape[1], latent_dim=cell.latent_dim, hidden_dim=HIDDEN,
                         n_samples=N_SAMPLES, out_dist="gauss", missing_process="selfmasking")
        trainer = Trainer(model, lr=LR, device="cpu", log_dir=logs, checkpoint_dir=logs,
                          original_data_available=False)
        trainer.train(loader, n_epochs=1)
        seconds = time.perf_counter() - start
    return seconds, impute(model, dataset, n_samples=importance_samples)


def fit_peer(cell: Cell, iterations: int, importance_samples: int,
             seeds: list[int]) -> tuple[float, list[np.ndarray]]:
    """The peer's fit seconds for the runs `seeds`, one after another, and each run's imputation."""
    fits = [fit_peer_run(cell, iterations, importance_samples, seed) for seed in seeds]
    return sum(seconds for seconds, _ in fits), [imputed for _, imputed in fits]


FITS = {OURS: fit_ours, PEER: fit_peer}


def compare(cell: Cell, runs: int, iterations: int, importance_samples: int, seed: int = 0, rounds: int = 1,
            log: Callable[[str], None] | None = None) -> dict[str, Runs]:
    """`rounds` rounds of `runs` fits of each package on `cell`, the first package switching each round; `log`,
    when given, receives a line per package and round."""
    for name, value in (("runs", runs), ("iterations", iterations), ("importance_samples", importance_samples),
                        ("rounds", rounds)):
        check_positive_integer(name, value)
    results = {name: Runs() for name in FITS}
    for round_ in range(rounds):
        seeds = [seed + round_ * runs + run for run in range(runs)]
        for name in (OURS, PEER) if round_ % 2 == 0 else (PEER, OURS):
            seconds, imputations = FITS[name](cell, iterations, importance_samples, seeds)
            results[name].seconds.append(seconds)
            results[name].runs += runs
            results[name].rmse.extend(imputation_rmse(cell.complete, imputed, cell.mask) for imputed in imputations)
            if log is not None:
                rmse = np.mean(results[name].rmse[-runs:])
                log(f"round {round_} {name}: {runs} fits {seconds:.1f} s, RMSE {rmse:.3f}")
    return results


def warm_up(cell: Cell, runs: int) -> dict[str, float]:
    """Seconds of one short fit of each package, which pays the per-process costs before the timed runs (as many
    runs as they fit: a stacked step is compiled for its number of runs)."""
    return {name: fit(cell, WARM_UP_ITERATIONS, 10, seeds=list(range(runs)))[0] for name, fit in FITS.items()}


def report(results: dict[str, Runs], iterations: int) -> list[str]:
    """A line per package (speed, mean fit seconds, RMSE mean and sd over runs), and the speed ratio last."""
    lines = []
    for name, runs in results.items():
        lines.append(f"{name:17s} {runs.run_iterations_per_second(iterations):8.1f} run-its/s  "
                     f"({sum(runs.seconds) / runs.runs:.1f} s a run)  RMSE {np.mean(runs.rmse):.3f} "
                     f"(sd {np.std(runs.rmse):.3f} over {len(runs.rmse)} runs)")
    ratio = results[OURS].run_iterations_per_second(iterations) / results[PEER].run_iterations_per_second(iterations)
    lines.append(f"ratio {OURS} / {PEER} run-its/s: {ratio:.2f}x")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=UCI_NAMES, default="banknote")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="folder with the UCI files")
    parser.add_argument("--runs", type=int, default=5, help="fits of each package a round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the first package switching each round")
    parser.add_argument("--one-by-one", action="store_true", help="this package's runs fitted each alone")
    parser.add_argument("--iterations", type=int, default=2000, help="training steps of every fit (paper: 100,000)")
    parser.add_argument("--importance-samples", type=int, default=10_000, help="samples per row of the imputation")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.one_by_one:
        FITS[OURS] = fit_ours_one_by_one
    cell = Cell(*masked_dataset(load_uci(args.dataset, args.data_dir), offset=0.0))
    rows, features = cell.complete.shape
    print(f"{args.dataset}: {rows} x {features}, {1 - cell.mask.mean():.1%} missing; {args.rounds} x {args.runs} "
          f"runs x {args.iterations} iterations of {BATCH_SIZE} rows, K = {N_SAMPLES}, 2 x {HIDDEN} tanh, latent "
          f"{cell.latent_dim}, {args.importance_samples} importance samples, {torch.get_num_threads()} thread")
    seconds = warm_up(cell, args.runs)
    print(f"warm-up fit of {WARM_UP_ITERATIONS} iterations, untimed below: "
          + ", ".join(f"{name} {value:.1f} s" for name, value in seconds.items()), flush=True)
    results = compare(cell, args.runs, args.iterations, args.importance_samples, args.seed, args.rounds,
                      log=lambda line: print(line, flush=True))
    print("\n".join(report(results, args.iterations)))


if __name__ == "__main__":
    # the warm-up fit is short, which would run eagerly: let it build the compiled step the timed fits use
    os.environ.setdefault("MNAR_RECSYS_COMPILE", "1")
    main()
