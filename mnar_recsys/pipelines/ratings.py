"""`mnar-recsys ratings`: not-MIWAE vs baselines on MNAR ratings, scored on MCAR test ratings.

For every seed the MCAR sample of the models that use one (MF-IPS and others) is drawn once and left out of
scoring for all models (``mnar_recsys.evaluation.protocol``). Writes results.json (one record per model and
seed), results.md, a histogram of predictions against the MCAR truth, per-rating MSE bars and, for the
not-MIWAE and MIWAE models, their training curves. The run's options and checks are `RatingsRun`'s
(``ratings_config``), its data ``ratings_data``'s and its table ``ratings_report``'s.

With `--jobs N` the (seed, model) runs go to N worker processes of one thread each; under `torchrun`
every process trains the not-MIWAE variants together (data-parallel) and process 0 alone fits the
baselines, predicts, scores and writes.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from baselines.base import Recommender, settings_of
from baselines.registry import GRIDS, SPECS, make_baseline, tune_baseline
from mnar_recsys.data import RatingsData
from mnar_recsys.data.coat import PROPENSITIES
from mnar_recsys.data.files import sha256_of
from mnar_recsys.devices import resolve_device
from mnar_recsys.estimators.recommender import VARIANTS, NotMIWAERecommender, OracleRecommender, make_recommender
from mnar_recsys.evaluation import plots
from mnar_recsys.evaluation.protocol import MCAR_SAMPLE_FRACTION, MCARSplit, fit_and_score, mcar_split
from mnar_recsys.io import provenance, remove_previous, write_atomic, write_json
from mnar_recsys.pipelines.arguments import add_config_options, config_from_options
from mnar_recsys.pipelines.output_lock import holds_output
from mnar_recsys.pipelines.ratings_config import SYNTHETIC_ONLY, RatingsRun, uses_mcar_sample
from mnar_recsys.pipelines.ratings_data import given_propensities, load_data, simulated_test_users
from mnar_recsys.pipelines.ratings_report import TABLE_NOTE, protocol_note, report, summary_table
from mnar_recsys.pipelines.workers import run_tasks, threads_per_run
from mnar_recsys.training import distributed
from mnar_recsys.training.distributed import BACKENDS

OUTPUTS = ("results.json", "results.md", "predictions_histogram.png", "per_rating_mse.png", "training_curves.png")


def build(name: str, run: RatingsRun, data: RatingsData, seed: int, progress: bool,
          tuned: dict[str, Any] | None = None) -> Recommender:
    """A fresh, unfitted model called `name`; `tuned`: a baseline's hyper-parameters, chosen by `tune`."""
    if name == "oracle":
        return OracleRecommender(data.meta["oracle"])
    if name in VARIANTS:
        return make_recommender(name, seed=seed, rating_scale=data.rating_scale,
                                train=run.train_config(progress), importance=run.importance_config(progress),
                                unobserved_samples=run.unobserved_samples)
    seeded = {"seed": seed} if SPECS[name].seeded else {}
    return make_baseline(name, **seeded, rating_scale=data.rating_scale, **given_propensities(name, run),
                         **(tuned or {}))


def tune(name: str, split: MCARSplit, run: RatingsRun, rating_scale: tuple[float, float]) -> dict[str, Any]:
    """Baseline `name`'s hyper-parameters chosen on 10% of the seed's train ratings held out
    (`baselines.registry.tune_baseline`): the choice, every grid point's validation score and the seconds."""
    start = time.perf_counter()
    chosen, scores = tune_baseline(name, split.train, seed=split.seed, mcar_sample=split.mcar_sample,
                                   rating_scale=rating_scale, **given_propensities(name, run))
    return {"chosen": chosen, "validation": [{**grid, "score": score} for grid, score in scores],
            "seconds": time.perf_counter() - start}


def run_settings(run: RatingsRun) -> dict[str, Any]:
    """The run's configuration (the simulator's settings only when it ran), how many processes train together,
    their backend, the device `auto` chose and the CPU threads (a seed repeats a run bit for bit at a fixed
    number of threads), for the results."""
    if run.data == "synthetic":
        settings = {**asdict(run), "test_users": simulated_test_users(run)}
    else:
        settings = {name: value for name, value in asdict(run).items() if name not in SYNTHETIC_ONLY}
    return {**settings, "mcar_sample_fraction": MCAR_SAMPLE_FRACTION, "processes": distributed.world_size(),
            "backend": distributed.backend_in_use(), "device_used": str(resolve_device(run.device)),
            "threads": threads_per_run(run.jobs)}


def fit_one(run: RatingsRun, seed: int, name: str, progress: bool) -> tuple[dict[str, Any], np.ndarray]:
    """Fit and score model `name` on seed `seed`'s split: its record and its predictions (aligned with the
    split's scored ratings)."""
    data = load_data(run)
    split = mcar_split(data, seed)
    tuning = tune(name, split, run, data.rating_scale) if run.tune_baselines and name in GRIDS else None
    model = build(name, run, data, seed, progress, tuned=None if tuning is None else tuning["chosen"])
    record, predicted = fit_and_score(model, split, uses_mcar_sample(name))
    if tuning is not None:
        record["tuning"] = tuning
    record["config"] = {"run": run_settings(run), "model": settings_of(model)}
    if isinstance(model, NotMIWAERecommender):
        record["training_curve"] = {"bound": model.history.bound, "validation": model.history.validation}
        if model.history.validation:
            record["best_iteration"] = model.history.best_iteration
    return record, predicted


@holds_output("run", OUTPUTS)
def run_ratings(run: RatingsRun, progress: bool = True) -> dict[str, Any]:
    """Fit and score every model on every seed; write results.json, results.md and the plots."""
    if run.jobs > 1 and distributed.launched():
        raise ValueError("--jobs shares the runs out to worker processes; under torchrun leave it at 1")
    data = load_data(run)
    out = Path(run.out)
    tasks = [(run, seed, name, progress and run.jobs == 1) for seed in run.seeds for name in run.models]
    if not distributed.is_main_process():
        for _, seed, name, _ in tasks:  # this process's part of the not-MIWAE's data-parallel training
            model = build(name, run, data, seed, progress=False)
            if isinstance(model, NotMIWAERecommender):
                model.fit(mcar_split(data, seed).train)
        return {}
    resolve_device(run.device)
    order = {task[1:3]: position for position, task in enumerate(tasks)}
    records, predictions, finished = [], {}, {}
    # "complete" stays false until every run and figure is written: a stopped run's files say so
    results = {"data": describe(data, run), "config": run_settings(run), "provenance": provenance(), "records": records,
               "planned_runs": len(tasks), "complete": False}
    for (_, seed, name, _), (record, predicted) in run_tasks(fit_one, tasks, run.jobs):
        if not finished:  # an earlier run's files stay until this run has a record to replace them
            remove_previous(out, OUTPUTS)
        record["provenance"] = results["provenance"]
        finished[order[seed, name]] = record
        records[:] = [finished[position] for position in sorted(finished)]  # in task order, however they finish
        if seed == run.seeds[0]:
            predictions[name] = predicted
        # rewritten after every model, so a long run that is stopped keeps what it finished
        table = summary_table(records, with_published=run.data == "yahoo")
        write_json(out / "results.json", results)
        write_atomic(out / "results.md", report(data, run, table, unfinished=len(tasks) - len(records)))
        if progress:
            print(f"seed {seed} {name}: MSE {record['mse']:.3f}, MAE {record['mae']:.3f} "
                  f"({record['train_seconds']:.0f} s)", flush=True)
    first_truth = mcar_split(data, run.seeds[0]).ratings  # the histogram shows the first seed's scored entries
    plots.prediction_histograms({name: predictions[name] for name in run.models}, first_truth,
                                out / "predictions_histogram.png",
                                title=f"{data.name}, seed {run.seeds[0]}: predictions vs MCAR truth")
    plots.per_rating_mse(records, out / "per_rating_mse.png", title=f"{data.name}: MSE per true rating")
    if any("training_curve" in r for r in records):
        plots.training_curves(records, out / "training_curves.png", title=f"{data.name}: the bound while training")
    results["complete"] = True
    write_json(out / "results.json", results)
    print(f"{data.name}: {protocol_note(run)}.\n{TABLE_NOTE}\n{table}")
    return results


def describe(data: RatingsData, run: RatingsRun) -> dict[str, Any]:
    """The data's name and sizes, with the sha256 of each file read, Coat's propensities included when a model
    reads them (a file that differs from the published one warns only, so the record keeps what was read)."""
    digests = data.meta.get("sha256")
    if any(name in SPECS and SPECS[name].given_propensities for name in run.models):
        digests = {**digests, PROPENSITIES: sha256_of(Path(run.data_dir) / PROPENSITIES)}
    return {"name": data.name, "n_users": data.n_users, "n_items": data.n_items, "n_train": int(data.train.nnz),
            "n_test": int(data.test.nnz), "rating_scale": data.rating_scale, "sha256": digests}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ratings", help="not-MIWAE vs baselines on MNAR ratings, scored on MCAR ratings")
    add_config_options(parser, RatingsRun)
    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="torch.distributed backend under torchrun (default auto: nccl on GPUs, gloo on CPUs)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice; 1 is fastest on a busy machine)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars or per-model lines")
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {args.threads}")
        if args.jobs > 1:
            raise ValueError("--threads sets this process's threads; the --jobs workers take one thread each")
        torch.set_num_threads(args.threads)
    run = config_from_options(args, RatingsRun)
    if not distributed.launched():
        run_ratings(run, progress=not args.no_progress)
        return 0
    with distributed.process_group(run.device, args.backend):  # a failing rank stops its peers at once
        run_ratings(run, progress=not args.no_progress)
    return 0
