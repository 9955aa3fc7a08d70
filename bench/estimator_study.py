"""The estimator study: a trained not-MIWAE's MCAR error as it predicts with K importance samples, x_m sampled
or integrated out of the missing factor, and the importance weights' effective sample size.

For each seed, trains notmiwae-gaussian as `mnar-recsys ratings` does (its options, but --models and
--tune-baselines), then re-imputes the seed's scored MCAR ratings with each K of --k, x_m 'sampled' (each
sample's weight takes p(s | x_o, x_m,k) at one draw of x_m, and the imputation is the decoder mean, as in the
paper's code) and 'integrated' (the weight takes the exact p(s | x_o, z_k), and the imputation is each item's
posterior mean given s_j = 0: the pipeline's default). Prints the table of MCAR MSE, MAE, ESS (mean over the
users) and seconds to predict, mean ± sd over seeds, and writes it with the records to --out (the numbers
behind docs/results.md's table).

    python bench/estimator_study.py --data coat --data-dir ../shared/data/coat --protocol paper --k 100,1000,10000
"""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mnar_recsys.estimators.recommender import NotMIWAERecommender
from mnar_recsys.evaluation.metrics import mae, mse
from mnar_recsys.evaluation.protocol import MCARSplit, mcar_split
from mnar_recsys.evaluation.reports import markdown_table, summarise
from mnar_recsys.io import provenance, write_atomic, write_json
from mnar_recsys.pipelines.arguments import add_config_options, check_no_repeats, config_from_options, integers
from mnar_recsys.pipelines.ratings import build, describe, run_settings
from mnar_recsys.pipelines.ratings_config import RatingsRun
from mnar_recsys.pipelines.ratings_data import load_data
from mnar_recsys.pipelines.workers import run_tasks

STUDIED = "notmiwae-gaussian"
FACTORS = ("sampled", "integrated")
SKIPPED = ("models", "out", "tune_baselines")  # RatingsRun's options that the study has no use for, or its own


def with_estimator(model: NotMIWAERecommender, factor: str, k: int) -> NotMIWAERecommender:
    """A copy of the fitted `model` that predicts with `k` importance samples and x_m `factor`; `model` is left
    as it was fitted."""
    copied = copy.deepcopy(model)
    copied.model.missing_factor = factor
    copied.config = replace(copied.config, importance=replace(copied.config.importance, n_samples=k))
    return copied


def estimator_records(model: NotMIWAERecommender, split: MCARSplit, ks: tuple[int, ...]) -> list[dict[str, Any]]:
    """MCAR MSE / MAE of the fitted `model` re-imputed with each K of `ks`, x_m sampled and integrated, with the
    importance weights' effective sample size averaged over the test users and the seconds it took."""
    records = []
    for factor in FACTORS:
        for k in ks:
            studied = with_estimator(model, factor, k)
            start = time.perf_counter()
            imputation = studied.impute(split.users, split.items)
            seconds = time.perf_counter() - start
            predictions = np.clip(imputation.mean, *model.config.rating_scale)  # as predict() gives them
            records.append({"model": model.name, "seed": split.seed, "missing_factor": factor, "k": k,
                            "mse": mse(split.ratings, predictions), "mae": mae(split.ratings, predictions),
                            "ess": float(imputation.ess.mean()), "predict_seconds": seconds})
    return records


def study_seed(run: RatingsRun, seed: int, ks: tuple[int, ...]) -> list[dict[str, Any]]:
    """Train the studied model on seed `seed`'s split, as the pipeline does, and re-impute it with each K."""
    data = load_data(run)
    split = mcar_split(data, seed)
    model = build(STUDIED, run, data, seed, progress=False)
    model.fit(split.train)
    return estimator_records(model, split, ks)


def estimator_table(records: list[dict[str, Any]]) -> str:
    rows = []
    for factor in FACTORS:
        for k in dict.fromkeys(r["k"] for r in records):
            mine = [r for r in records if r["missing_factor"] == factor and r["k"] == k]
            rows.append([factor, str(k), summarise([r["mse"] for r in mine]), summarise([r["mae"] for r in mine]),
                         summarise([r["ess"] for r in mine]), summarise([r["predict_seconds"] for r in mine])])
    return markdown_table(["x_m", "K", "MCAR MSE", "MCAR MAE", "ESS (mean over users)", "predict s"], rows)


def parse(argv: list[str] | None = None) -> tuple[RatingsRun, tuple[int, ...]]:
    """The run the study trains with and its Ks; bad options stop here, naming the option."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_options(parser, RatingsRun, skip=SKIPPED)
    parser.add_argument("--k", type=integers, required=True, help="importance samples to predict with, e.g. "
                        "100,1000,10000")
    parser.add_argument("--out", default="results/estimator_study", help="output folder (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        check_no_repeats("--k", args.k)
        if any(k < 1 for k in args.k):
            raise ValueError(f"--k values must be positive, got {','.join(map(str, args.k))}")
        run = config_from_options(args, RatingsRun, skip=SKIPPED, models=(STUDIED,), out=args.out)
    except ValueError as error:
        parser.error(str(error))
    return run, args.k


def main(argv: list[str] | None = None) -> dict[str, Any]:
    run, ks = parse(argv)
    data = load_data(run)
    tasks = [(run, seed, ks) for seed in run.seeds]
    by_seed = {seed: records for (_, seed, _), records in run_tasks(study_seed, tasks, run.jobs)}
    records = [record for seed in run.seeds for record in by_seed[seed]]
    results = {"data": describe(data, run), "config": {**run_settings(run), "k": ks}, "provenance": provenance(),
               "records": records}
    table = estimator_table(records)
    out = Path(run.out)
    write_json(out / "results.json", results)
    write_atomic(out / "results.md", f"# {STUDIED} on {data.name}: importance samples K and the x_m factor at "
                                     f"prediction\n\nSeeds {', '.join(map(str, run.seeds))}; mean ± sd over seeds."
                                     f"\n\n{table}\n")
    print(f"{data.name}, {STUDIED}, seeds {', '.join(map(str, run.seeds))}:\n{table}")
    return results


if __name__ == "__main__":
    main()
