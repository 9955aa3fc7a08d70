"""Training at growing catalogue sizes, and data-parallel speed-up.

Prints, each size measured in its own process (so peak memory is its own):
  1. seconds per 1,000 training iterations of the paper's Yahoo! R3 model (set encoder, Gaussian decoder,
     item-wise missing model with x_m integrated out; batch 100, K = 20) and the peak resident memory
     (and GPU memory on a GPU) for synthetic ratings at (users, items, ratings per user) =
     (15k, 1k, 20), (100k, 10k, 20) with the exact missing term and rows in memory, and (1M, 100k, 20)
     with the subsampled unobserved-item estimator and rows read from an on-disk CSR matrix;
  2. the speed-up of 2 processes (torchrun, gloo, 1 thread each) over 1 process at the first size,
     against 1 process with 1 thread and with 2 threads (the fair comparison on a 2-core machine).
Per-iteration time is the difference of two runs of different length divided by the difference in
iterations, so data loading and set-up are not counted. The second size must fit in 8 GiB.

    python bench/scale.py [--sizes 0,1,2] [--iterations 20] [--device auto] [--unobserved-samples 100] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from isolation import peak_rss_mib  # bench/, on the path when this script runs
from mnar_recsys.data.ondisk import open_csr, save_csr
from mnar_recsys.devices import resolve_device
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.training import distributed
from mnar_recsys.training.trainer import TrainConfig, fit

SIZES = ((15_400, 1_000, 20), (100_000, 10_000, 20), (1_000_000, 100_000, 20))
OUT_OF_CORE = 2  # the size trained from disk with the subsampled estimator


def popular_ratings(n_users: int, n_items: int, per_user: int, seed: int = 0) -> sp.csr_matrix:
    """Ratings 1..5 on items drawn with Zipf-like popularity (rank^-0.8), at most `per_user` per user."""
    rng = np.random.default_rng(seed)
    weights = np.arange(1, n_items + 1, dtype=np.float64) ** -0.8
    cdf = np.cumsum(weights / weights.sum())
    items = np.minimum(np.searchsorted(cdf, rng.random(n_users * per_user)), n_items - 1)
    keys = np.unique(np.repeat(np.arange(n_users, dtype=np.int64), per_user) * n_items + items)
    users, items = np.divmod(keys, n_items)
    ratings = rng.integers(1, 6, keys.size).astype(np.float32)
    return sp.csr_matrix((ratings, (users, items)), shape=(n_users, n_items))


def per_thousand(model_config: ModelConfig, rows, iterations: int, device: str, repeats: int = 2) -> float:
    """Seconds per 1,000 iterations: (time of 2n iterations - time of n) / n, set-up excluded, each time
    the fastest of `repeats` runs (a shared machine only ever adds time); a short first run warms up
    CUDA kernels and allocators, which would otherwise bill the first timing."""
    fit(build_model(model_config), rows, TrainConfig(iterations=5, device=device, progress=False))
    fastest = {}
    for n in (iterations, 2 * iterations):
        for _ in range(repeats):
            torch.manual_seed(0)
            model = build_model(model_config)
            start = time.perf_counter()
            fit(model, rows, TrainConfig(iterations=n, device=device, progress=False))
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            fastest[n] = min(fastest.get(n, float("inf")), time.perf_counter() - start)
    return (fastest[2 * iterations] - fastest[iterations]) * 1000 / iterations


def measure(size: int, iterations: int, device: str, unobserved_samples: int, threads: int,
            data_dir: str | None) -> dict:
    torch.set_num_threads(threads)
    users, items, per_user = SIZES[size]
    if data_dir is None:
        rows, config = popular_ratings(users, items, per_user), ModelConfig(n_features=items)
    else:
        rows, config = open_csr(data_dir), ModelConfig(n_features=items, unobserved_samples=unobserved_samples)
    seconds = per_thousand(config, rows, iterations, device)
    result = {"size": size, "users": users, "items": items, "seconds_per_1000": seconds,
              "peak_rss_gib": peak_rss_mib() / 1024,
              "processes": distributed.world_size(), "threads": threads}
    if torch.cuda.is_available():
        result["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
    return result


def run_measure(args: argparse.Namespace, size: int, threads: int, processes: int = 1,
                data_dir: str | None = None) -> dict:
    """One measurement in a fresh process (torchrun for several), parsed from its last output line."""
    here = str(Path(__file__).resolve())
    options = ["--measure", str(size), "--iterations", str(args.iterations), "--device", args.device,
               "--unobserved-samples", str(args.unobserved_samples), "--threads", str(threads)]
    if data_dir is not None:
        options += ["--data-dir", data_dir]
    if processes == 1:
        command = [sys.executable, here, *options]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
                   here, *options]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    if done.returncode != 0:
        raise RuntimeError(f"measurement {size} ({processes} processes) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0,1,2", help="which of the three sizes (default all)")
    parser.add_argument("--iterations", type=int, default=20, help="n of the n vs 2n timing (default 20)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--unobserved-samples", type=int, default=100, help="m for the largest size")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per process (default 1: on a busy 2-core machine more threads only wait)")
    parser.add_argument("--no-speedup", action="store_true", help="skip the 2-process measurement")
    parser.add_argument("--measure", type=int, default=None, help=argparse.SUPPRESS)  # internal: one measurement
    parser.add_argument("--data-dir", default=None, help=argparse.SUPPRESS)  # internal: its on-disk rows
    args = parser.parse_args()
    # the kernels compiled as a long fit compiles them: the short warm-up fits would otherwise run eagerly
    os.environ.setdefault("MNAR_RECSYS_COMPILE", "1")
    if args.measure is not None:
        if distributed.launched():
            distributed.initialise(args.device)
        result = measure(args.measure, args.iterations, args.device, args.unobserved_samples, args.threads,
                         args.data_dir)
        if distributed.is_main_process():
            print(json.dumps(result), flush=True)
        distributed.shutdown()
        return
    print(f"torch {torch.__version__}, {os.cpu_count()} CPU cores, device {resolve_device(args.device)}"
          f"{' (' + torch.cuda.get_device_name() + ')' if torch.cuda.is_available() else ''}", flush=True)
    print("| users | items | rows | missing term | s / 1,000 its | peak RSS GiB | peak GPU GiB |")
    print("|---|---|---|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as scratch:
            data_dir = None
            if size == OUT_OF_CORE:  # written here, so the measuring process never holds the matrix
                data_dir = str(save_csr(popular_ratings(*SIZES[size]), Path(scratch) / "ratings"))
            r = run_measure(args, size, args.threads, data_dir=data_dir)
        where = "on disk" if size == OUT_OF_CORE else "in memory"
        term = f"subsampled m={args.unobserved_samples}" if size == OUT_OF_CORE else "exact"
        gpu = f"{r['peak_gpu_gib']:.2f}" if "peak_gpu_gib" in r else "-"
        print(f"| {r['users']:,} | {r['items']:,} | {where} | {term} | {r['seconds_per_1000']:.1f} "
              f"| {r['peak_rss_gib']:.2f} | {gpu} |", flush=True)
    if args.no_speedup:
        return
    one = run_measure(args, 0, 1)
    both = run_measure(args, 0, 2)
    two = run_measure(args, 0, 1, processes=2)
    print(f"\nsize 0, s / 1,000 its: 1 process x 1 thread {one['seconds_per_1000']:.1f}, 1 process x 2 threads "
          f"{both['seconds_per_1000']:.1f}, 2 processes x 1 thread {two['seconds_per_1000']:.1f}; speed-up of 2 "
          f"processes: {one['seconds_per_1000'] / two['seconds_per_1000']:.2f}x over 1 thread, "
          f"{both['seconds_per_1000'] / two['seconds_per_1000']:.2f}x over 2 threads")


if __name__ == "__main__":
    main()
