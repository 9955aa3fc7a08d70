"""Training with the exact missing term against its estimate from m unobserved items per user.

On Yahoo-shaped simulator data (default 15,400 users x 1,000 items, ~20 ratings per user, 10 MCAR test
ratings for the first 5,400 users), trains the not-MIWAE Gaussian in the paper setup (ModelConfig
defaults; K = 20, batch 100, Adam lr 1e-3) once with the exact term and once per m in --m, from the
same seed, and prints for each: seconds per 1,000 training iterations, the ratio to the exact term,
and the MCAR MSE of exact importance-sampling inference (K = --importance-samples).

    python bench/subsampled_missing_term.py [--iterations 10000] [--users 15400] [--items 1000] [--device auto]
"""

from __future__ import annotations

import argparse

import torch

from mnar_recsys.data import SimulatorConfig, simulate_ratings
from mnar_recsys.devices import DEVICES, resolve_device
from mnar_recsys.estimators.recommender import make_recommender
from mnar_recsys.evaluation.protocol import fit_and_score, mcar_split
from mnar_recsys.inference.importance import ImportanceConfig
from mnar_recsys.training.trainer import TrainConfig

YAHOO_USERS, YAHOO_TEST_USERS = 15_400, 5_400


def train_and_score(split, m: int | None, args: argparse.Namespace, device: str) -> dict:
    """Fit the not-MIWAE Gaussian with unobserved_samples=m (None: exact) and score it on the MCAR ratings."""
    model = make_recommender("notmiwae-gaussian", seed=args.seed, unobserved_samples=m,
                             train=TrainConfig(iterations=args.iterations, device=device, progress=False),
                             importance=ImportanceConfig(n_samples=args.importance_samples, device=device))
    record, _ = fit_and_score(model, split)
    return {"per_1000": record["train_seconds"] * 1000 / args.iterations, "mse": record["mse"],
            "predict_seconds": record["predict_seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=YAHOO_USERS)
    parser.add_argument("--items", type=int, default=1_000)
    parser.add_argument("--device", choices=DEVICES, default="auto")
    parser.add_argument("--m", default="25,100,300", help="comma-separated unobserved items per user")
    parser.add_argument("--importance-samples", type=int, default=1_000, help="K for MCAR inference")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data, the split and every model")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = str(resolve_device(args.device))  # resolved once, so every model runs where the header says
    sizes = [int(v) for v in args.m.split(",") if v.strip()]
    test_users = max(1, args.users * YAHOO_TEST_USERS // YAHOO_USERS)
    data = simulate_ratings(SimulatorConfig(n_users=args.users, n_items=args.items, n_test_users=test_users,
                                            seed=args.seed))
    split = mcar_split(data, args.seed)
    print(f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} threads; {args.users} users x "
          f"{args.items} items, {data.train.nnz} train ratings, {split.n_test} MCAR ratings scored; "
          f"{args.iterations} iterations, K_pred {args.importance_samples}, seed {args.seed}")
    print("missing term       s / 1,000 it   ratio to exact   MCAR MSE   predict s")
    exact = None
    # each variant fits and predicts briefly first: torch.compile's one-off builds of its kernels would otherwise be
    # billed to the variant that runs first (13 s, more than a short run's whole training)
    warm_up = argparse.Namespace(**{**vars(args), "iterations": 5, "importance_samples": 2})
    for m in [None, *sizes]:
        train_and_score(split, m, warm_up, device)
        r = train_and_score(split, m, args, device)
        exact = exact or r["per_1000"]
        label = "exact" if m is None else f"m = {m}"
        print(f"{label:16s} {r['per_1000']:14.2f} {r['per_1000'] / exact:16.2f} {r['mse']:10.4f} "
              f"{r['predict_seconds']:11.1f}", flush=True)


if __name__ == "__main__":
    main()
