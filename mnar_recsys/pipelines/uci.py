"""The paper's UCI experiment (table 1): imputation RMSE under self-masking MNAR, six data sets.

Protocol: standardise each feature over the complete data; in the first half of the features a value
goes missing when it is above the feature's mean (+ `offset` sd); fit each imputer on the masked data
and score the RMSE of its imputations on the missing entries, in standardised units. For not-MIWAE
models also the accuracy of the learnt missing model's mask predictions on the complete data.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator

from baselines.dense_imputers import DENSE_IMPUTERS, make_dense_imputer
from mnar_recsys.data.amputation import apply_mask, paper_self_masking, standardize
from mnar_recsys.data.uci import UCI_DATASETS, UCI_NAMES, load_uci, paper_dataset
from mnar_recsys.devices import resolve_device
from mnar_recsys.estimators.imputer import NotMIWAEImputer, fit_imputers
from mnar_recsys.evaluation import plots
from mnar_recsys.evaluation.metrics import imputation_rmse
from mnar_recsys.evaluation.reports import markdown_table, summarise
from mnar_recsys.inference.importance import SAMPLED_IMPUTATIONS, check_sampled_imputation
from mnar_recsys.io import provenance, remove_previous, write_atomic, write_json
from mnar_recsys.models.config import build_model
from mnar_recsys.pipelines.arguments import (
    add_config_options,
    check_counts,
    check_device_option,
    check_no_repeats,
    check_output_folder,
    check_seeds,
    config_from_options,
    option,
)
from mnar_recsys.pipelines.output_lock import holds_output
from mnar_recsys.pipelines.workers import run_tasks, threads_per_run
from mnar_recsys.training.seeds import seeded
from mnar_recsys.training.stacked import unsupported_reason

OUTPUTS = ("results.json", "results.md", "rmse.png")

#: (decoder, missing model) of each neural model, named as in the paper's table 1
NEURAL_MODELS: dict[str, tuple[str, str]] = {
    "notmiwae-ppca-agnostic": ("linear", "agnostic"),
    "notmiwae-ppca-self-masking": ("linear", "self-masking"),
    "notmiwae-ppca-self-masking-known": ("linear", "self-masking-known"),
    "miwae": ("gaussian", "mcar"),
    "miwae-ppca": ("linear", "mcar"),
    "notmiwae-agnostic": ("gaussian", "agnostic"),
    "notmiwae-self-masking": ("gaussian", "self-masking"),
    "notmiwae-self-masking-known": ("gaussian", "self-masking-known"),
}
MODELS: tuple[str, ...] = (*NEURAL_MODELS, *DENSE_IMPUTERS)

#: The paper's table 1 (mean RMSE over 5 runs), in UCI_DATASETS order, for the results file; a variant of a
#: data set (UCI_VARIANTS) is compared with its data set's column.
PAPER_RMSE: dict[str, tuple[float, ...]] = {
    "ppca": (1.39, 1.61, 1.61, 1.57, 1.67, 0.90),
    "notmiwae-ppca-agnostic": (1.25, 1.47, 1.32, 1.27, 1.20, 0.78),
    "notmiwae-ppca-self-masking": (0.57, 1.31, 1.13, 0.99, 0.78, 0.72),
    "notmiwae-ppca-self-masking-known": (0.57, 1.31, 1.13, 0.99, 0.77, 0.72),
    "miwae": (1.19, 1.66, 1.62, 1.55, 1.72, 1.20),
    "notmiwae-agnostic": (0.80, 2.63, 1.30, 1.37, 1.43, 1.10),
    "notmiwae-self-masking": (1.88, 1.26, 1.08, 1.04, 1.48, 0.74),
    "notmiwae-self-masking-known": (0.74, 1.12, 1.07, 1.04, 1.38, 0.76),
    "lowrank-joint": (0.79, 1.57, 1.42, 1.39, 1.19, 1.22),
    "missforest": (1.28, 1.76, 1.64, 1.63, 1.66, 1.57),
    "mice": (1.41, 1.70, 1.68, 1.41, 1.72, 1.17),
    "mean": (1.73, 1.85, 1.83, 1.74, 1.69, 1.82),
}


@dataclass
class UCIConfig:
    """The paper's protocol, which every default follows: 100k iterations of 16 rows, K = 20, 10k importance
    samples, 5 runs."""

    iterations: int = option(100_000, "training steps of each neural model")
    batch_size: int = option(16, "rows per training step")
    n_samples: int = option(20, "K, importance samples of the training bound")
    importance_samples: int = option(10_000, "importance samples per row for the imputation")
    runs: int = option(5, "runs per (data set, model); run r is seeded seed + r")
    offset: float = option(0.0, "in the first half of the features, values above mean + offset sd go missing")
    seed: int = option(0, "seed of the first run")
    device: str = option("auto", "auto (CUDA when torch sees a GPU), cpu, cuda or cuda:N")
    sampled_imputation: str = option(
        "decoder-mean", "what the agnostic models (x_m sampled) average under their importance weights: "
        "decoder-mean (the paper's code) or draws (the drawn x_m, consistent)", SAMPLED_IMPUTATIONS)
    n_init: int = option(1, "fits per neural run, the one whose rows score highest kept (1: the paper's "
                            "protocol)")

    def __post_init__(self) -> None:
        check_counts(self, dict.fromkeys(("iterations", "batch_size", "n_samples", "importance_samples", "runs",
                                          "n_init"), 1))
        check_sampled_imputation(self.sampled_imputation)
        check_device_option(self.device)
        check_seeds("--seed (and the last run's seed + runs - 1)", [self.seed, self.seed + self.runs - 1])
        if not math.isfinite(self.offset):
            raise ValueError(f"--offset must be finite, got {self.offset}")


def make_imputer(model: str, config: UCIConfig, seed: int, progress: bool = False) -> BaseEstimator:
    """A fresh imputer `model` (a NEURAL_MODELS or DENSE_IMPUTERS name) seeded with `seed`; `progress`
    shows the neural imputers' progress bars."""
    if model in NEURAL_MODELS:
        decoder, missing = NEURAL_MODELS[model]
        # standardize=False: the protocol has standardised over the complete data already
        return NotMIWAEImputer(decoder=decoder, missing=missing, missing_sign=-1, n_samples=config.n_samples,
                               iterations=config.iterations, batch_size=config.batch_size,
                               importance_samples=config.importance_samples,
                               sampled_imputation=config.sampled_imputation, standardize=False,
                               random_state=seed, device=config.device, progress=progress, n_init=config.n_init)
    imputer = make_dense_imputer(model)
    params = imputer.get_params()
    if "random_state" in params:
        imputer.set_params(random_state=seed)
    if "standardize" in params:
        # as for the neural models: the data are standardised over the complete rows already. Re-centred on
        # the observed means, which the masking biases, the low-rank model (soft-impute shrinks towards 0)
        # imputed no better than the mean; PPCA, re-scaled, imputed Breast at 1.32 rather than 1.14
        imputer.set_params(standardize=False)
    return imputer


def masked_dataset(data: np.ndarray, offset: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(complete standardised data, its mask (1 = observed), the masked copy with NaN)."""
    complete, _, _ = standardize(data)
    mask = paper_self_masking(complete, offset=offset)
    return complete, mask, apply_mask(complete, mask)


def run_one(dataset: str, model: str, complete: np.ndarray, mask: np.ndarray, masked: np.ndarray, run: int,
            config: UCIConfig, progress: bool = False) -> dict[str, Any]:
    """Fit and score one model on one data set for one run; return its results record."""
    imputer = make_imputer(model, config, config.seed + run, progress)
    start = time.perf_counter()
    imputed, log_likelihood = _imputed_and_scored(model, imputer.fit(masked), masked)
    return _record(dataset, model, complete, mask, masked, run, config, imputer, imputed, log_likelihood,
                   time.perf_counter() - start, 1)


def run_runs(dataset: str, model: str, complete: np.ndarray, mask: np.ndarray, masked: np.ndarray,
             runs: tuple[int, ...], config: UCIConfig, progress: bool = False) -> list[dict[str, Any]]:
    """The records of `runs` of one model on one data set: one stacked fit of them all where `stacks` says
    so (each run's parameters its single fit's, up to rounding), else one `run_one` each."""
    if len(runs) < 2 or not stacks(model, config, masked.shape[1]):
        return [run_one(dataset, model, complete, mask, masked, run, config, progress) for run in runs]
    imputers = [make_imputer(model, config, config.seed + run, progress) for run in runs]
    start = time.perf_counter()
    fit_imputers(imputers, masked)
    share = (time.perf_counter() - start) / len(runs)  # each run's share of the stacked fit
    records = []
    for run, imputer in zip(runs, imputers):
        start = time.perf_counter()
        imputed, log_likelihood = _imputed_and_scored(model, imputer, masked)
        records.append(_record(dataset, model, complete, mask, masked, run, config, imputer, imputed,
                               log_likelihood, share + time.perf_counter() - start, len(runs)))
    return records


def stacks(model: str, config: UCIConfig, n_features: int) -> bool:
    """Whether the runs of `model` train as one stacked fit: a neural model fit once a run (n_init 1) whose
    architecture the stacked pass has (`training.stacked`; the agnostic models', x_m sampled, it has not)."""
    if model not in NEURAL_MODELS or config.n_init != 1:
        return False
    with seeded(0, torch.device("cpu")):  # a throwaway model, which must not move the caller's random state
        probe = build_model(make_imputer(model, config, 0).model_config(n_features))
    return unsupported_reason(probe) is None


def _imputed_and_scored(model: str, imputer: BaseEstimator, masked: np.ndarray) -> tuple[np.ndarray, float | None]:
    """The fitted imputer's imputation of `masked` and, for a neural model, the fit's own measure of itself,
    known without the truth (it compares runs of one model): the mean log-likelihood of the rows, from the
    imputation's draws. With n_init > 1 every fit was scored already, on these rows in these units
    (standardize=False), and the kept one scored highest (fmax: a NaN score is never kept over a number)."""
    if model not in NEURAL_MODELS:
        return imputer.transform(masked), None
    if imputer.init_scores_ is not None:
        return imputer.transform(masked), float(np.fmax.reduce(imputer.init_scores_))
    return imputer.transform_and_score(masked)


def _record(dataset: str, model: str, complete: np.ndarray, mask: np.ndarray, masked: np.ndarray, run: int,
            config: UCIConfig, imputer: BaseEstimator, imputed: np.ndarray, log_likelihood: float | None,
            seconds: float, stacked_runs: int) -> dict[str, Any]:
    """The results record of one fitted run; `stacked_runs`: how many runs its fit trained at once."""
    accuracy = scores = None
    if model in NEURAL_MODELS:
        scores = imputer.init_scores_
        if NEURAL_MODELS[model][1] != "mcar":
            accuracy = imputer.mask_accuracy(complete, mask)
    model_config = imputer.model_config(complete.shape[1]).to_dict() if model in NEURAL_MODELS else None
    return {"dataset": dataset, "model": model, "run": run, "seed": config.seed + run,
            "rmse": imputation_rmse(complete, imputed, mask), "mask_accuracy": accuracy,
            "log_likelihood": log_likelihood, "init_scores": scores, "seconds": seconds, "stacked_runs": stacked_runs,
            "n_rows": complete.shape[0], "n_features": complete.shape[1], "missing_rate": float(1 - mask.mean()),
            "config": {"protocol": asdict(config), "estimator": imputer.get_params(), "model": model_config}}


def paper_rmse(model: str, dataset: str) -> float:
    """The paper's RMSE for `model` (a PAPER_RMSE key) on `dataset`, or on the data set a variant stands in for."""
    return PAPER_RMSE[model][UCI_DATASETS.index(paper_dataset(dataset))]


def model_of_row(row: str) -> str:
    """The model a table row shows: the row's name up to the first space (see `results_markdown`)."""
    return row.split(" ")[0]


def row_order(row: str) -> tuple[int, str]:
    """Sort key of table rows: models in MODELS order, each model's variants after it, unknown ones last."""
    model = model_of_row(row)
    return MODELS.index(model) if model in MODELS else len(MODELS), row


def rmse_figure(records: list[dict[str, Any]], path: Path) -> Path:
    """rmse.png: each row's RMSE per data set, with its model's value in the paper's table 1."""
    published = {row: {name: paper_rmse(model_of_row(row), name) for name in UCI_NAMES}
                 for row in {r["model"] for r in records} if model_of_row(row) in PAPER_RMSE}
    return plots.rmse_by_dataset(records, published, path, title="UCI self-masking: imputation RMSE (bars: "
                                 "mean ± standard error over runs; red ticks: the paper)")


def results_markdown(records: list[dict[str, Any]], protocol: dict[str, Any]) -> str:
    """Mean ± standard error over runs of RMSE and mask accuracy, with the paper's RMSE alongside.

    A row is a record's `model`: a name in MODELS, or one with a suffix after a space (a variant of that
    model, as `uci-table` writes). Cells say how many runs they hold when not all hold the same number."""
    datasets = [d for d in UCI_NAMES if any(r["dataset"] == d for r in records)]
    rows = sorted(dict.fromkeys(r["model"] for r in records), key=row_order)

    def values(row: str, dataset: str, key: str) -> list[float]:
        return [r[key] for r in records if r["model"] == row and r["dataset"] == dataset and r[key] is not None]

    counts = {len(values(row, d, "rmse")) for row in rows for d in datasets} - {0}

    def cell(row: str, dataset: str, key: str) -> str:
        found = values(row, dataset, key)
        if not found:
            return "–"
        return summarise(found, error="se") + (f", n={len(found)}" if len(counts) > 1 else "")

    def paper(row: str, dataset: str) -> str:
        model = model_of_row(row)
        return f"{paper_rmse(model, dataset):.2f}" if model in PAPER_RMSE else "–"

    text = (f"# UCI self-masking: imputation RMSE (standardised units)\n\nmean ± standard error over runs; "
            f"protocol: {protocol}\n\n")
    text += markdown_table(["model", *datasets], [[m, *(cell(m, d, "rmse") for d in datasets)] for m in rows])
    text += "\n## The paper's table 1 (mean over 5 runs, 100k iterations)\n\n"
    text += markdown_table(["model", *datasets], [[m, *(paper(m, d) for d in datasets)] for m in rows])
    accuracy_models = [m for m in rows
                       if model_of_row(m) in NEURAL_MODELS and NEURAL_MODELS[model_of_row(m)][1] != "mcar"]
    if accuracy_models:
        text += "\n## Mask accuracy of the learnt missing model on the complete data\n\n"
        text += markdown_table(["model", *datasets],
                               [[m, *(cell(m, d, "mask_accuracy") for d in datasets)] for m in accuracy_models])
    return text


@holds_output("out", OUTPUTS)
def run_uci(datasets: list[str], models: list[str], config: UCIConfig, out: Path,
            data_dir: str | None = None, jobs: int = 1, progress: bool = False) -> list[dict[str, Any]]:
    """Run every (data set, model, run), rewriting results.json after each task so a long run can be followed.

    The runs of a neural model that `stacks` train as one stacked fit (one task), each run's parameters its
    single fit's up to rounding; the other runs are a task each. With `jobs` > 1 the tasks go to that many
    worker processes of one thread each (a run of 16-row batches gains little from a second thread, and much
    from a second core). A run's seeds do not depend on where it runs; its numbers may still differ from a
    one-process run in the last bits of rounding.
    `progress` shows each run's progress bars in a one-process run (workers' bars would overwrite each other).
    """
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")
    check_no_repeats("--models", models)
    if jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {jobs}")
    check_output_folder(out)
    data = {name: masked_dataset(load_uci(name, data_dir), config.offset) for name in datasets}  # fail early
    # "complete" stays false until every run and the figure are written: a stopped run's file says so
    meta = {"provenance": provenance(), "protocol": asdict(config), "data_dir": data_dir, "jobs": jobs,
            "device_used": str(resolve_device(config.device)), "threads": threads_per_run(jobs), "complete": False}
    keys = [(name, model, run) for name in data for model in models for run in range(config.runs)]
    order = {key: position for position, key in enumerate(keys)}
    tasks = []
    for name in data:
        for model in models:  # a task: all runs of a (data set, model) that fit stacked, or one run
            together = config.runs > 1 and stacks(model, config, data[name][0].shape[1])
            groups = [tuple(range(config.runs))] if together else [(run,) for run in range(config.runs)]
            tasks += [(name, model, *data[name], runs, config, progress and jobs == 1) for runs in groups]
    records: list[dict[str, Any]] = []
    for _, task_records in run_tasks(run_runs, tasks, jobs):
        if not records:  # an earlier run's files stay until this run has a record to replace them
            remove_previous(out, OUTPUTS)
        for record in task_records:
            records.append(record)
            print(f"{record['dataset']:9s} {record['model']:34s} run {record['run']}: RMSE {record['rmse']:.3f} "
                  f"({record['seconds']:.0f} s)", flush=True)
        records.sort(key=lambda r: order[r["dataset"], r["model"], r["run"]])
        write_json(out / "results.json", {**meta, "records": records})
    write_atomic(out / "results.md", results_markdown(records, asdict(config)))
    rmse_figure(records, out / "rmse.png")
    write_json(out / "results.json", {**meta, "complete": True, "records": records})
    return records


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("uci", help="the paper's UCI self-masking experiment (table 1)",
                                   description="The paper's UCI experiment; every default is the paper's protocol.")
    parser.add_argument("--dataset", choices=(*UCI_NAMES, "all"), default="all",
                        help="a data set of the paper's table, a variant of one (yeast-no-erl: see "
                             "mnar_recsys/data/uci.py), or all six (default)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS), metavar="MODEL",
                        help=f"any of {', '.join(MODELS)} (default: all)")
    parser.add_argument("--data-dir", default=None,
                        help="folder with the UCI files (default: $MNAR_RECSYS_UCI_DIR; Breast falls back to "
                             "scikit-learn's copy)")
    parser.add_argument("--out", type=Path, default=Path("results/uci"), help="output folder (default results/uci)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="worker processes, one thread each, that share the runs out (default 1: all here)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_config_options(parser, UCIConfig)
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    config = config_from_options(args, UCIConfig)
    datasets = list(UCI_DATASETS) if args.dataset == "all" else [args.dataset]
    records = run_uci(datasets, args.models, config, args.out, args.data_dir, jobs=args.jobs,
                      progress=not args.no_progress)
    print(results_markdown(records, asdict(config)))
    print(f"wrote {args.out / 'results.json'}, {args.out / 'results.md'} and {args.out / 'rmse.png'}")
    return 0
