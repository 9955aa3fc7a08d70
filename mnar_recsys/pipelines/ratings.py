"""`mnar-recsys ratings`: not-MIWAE vs baselines on MNAR ratings, scored on MCAR test ratings.

For every seed the MCAR sample of the models that use one (MF-IPS and others) is drawn once and left out of
scoring for all models (``mnar_recsys.evaluation.protocol``). Writes results.json (one record per model and
seed), results.md, a histogram of predictions against the MCAR truth, per-rating MSE bars and, for the
not-MIWAE and MIWAE models, their training curves.

With `--jobs N` the (seed, model) runs go to N worker processes of one thread each; under `torchrun`
every process trains the not-MIWAE variants together (data-parallel) and process 0 alone fits the
baselines, predicts, scores and writes.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from baselines.base import Recommender, settings_of
from baselines.registry import BASELINES, GRIDS, SPECS, make_baseline, tune_baseline
from mnar_recsys.checks import check_positive_finite
from mnar_recsys.data import (
    RatingsData,
    SimulatorConfig,
    load_coat,
    load_coat_propensities,
    load_yahoo_r3,
    simulate_ratings,
)
from mnar_recsys.data.coat import PROPENSITIES
from mnar_recsys.data.files import sha256_of
from mnar_recsys.data.simulator import SELECTIONS
from mnar_recsys.devices import resolve_device
from mnar_recsys.estimators.recommender import (
    PUBLISHED,
    VARIANTS,
    NotMIWAERecommender,
    OracleRecommender,
    make_recommender,
)
from mnar_recsys.evaluation import plots
from mnar_recsys.evaluation.metrics import mae, mse
from mnar_recsys.evaluation.protocol import MCAR_SAMPLE_FRACTION, MCARSplit, fit_and_score, mcar_split
from mnar_recsys.evaluation.reports import markdown_table, summarise
from mnar_recsys.inference.importance import ImportanceConfig
from mnar_recsys.io import provenance, remove_previous, write_atomic, write_json
from mnar_recsys.pipelines.arguments import (
    check_counts,
    check_device_option,
    check_no_repeats,
    check_output_folder,
    check_seeds,
)
from mnar_recsys.pipelines.output_lock import holds_output
from mnar_recsys.pipelines.workers import run_tasks, threads_per_run
from mnar_recsys.training import distributed
from mnar_recsys.training.distributed import BACKENDS
from mnar_recsys.training.trainer import TrainConfig

DATASETS = ("synthetic", "coat", "yahoo")
DEFAULT_MODELS = ("notmiwae-gaussian", "notmiwae-categorical", "notmiwae-categorical-activity", "miwae-gaussian", "mf",
                  "pmf", "autorec", "mf-ips", "train-mean", "constant-2")
# what the not-MIWAE models train with, and the seeds, by protocol: "quick" shows the paper's effect in minutes,
# "paper" takes the paper's Yahoo! R3 steps (10,000 of Adam at 1e-3) over 5 seeds; both keep the best iteration
# on the held-out users unless --validation-fraction 0 (the paper's fixed length) and predict with K = 1,000
PROTOCOLS: dict[str, dict[str, Any]] = {"quick": {"iterations": 2_000, "lr": 3e-3, "seeds": (0,)},
                                        "paper": {"iterations": 10_000, "lr": 1e-3, "seeds": (0, 1, 2, 3, 4)}}
ESTIMATOR_MODEL = "notmiwae-gaussian"  # the model the --estimator-k study re-imputes
SYNTHETIC_ONLY = ("users", "items", "test_users", "data_seed", "selection")  # RatingsRun fields of the simulator
OUTPUTS = ("results.json", "results.md", "predictions_histogram.png", "per_rating_mse.png", "training_curves.png")
# Smaller than Yahoo! R3 (15,400 x 1,000) so that the default run takes minutes on a CPU; the logistic
# selection needs 404 items or more to reach Yahoo! R3's train shares with its per-user counts
SYNTHETIC_USERS, SYNTHETIC_ITEMS = 2_000, 500


@dataclass
class RatingsRun:
    """What one `ratings` run does; see the CLI help for the meaning of each field."""

    data: str = "synthetic"
    data_dir: str | None = None
    models: tuple[str, ...] = ()
    protocol: str = "quick"
    seeds: tuple[int, ...] | None = None
    out: str = "results/ratings"
    iterations: int | None = None
    batch_size: int = 100
    lr: float | None = None
    validation_fraction: float = 0.1
    importance_samples: int = 1_000
    device: str = "auto"
    users: int = SYNTHETIC_USERS
    items: int = SYNTHETIC_ITEMS
    test_users: int | None = None
    data_seed: int = 0
    selection: str = "logistic"
    estimator_k: tuple[int, ...] = ()
    unobserved_samples: int | None = None
    jobs: int = 1
    tune_baselines: bool = False

    def __post_init__(self) -> None:
        if self.data not in DATASETS:
            raise ValueError(f"data must be one of {DATASETS}, got {self.data!r}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        if self.data != "synthetic" and not self.data_dir:
            raise ValueError(f"--data {self.data} needs --data-dir")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")
        for name, value in PROTOCOLS[self.protocol].items():  # what is left unset, the protocol sets
            if getattr(self, name) is None:
                setattr(self, name, value)
        check_no_repeats("--models", self.models)
        self.models = expand_model_sets(self.models or ("default",), self.data)
        known = set(VARIANTS) | set(BASELINES) | {"oracle"}
        unknown = [m for m in self.models if m not in known]
        if unknown:
            raise ValueError(f"unknown models {unknown}; choose from {', '.join(sorted(known))}")
        if "oracle" in self.models and self.data != "synthetic":
            raise ValueError("the oracle is only known on --data synthetic")
        given = [m for m in self.models if m in SPECS and SPECS[m].given_propensities]
        if given and self.data != "coat":
            raise ValueError(f"{given[0]} takes the propensities Coat ships with: use it with --data coat")
        if self.data == "synthetic" and self.data_dir:
            raise ValueError("--data synthetic reads no files: leave out --data-dir, or choose --data coat or yahoo")
        if not self.seeds:
            raise ValueError("give at least one seed")
        check_seeds("--seeds", self.seeds)
        check_seeds("--data-seed", [self.data_seed])
        check_positive_finite("--lr", self.lr)
        check_output_folder(self.out)
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(f"--validation-fraction must lie in [0, 1), got {self.validation_fraction}")
        check_no_repeats("--seeds", self.seeds)
        check_no_repeats("--estimator-k", self.estimator_k)
        if any(k < 1 for k in self.estimator_k):
            raise ValueError(f"--estimator-k values must be positive, got {self.estimator_k}")
        if self.estimator_k and ESTIMATOR_MODEL not in self.models:
            raise ValueError(f"--estimator-k re-imputes {ESTIMATOR_MODEL}: add it to --models")
        if self.tune_baselines and not set(GRIDS) & set(self.models):
            raise ValueError(f"--tune-baselines tunes {', '.join(GRIDS)}: add one of them to --models")
        if self.unobserved_samples is not None and self.unobserved_samples < 1:
            raise ValueError(f"--unobserved-samples must be at least 1, got {self.unobserved_samples}")
        check_counts(self, dict.fromkeys(("iterations", "batch_size", "importance_samples",
                                          "users", "items", "jobs"), 1))
        check_device_option(self.device)
        if self.test_users is not None and not 1 <= self.test_users <= self.users:
            raise ValueError(f"--test-users must lie in 1..{self.users} (--users), got {self.test_users}")
        if self.data != "synthetic":
            changed = [f"--{name.replace('_', '-')}" for name in SYNTHETIC_ONLY
                       if getattr(self, name) != RatingsRun.__dataclass_fields__[name].default]
            if changed:
                raise ValueError(f"{', '.join(changed)} set(s) the simulator, which --data {self.data} does not use")
        else:
            simulator_config(self)  # refused now, before any work, not when the data are drawn


_LOADED: dict[tuple, RatingsData] = {}  # the last data set this process loaded, by its settings


def model_set(name: str, data: str) -> tuple[str, ...]:
    """The models of set `name` on `data`: "default" (the main job's), or "paper" (every row of the not-MIWAE
    paper's Yahoo! R3 table the package has); the oracle joins either on the simulator."""
    if name == "default":
        models = DEFAULT_MODELS
    else:
        models = tuple(model for model in (*VARIANTS, *BASELINES) if published(model) is not None)
    return models + (("oracle",) if data == "synthetic" else ())


MODEL_SETS = ("default", "paper")


def expand_model_sets(names: tuple[str, ...], data: str) -> tuple[str, ...]:
    """`names` with each model-set name replaced by its models, in place, each model kept once."""
    expanded = [model for name in names for model in (model_set(name, data) if name in MODEL_SETS else (name,))]
    return tuple(dict.fromkeys(expanded))


def published(name: str) -> float | None:
    """Model `name`'s MCAR MSE in the not-MIWAE paper's Yahoo! R3 table, where it has a row."""
    return SPECS[name].published if name in SPECS else PUBLISHED.get(name)


def is_reference(name: str) -> bool:
    """Whether `name` is a reference row (the oracle, a constant predictor) rather than a method compared."""
    return name == "oracle" or (name in SPECS and SPECS[name].reference)


def load_data(run: RatingsRun) -> RatingsData:
    """The run's data set; the simulator is drawn once (data_seed), the model seeds vary on top of it.
    Kept for the process's next call with the same data settings (a worker's next task)."""
    key = (run.data, run.data_dir, run.users, run.items, run.test_users, run.data_seed, run.selection)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = _read_data(run)
    return _LOADED[key]


def _read_data(run: RatingsRun) -> RatingsData:
    if run.data == "coat":
        return load_coat(run.data_dir)
    if run.data == "yahoo":
        return load_yahoo_r3(run.data_dir)
    return simulate_ratings(simulator_config(run))


def simulator_config(run: RatingsRun) -> SimulatorConfig:
    """The simulator's settings for --data synthetic; the options that fail its checks are named."""
    try:
        return SimulatorConfig(n_users=run.users, n_items=run.items, n_test_users=simulated_test_users(run),
                               selection=run.selection, seed=run.data_seed)
    except ValueError as error:
        raise ValueError(f"--users {run.users} --items {run.items}: the simulator refuses them ({error})") from None


def simulated_test_users(run: RatingsRun) -> int:
    """--test-users, by default Yahoo! R3's share of users with MCAR ratings (5,400 of 15,400)."""
    return run.test_users if run.test_users is not None else max(1, run.users * 5_400 // 15_400)


def build(name: str, run: RatingsRun, data: RatingsData, seed: int, progress: bool,
          tuned: dict[str, Any] | None = None) -> Recommender:
    """A fresh, unfitted model called `name`; `tuned`: a baseline's hyper-parameters, chosen by `tune`."""
    if name == "oracle":
        return OracleRecommender(data.meta["oracle"])
    if name in VARIANTS:
        return make_recommender(name, seed=seed, rating_scale=data.rating_scale,
                                train=TrainConfig(iterations=run.iterations, batch_size=run.batch_size, lr=run.lr,
                                                  device=run.device, progress=progress,
                                                  validation_fraction=run.validation_fraction),
                                importance=ImportanceConfig(n_samples=run.importance_samples, device=run.device,
                                                            progress=progress),
                                unobserved_samples=run.unobserved_samples)
    seeded = {"seed": seed} if SPECS[name].seeded else {}
    return make_baseline(name, **seeded, rating_scale=data.rating_scale, **given_propensities(name, run),
                         **(tuned or {}))


def given_propensities(name: str, run: RatingsRun) -> dict[str, Any]:
    """The keywords that hand a model reading given propensities Coat's own; none for other models."""
    return {"propensities": load_coat_propensities(run.data_dir)} if SPECS[name].given_propensities else {}


def uses_mcar_sample(name: str) -> bool:
    """Whether model `name` trains with the seed's MCAR sample (the not-MIWAE models and the oracle do not)."""
    return name in SPECS and SPECS[name].uses_mcar_sample


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


def estimator_study(model: NotMIWAERecommender, split: MCARSplit, ks: tuple[int, ...]) -> list[dict[str, Any]]:
    """MCAR MSE/MAE of a trained not-MIWAE re-imputed with K samples, x_m sampled vs integrated, and the
    importance weights' effective sample size, averaged over the test users.

    The factor is switched on the trained module for inference only, then restored: 'sampled' weighs
    each sample by p(s | x_o, x_m,k) at one draw of x_m and imputes the decoder mean; 'integrated'
    integrates x_m out per item and imputes the tilted per-item posterior mean.
    """
    trained_factor = model.model.missing_factor
    original = model.config.importance
    records = []
    try:
        for factor in ("sampled", "integrated"):
            model.model.missing_factor = factor
            for k in ks:
                model.config.importance = ImportanceConfig(**{**asdict(original), "n_samples": k})
                start = time.perf_counter()
                imputation = model.impute(split.users, split.items)
                seconds = time.perf_counter() - start
                predictions = np.clip(imputation.mean, *model.config.rating_scale)  # as predict() gives them
                records.append({"model": model.name, "seed": split.seed, "missing_factor": factor, "k": k,
                                "mse": mse(split.ratings, predictions), "mae": mae(split.ratings, predictions),
                                "ess": float(imputation.ess.mean()), "predict_seconds": seconds})
    finally:
        model.model.missing_factor, model.config.importance = trained_factor, original
    return records


def fit_one(run: RatingsRun, seed: int, name: str, progress: bool) -> tuple[dict[str, Any], np.ndarray,
                                                                           list[dict[str, Any]]]:
    """Fit and score model `name` on seed `seed`'s split: its record, its predictions (aligned with the
    split's scored ratings) and, for the estimator study's model, the study's records."""
    data = load_data(run)
    split = mcar_split(data, seed)
    tuning = tune(name, split, run, data.rating_scale) if run.tune_baselines and name in GRIDS else None
    model = build(name, run, data, seed, progress, tuned=None if tuning is None else tuning["chosen"])
    record, predicted = fit_and_score(model, split, uses_mcar_sample(name))
    if tuning is not None:
        record["tuning"] = tuning
    record["config"] = {"run": run_settings(run), "model": settings_of(model)}
    studied = []
    if isinstance(model, NotMIWAERecommender):
        record["training_curve"] = {"bound": model.history.bound, "validation": model.history.validation}
        if model.history.validation:
            record["best_iteration"] = model.history.best_iteration
        if run.estimator_k and name == ESTIMATOR_MODEL:
            studied = estimator_study(model, split, run.estimator_k)
    return record, predicted, studied


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
    records, estimator, predictions, finished = [], [], {}, {}
    # "complete" stays false until every run and figure is written: a stopped run's files say so
    results = {"data": describe(data, run), "config": run_settings(run), "provenance": provenance(), "records": records,
               "estimator_k": estimator, "planned_runs": len(tasks), "complete": False}
    for (_, seed, name, _), (record, predicted, studied) in run_tasks(fit_one, tasks, run.jobs):
        if not finished:  # an earlier run's files stay until this run has a record to replace them
            remove_previous(out, OUTPUTS)
        record["provenance"] = results["provenance"]
        finished[order[seed, name]] = record
        records[:] = [finished[position] for position in sorted(finished)]  # in task order, however they finish
        estimator += studied
        estimator.sort(key=lambda r: run.seeds.index(r["seed"]))  # stable: each seed's study keeps its order
        if seed == run.seeds[0]:
            predictions[name] = predicted
        # rewritten after every model, so a long run that is stopped keeps what it finished
        table = summary_table(records, with_published=run.data == "yahoo")
        write_json(out / "results.json", results)
        write_atomic(out / "results.md", report(data, run, table, estimator, unfinished=len(tasks) - len(records)))
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


def summary_table(records: list[dict[str, Any]], with_published: bool = False) -> str:
    """Markdown table of mean ± sd over seeds per model: the methods by mean MCAR MSE, then the reference rows;
    what each trains on; with `with_published`, the paper's Yahoo! R3 number beside ours."""
    names = list(dict.fromkeys(r["model"] for r in records))
    mean_mse = {name: np.mean([r["mse"] for r in records if r["model"] == name]) for name in names}
    names.sort(key=lambda name: (is_reference(name), mean_mse[name]))
    columns = (("mse", "MCAR MSE"), ("mae", "MCAR MAE"), ("ndcg@5", "NDCG@5"), ("train_seconds", "train s"),
               ("predict_seconds", "predict s"))
    rows = []
    for name in names:
        mine = [r for r in records if r["model"] == name]
        row = [name, trained_on(name), str(len(mine))] + [summarise([r[key] for r in mine]) for key, _ in columns]
        if with_published:
            row.append("" if published(name) is None else f"{published(name):.3f}")
        rows.append(row)
    header = ["model", "trains on", "seeds"] + [label for _, label in columns]
    return markdown_table(header + (["paper (Yahoo! R3)"] if with_published else []), rows)


def trained_on(name: str) -> str:
    """What model `name` learns from, for the table: the MNAR train ratings, those and the MCAR sample, or
    nothing of the ratings (a reference row)."""
    if is_reference(name):
        return "reference"
    return "MNAR + 5% MCAR" if uses_mcar_sample(name) else "MNAR"


def estimator_table(estimator: list[dict[str, Any]]) -> str:
    rows = []
    for factor in ("sampled", "integrated"):
        for k in dict.fromkeys(r["k"] for r in estimator):
            mine = [r for r in estimator if r["missing_factor"] == factor and r["k"] == k]
            rows.append([factor, str(k), summarise([r["mse"] for r in mine]), summarise([r["mae"] for r in mine]),
                         summarise([r["ess"] for r in mine]), summarise([r["predict_seconds"] for r in mine])])
    return markdown_table(["x_m", "K", "MCAR MSE", "MCAR MAE", "ESS (mean over users)", "predict s"], rows)


def report(data: RatingsData, run: RatingsRun, table: str, estimator: list[dict[str, Any]],
           unfinished: int = 0) -> str:
    """The results.md text; `unfinished`: runs not yet written, said at the top until none is left."""
    lines = [f"# MCAR evaluation on {data.name}", ""]
    if unfinished:
        lines += [f"**Incomplete**: {unfinished} of the {len(run.seeds) * len(run.models)} (seed, model) runs are not "
                  "in it yet; this file is rewritten as each finishes, and the figures come at the end.", ""]
    lines += [f"{data.n_users} users x {data.n_items} items, {data.train.nnz} MNAR train ratings, "
              f"{data.test.nnz} MCAR test ratings (5% per seed held out for the models that use MCAR data, and "
              f"not scored). {protocol_note(run)}{_subsampling_note(run)}.{_tuning_note(run)} "
              "Mean ± sd over seeds; NDCG@5 with gain 2^r - 1.", "", TABLE_NOTE, "", table]
    if estimator:
        lines += ["", f"## {ESTIMATOR_MODEL}: importance samples K and the x_m factor at prediction", "",
                  estimator_table(estimator)]
    lines += ["", "![predictions](predictions_histogram.png)", "", "![per-rating MSE](per_rating_mse.png)", ""]
    if any(name in VARIANTS for name in run.models):
        lines += ["![training curves](training_curves.png)", ""]
    return "\n".join(lines)


TABLE_NOTE = ("Methods sorted by MCAR MSE, then the reference rows (the simulator's oracle, which knows its "
              "expected ratings, and constant predictors). 'MNAR' models learn from the self-selected train ratings "
              "alone; 'MNAR + 5% MCAR' ones also from 5% of the MCAR test ratings, which no model is scored on.")


def protocol_note(run: RatingsRun) -> str:
    """Which protocol produced the table, with what it set."""
    return (f"Protocol {run.protocol}: seeds {', '.join(map(str, run.seeds))}; not-MIWAE iterations "
            f"{run.iterations}, lr {run.lr}, importance samples {run.importance_samples}")


def _tuning_note(run: RatingsRun) -> str:
    tuned = [name for name in run.models if name in GRIDS]
    if not (run.tune_baselines and tuned):
        return ""
    return (f" Hyper-parameters of {', '.join(tuned)} chosen for each seed on 10% of its train ratings held out "
            "(IPS-weighted for the models trained with propensities).")


def _subsampling_note(run: RatingsRun) -> str:
    if run.unobserved_samples is None:
        return ""
    return f"; trained on the missing term estimated from {run.unobserved_samples} unobserved items per user"


def _ints(text: str) -> tuple[int, ...]:
    try:  # an empty item ('0,,1') is refused rather than dropped: the list may not be what was meant
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    if not names:  # an empty list would quietly run the default models
        raise argparse.ArgumentTypeError(f"expected comma-separated model names, got {text!r}")
    return names


def _protocol_help(name: str) -> str:
    settings = PROTOCOLS[name]
    return (f"{settings['iterations']:,} iterations at lr {settings['lr']:g}, seeds "
            f"{','.join(map(str, settings['seeds']))}")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ratings", help="not-MIWAE vs baselines on MNAR ratings, scored on MCAR ratings")
    parser.add_argument("--data", choices=DATASETS, default="synthetic",
                        help="synthetic: the Yahoo-like simulator, needs no files (default)")
    parser.add_argument("--data-dir", help="folder of the coat / yahoo files (none for synthetic)")
    parser.add_argument("--models", type=_names, default=(),
                        help=f"comma-separated, from {', '.join([*VARIANTS, *BASELINES, 'oracle'])}, or a model "
                             "set: default, or paper (every row of the not-MIWAE paper's Yahoo! R3 table the package "
                             f"has) (default: {','.join(DEFAULT_MODELS)}, plus oracle on synthetic)")
    parser.add_argument("--protocol", choices=tuple(PROTOCOLS), default="quick",
                        help="quick (default: " + _protocol_help("quick") + ") or paper (" + _protocol_help("paper")
                             + "); --seeds, --iterations and --lr override it")
    parser.add_argument("--seeds", type=_ints, default=None, help="comma-separated (default: the protocol's)")
    parser.add_argument("--out", default="results/ratings", help="output folder (default results/ratings)")
    parser.add_argument("--iterations", type=int, default=None,
                        help="not-MIWAE training steps (default: the protocol's)")
    parser.add_argument("--batch-size", type=int, default=100,
                        help="users per not-MIWAE step, over all processes under torchrun "
                             "(default 100, the paper's)")
    parser.add_argument("--lr", type=float, default=None, help="not-MIWAE Adam step size (default: the protocol's)")
    parser.add_argument("--validation-fraction", type=float, default=0.1,
                        help="hold out this share of the train users and keep the not-MIWAE parameters with the "
                             "best bound on them, no MCAR data used (default 0.1; 0: the paper's fixed iterations)")
    parser.add_argument("--importance-samples", type=int, default=1_000,
                        help="K for prediction by importance sampling (default 1,000; paper: 10,000)")
    parser.add_argument("--device", default="auto",
                        help="auto (default: CUDA when torch sees a GPU), cpu, cuda or cuda:N")
    parser.add_argument("--users", type=int, default=SYNTHETIC_USERS,
                        help=f"synthetic users (default {SYNTHETIC_USERS}; Yahoo! R3 has 15,400)")
    parser.add_argument("--items", type=int, default=SYNTHETIC_ITEMS,
                        help=f"synthetic items (default {SYNTHETIC_ITEMS}; Yahoo! R3 has 1,000)")
    parser.add_argument("--test-users", type=int, default=None,
                        help="synthetic users with 10 MCAR ratings (default: Yahoo's share, 5,400/15,400)")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the synthetic data (default 0)")
    parser.add_argument("--selection", choices=SELECTIONS, default="logistic",
                        help="synthetic self-selection: logistic (default: a draw per cell in the rating, the "
                             "item and the user's activity, light users dropped, as datasets/synthetic describes), "
                             "race (a fixed number of ratings per user) or independent (a logistic draw per cell "
                             "without the user's activity, the not-MIWAE's own missing model)")
    parser.add_argument("--estimator-k", type=_ints, default=(),
                        help=f"e.g. 100,1000,10000: also report {ESTIMATOR_MODEL}'s MCAR MSE for these K, "
                             "with x_m sampled and integrated (default: no such study)")
    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="torch.distributed backend under torchrun (default auto: nccl on GPUs, gloo on CPUs)")
    parser.add_argument("--unobserved-samples", type=int, default=None, metavar="M",
                        help="train the not-MIWAE models on the missing term estimated from M uniform draws of "
                             "unobserved items per user instead of all of them (large catalogues; prediction "
                             "stays exact; default: the exact term)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="worker processes, one thread each, that share the (seed, model) runs out "
                             "(default 1: all here)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice; 1 is fastest on a busy machine)")
    parser.add_argument("--tune-baselines", action="store_true",
                        help=f"choose the hyper-parameters of {', '.join(GRIDS)} for each seed on 10%% "
                             "of its train ratings held out (IPS-weighted for the models trained with propensities), "
                             "never on the scored MCAR ratings (default: keep those chosen on Coat's train ratings)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars or per-model lines")
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {args.threads}")
        if args.jobs > 1:
            raise ValueError("--threads sets this process's threads; the --jobs workers take one thread each")
        torch.set_num_threads(args.threads)
    run = RatingsRun(data=args.data, data_dir=args.data_dir, models=args.models, protocol=args.protocol,
                     seeds=args.seeds, out=args.out,
                     iterations=args.iterations, batch_size=args.batch_size, lr=args.lr,
                     validation_fraction=args.validation_fraction, importance_samples=args.importance_samples,
                     device=args.device, users=args.users, items=args.items, test_users=args.test_users,
                     data_seed=args.data_seed, selection=args.selection, estimator_k=args.estimator_k,
                     unobserved_samples=args.unobserved_samples, jobs=args.jobs,
                     tune_baselines=args.tune_baselines)
    if not distributed.launched():
        run_ratings(run, progress=not args.no_progress)
        return 0
    with distributed.process_group(run.device, args.backend):  # a failing rank stops its peers at once
        run_ratings(run, progress=not args.no_progress)
    return 0
