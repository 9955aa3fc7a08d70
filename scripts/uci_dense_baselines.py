"""Imputation RMSE of the dense baselines under the not-MIWAE paper's UCI protocol (one run each).

Protocol: standardise each feature, make values above the feature mean missing in the first half of
the features (paper_self_masking, offset 0), impute, and report the RMSE over the missing entries in
standardised units.

    PYTHONPATH=. python scripts/uci_dense_baselines.py DATA_DIR [--models mean ppca ...] [--seed 0]

The baselines run with their defaults (they centre on the observed means); see LowRankJointImputer
for the paper-style `standardize=False`.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from baselines.dense_imputers import DENSE_IMPUTERS, make_dense_imputer
from mnar_recsys.data.amputation import apply_mask, paper_self_masking, standardize
from mnar_recsys.data.uci import UCI_DATASETS, load_uci

RANDOM = {"mice", "missforest", "lowrank-joint"}


def protocol_rmse(X: np.ndarray, model: str, seed: int = 0) -> float:
    """RMSE on the entries the paper's protocol hides, after imputing with ``model``."""
    Xs, _, _ = standardize(X)
    mask = paper_self_masking(Xs)
    kwargs = {"random_state": seed} if model in RANDOM else {}
    imputed = make_dense_imputer(model, **kwargs).fit_transform(apply_mask(Xs, mask))
    return float(np.sqrt(np.mean((imputed - Xs)[mask == 0] ** 2)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir")
    parser.add_argument("--models", nargs="+", default=list(DENSE_IMPUTERS), choices=list(DENSE_IMPUTERS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.simplefilter("ignore", ConvergenceWarning)
    print("model".ljust(14) + "".join(name.rjust(10) for name in UCI_DATASETS) + "   seconds")
    data = {name: load_uci(name, args.data_dir) for name in UCI_DATASETS}
    for model in args.models:
        start = time.perf_counter()
        scores = [protocol_rmse(data[name], model, args.seed) for name in UCI_DATASETS]
        print(model.ljust(14) + "".join(f"{s:10.2f}" for s in scores) + f"{time.perf_counter() - start:10.1f}", flush=True)


if __name__ == "__main__":
    main()
