"""The floor of this CPU for the Yahoo! R3 training step and the K = 1,000 prediction of its MCAR cells.

Measures the peak rates the work needs (float32 matrix products of the decoder's shapes, and the missing
term's transcendental functions, reciprocal and exponential, over a large tensor, plus a copy for memory
bandwidth) and divides the work by them. One training step (batch 100, K = 20, 1,000 items, latent 30) computes
the decoder's mean at every (row, sample, item), forward and backward (three products of 2,000 x 30 x 1,000),
and the integrated missing term there: per entry one exponential, a reciprocal per Gauss-Hermite node, a
logarithm, about ten multiply-adds per node with the derivatives, and a few passes over memory. The prediction
scores 5,400 users x 1,000 samples at every item (the weights need p(s | x_o, z_k)): the forward half of the same.

    python bench/cpu_floor.py [--threads 2] [--nodes 8]
"""

from __future__ import annotations

import argparse
import time

import torch

ROWS, SAMPLES, ITEMS, LATENT = 100, 20, 1000, 30
PREDICT_USERS, PREDICT_SAMPLES = 5400, 1000
PASSES_TRAIN, PASSES_PREDICT = 6, 2  # float32 passes over the (rows x samples x items) entries, at the least


def best_seconds(work, repeats: int = 7) -> float:
    work()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)  # the floor: the least a run took


def rates() -> dict[str, float]:
    """Measured peaks: GFLOP/s of the decoder's products, and G per second of reciprocals, exponentials,
    logarithms and multiply-adds over 2M entries, and GB/s of a copy."""
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(ROWS * SAMPLES, LATENT, generator=generator)
    weight = torch.randn(LATENT, ITEMS, generator=generator)
    grad = torch.randn(ROWS * SAMPLES, ITEMS, generator=generator)
    flops = 2 * ROWS * SAMPLES * LATENT * ITEMS
    x = torch.rand(ROWS * SAMPLES * ITEMS, generator=generator) + 0.5
    out = torch.empty_like(x)
    entries = x.numel()
    return {
        "matmul GFLOP/s": 3 * flops / best_seconds(lambda: (z @ weight, grad @ weight.T, z.T @ grad)) / 1e9,
        "reciprocal G/s": entries / best_seconds(lambda: torch.reciprocal(x, out=out)) / 1e9,
        "exp G/s": entries / best_seconds(lambda: torch.exp(x, out=out)) / 1e9,
        "log G/s": entries / best_seconds(lambda: torch.log(x, out=out)) / 1e9,
        "multiply-add G/s": entries / best_seconds(lambda: torch.addcmul(x, x, x, out=out)) / 1e9,
        "copy GB/s": 2 * 4 * entries / best_seconds(lambda: out.copy_(x)) / 1e9,
    }


def floors(measured: dict[str, float], nodes: int) -> dict[str, float]:
    """Seconds of one training step and of the prediction, at the measured rates, each part done once at its
    peak and nothing overlapped: the sum of matrix products, transcendentals, multiply-adds and memory passes."""
    def seconds(entries: float, products: int, passes: int) -> float:
        flops = products * 2 * entries * LATENT
        return (flops / (measured["matmul GFLOP/s"] * 1e9)
                + entries * nodes / (measured["reciprocal G/s"] * 1e9)
                + entries / (measured["exp G/s"] * 1e9) + entries / (measured["log G/s"] * 1e9)
                + entries * nodes * 10 / (measured["multiply-add G/s"] * 1e9)
                + passes * 4 * entries / (measured["copy GB/s"] * 1e9))

    train = seconds(ROWS * SAMPLES * ITEMS, 3, PASSES_TRAIN)
    # the prediction's forward pass only: one product, the term's value without derivatives
    predict = seconds(PREDICT_USERS * PREDICT_SAMPLES * ITEMS, 1, PASSES_PREDICT)
    return {"training s per 1,000 iterations": 1000 * train, "prediction s (5,400 users, K = 1,000)": predict}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=8, help="Gauss-Hermite nodes of the missing term")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    measured = rates()
    for name, value in measured.items():
        print(f"{name:22s} {value:8.2f}")
    for name, value in floors(measured, args.nodes).items():
        print(f"floor: {name:40s} {value:8.1f}")


if __name__ == "__main__":
    main()
