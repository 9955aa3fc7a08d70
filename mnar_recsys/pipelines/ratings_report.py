"""The results.md of a `ratings` run: the table of mean ± sd over seeds per model, and the notes that say how
it was made."""

from __future__ import annotations

from typing import Any

import numpy as np

from baselines.registry import GRIDS
from mnar_recsys.data import RatingsData
from mnar_recsys.estimators.recommender import VARIANTS
from mnar_recsys.evaluation.reports import markdown_table, summarise
from mnar_recsys.pipelines.ratings_config import RatingsRun, is_reference, published, uses_mcar_sample

TABLE_NOTE = ("Methods sorted by MCAR MSE, then the reference rows (the simulator's oracle, which knows its "
              "expected ratings, and constant predictors). 'MNAR' models learn from the self-selected train ratings "
              "alone; 'MNAR + 5% MCAR' ones also from 5% of the MCAR test ratings, which no model is scored on.")


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


def report(data: RatingsData, run: RatingsRun, table: str, unfinished: int = 0) -> str:
    """The results.md text; `unfinished`: runs not yet written, said at the top until none is left."""
    lines = [f"# MCAR evaluation on {data.name}", ""]
    if unfinished:
        lines += [f"**Incomplete**: {unfinished} of the {len(run.seeds) * len(run.models)} (seed, model) runs are not "
                  "in it yet; this file is rewritten as each finishes, and the figures come at the end.", ""]
    lines += [f"{data.n_users} users x {data.n_items} items, {data.train.nnz} MNAR train ratings, "
              f"{data.test.nnz} MCAR test ratings (5% per seed held out for the models that use MCAR data, and "
              f"not scored). {protocol_note(run)}{_subsampling_note(run)}.{_tuning_note(run)} "
              "Mean ± sd over seeds; NDCG@5 with gain 2^r - 1.", "", TABLE_NOTE, "", table]
    lines += ["", "![predictions](predictions_histogram.png)", "", "![per-rating MSE](per_rating_mse.png)", ""]
    if any(name in VARIANTS for name in run.models):
        lines += ["![training curves](training_curves.png)", ""]
    return "\n".join(lines)


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
