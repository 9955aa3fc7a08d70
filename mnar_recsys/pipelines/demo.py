"""The small synthetic self-masking demo: MIWAE vs not-MIWAE imputation RMSE on low-rank data.

Data: rows of a rank-3 Gaussian model over `n_features` features, standardised; in the first half of
the features a value goes missing when it is above the feature's mean (the paper's UCI protocol).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from baselines.dense_imputers import MeanImputer
from mnar_recsys.data.amputation import apply_mask, paper_self_masking, standardize
from mnar_recsys.estimators.imputer import NotMIWAEImputer
from mnar_recsys.evaluation.metrics import imputation_rmse
from mnar_recsys.inference.importance import ImportanceConfig, impute
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.pipelines.arguments import (
    TORCH_MAX_SEED,
    add_config_options,
    check_counts,
    check_seeds,
    config_from_options,
    option,
)
from mnar_recsys.training.trainer import TrainConfig, fit


@dataclass
class DemoConfig:
    n_rows: int = option(2000, "rows of synthetic data")
    n_features: int = option(10, "features; the first half are self-masked")
    rank: int = option(3, "rank of the Gaussian model the rows are drawn from")
    noise: float = option(0.3, "sd of the noise added to the low-rank rows")
    iterations: int = option(3000, "training steps of each model")
    n_samples: int = option(20, "K, importance samples of the training bound")
    importance_samples: int = option(1000, "importance samples per row for the imputation")
    seed: int = option(0, "seed of the data, initialisation, training and imputation")

    def __post_init__(self) -> None:
        check_counts(self, {**dict.fromkeys(("n_rows", "rank", "iterations", "n_samples", "importance_samples"), 1),
                            "n_features": 2})
        check_seeds("--seed", [self.seed], most=TORCH_MAX_SEED)  # torch and NumPy's Generator only
        if not (math.isfinite(self.noise) and self.noise >= 0):
            raise ValueError(f"--noise must be a finite sd, 0 or more, got {self.noise}")


def low_rank_self_masked(config: DemoConfig) -> tuple[np.ndarray, np.ndarray]:
    """(complete standardised data, the same with NaN where self-masked)."""
    rng = np.random.default_rng(config.seed)
    latent = rng.standard_normal((config.n_rows, config.rank))
    loadings = rng.standard_normal((config.rank, config.n_features))
    data = latent @ loadings + config.noise * rng.standard_normal((config.n_rows, config.n_features))
    data, _, _ = standardize(data)
    return data, apply_mask(data, paper_self_masking(data))


def demo_model_config(n_features: int, missing: str) -> ModelConfig:
    """The paper's UCI architecture, as the scikit-learn imputer builds it (MLP encoder and decoder with
    128 tanh units, latent p - 1, per-row variances; 'self-masking-known' with large values missing)."""
    return NotMIWAEImputer(missing=missing, missing_sign=-1, hidden=128).model_config(n_features)


def run_demo(config: DemoConfig, progress: bool = False) -> dict[str, float]:
    """Train the MIWAE and the not-MIWAE (self-masking, known sign); return their imputation RMSE."""
    complete, observed = low_rank_self_masked(config)
    results = {}
    for name, missing in (("miwae", "mcar"), ("notmiwae", "self-masking-known")):
        torch.manual_seed(config.seed)
        model = build_model(demo_model_config(config.n_features, missing))
        fit(model, observed, TrainConfig(iterations=config.iterations, batch_size=16, n_samples=config.n_samples,
                                         seed=config.seed, progress=progress))
        imputed = impute(model, observed, config=ImportanceConfig(n_samples=config.importance_samples,
                                                                  seed=config.seed, progress=progress))
        truth = complete[imputed.rows, imputed.cols]
        results[name] = float(np.sqrt(np.mean((imputed.mean - truth) ** 2)))
    # the observed means: the complete data's (0 after standardising) are not known under self-masking
    results["mean_imputation"] = imputation_rmse(complete, MeanImputer().fit_transform(observed),
                                                 (~np.isnan(observed)).astype(np.uint8))
    return results


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="synthetic self-masking demo: MIWAE vs not-MIWAE imputation RMSE")
    add_config_options(parser, DemoConfig)
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    config = config_from_options(args, DemoConfig)
    start = time.perf_counter()
    results = run_demo(config, progress=not args.no_progress)
    print(f"imputation RMSE on self-masked entries ({config.n_rows} rows x {config.n_features} features, "
          f"seed {config.seed}, {time.perf_counter() - start:.0f} s):")
    for name, label in (("mean_imputation", "mean imputation"), ("miwae", "MIWAE"),
                        ("notmiwae", "not-MIWAE (self-masking, known sign)")):
        print(f"  {label:40s} {results[name]:.3f}")
    return 0
