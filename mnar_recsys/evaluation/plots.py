"""Figures of the evaluations (MCAR ratings, UCI imputation) and of training, saved atomically as PNG
(matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: never open a window, also without a display

import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend
import numpy as np  # noqa: E402

from mnar_recsys.io import save_figure  # noqa: E402


def _panel_grid(n_panels: int, width: float, height: float, sharex: bool = False) -> tuple[plt.Figure, np.ndarray]:
    """Up to three panels a row, each width x height inches; the unused ones hidden."""
    columns = min(3, n_panels)
    rows = -(-n_panels // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False,
                                sharex=sharex)
    for ax in axes.ravel()[n_panels:]:
        ax.set_visible(False)
    return figure, axes


def _save(figure: plt.Figure, path: str | Path, title: str) -> Path:
    figure.suptitle(title)
    figure.tight_layout()
    try:
        return save_figure(figure, path)
    finally:
        plt.close(figure)


def prediction_histograms(predictions: dict[str, np.ndarray], truth: np.ndarray, path: str | Path,
                          title: str = "") -> Path:
    """One panel per model: the distribution of its predictions over the scored MCAR entries against the
    distribution of the true MCAR ratings (the paper's figure; MNAR-biased models sit too high)."""
    if not predictions:
        raise ValueError("no predictions to plot")
    names = list(predictions)
    figure, axes = _panel_grid(len(names), 4, 3, sharex=True)
    lo, hi = float(np.min(truth)), float(np.max(truth))
    truth_bins = np.arange(lo - 0.5, hi + 1.0, 1.0)  # one bar per rating level
    prediction_bins = np.arange(lo - 0.5, hi + 0.5 + 1e-9, 0.125)
    for ax, name in zip(axes.ravel(), names):
        ax.hist(truth, bins=truth_bins, density=True, alpha=0.35, color="grey", label="MCAR truth")
        ax.hist(predictions[name], bins=prediction_bins, density=True, histtype="step", linewidth=1.5,
                label="predicted")
        ax.set_title(name)
        ax.set_xlabel("rating")
    axes[0, 0].legend(fontsize="small")
    return _save(figure, path, title)


def per_rating_mse(records: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Grouped bars: each model's MSE on the entries of each true rating, mean over its seeds."""
    if not records:
        raise ValueError("no records to plot")
    names = list(dict.fromkeys(r["model"] for r in records))
    levels = sorted({int(level) for r in records for level in r["per_rating"]})
    width = 0.8 / len(names)
    figure, ax = plt.subplots(figsize=(max(6.0, 1.8 * len(levels)), 4.0))
    for position, name in enumerate(names):
        mine = [r["per_rating"] for r in records if r["model"] == name]
        heights = [np.mean([p[level]["mse"] for p in mine if level in p]) for level in levels]
        ax.bar(np.arange(len(levels)) + (position - (len(names) - 1) / 2) * width, heights, width, label=name)
    ax.set_xticks(np.arange(len(levels)), [str(level) for level in levels])
    ax.set_xlabel("true rating")
    ax.set_ylabel("MSE")
    ax.legend(fontsize="small", ncol=2)
    return _save(figure, path, title)


def training_curves(records: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """One panel per model that records a `training_curve`: the running mean of the bound per row while
    training and, when rows were held out, the held-out bound at each check, one colour per seed, with a
    dotted line at the iteration whose parameters were kept. A held-out curve that turns down while the
    training one still climbs is over-fitting (Coat at the paper's 10,000 steps)."""
    curves = [r for r in records if "training_curve" in r]
    if not curves:
        raise ValueError("no records with a training curve to plot")
    names = list(dict.fromkeys(r["model"] for r in curves))
    figure, axes = _panel_grid(len(names), 4.5, 3.2)
    for ax, name in zip(axes.ravel(), names):
        settled = []  # the axis leaves out the first fifth of training, whose bound is far below the rest
        for index, record in enumerate(r for r in curves if r["model"] == name):
            colour = f"C{index % 10}"
            bound, held_out = record["training_curve"]["bound"], record["training_curve"]["validation"]
            last = max((i for i, _ in bound + held_out), default=0)
            settled += [value for i, value in bound if i >= last / 5] + [value for _, value in held_out]
            if bound:
                ax.plot(*zip(*bound), color=colour, linewidth=1, label=f"seed {record['seed']}, train")
            if held_out:
                ax.plot(*zip(*held_out), "o--", color=colour, markersize=3, linewidth=1, label="held out")
            if record.get("best_iteration") is not None:
                ax.axvline(record["best_iteration"], color=colour, linestyle=":", linewidth=1)
        if settled:
            low, high = min(settled), max(settled)
            pad = 0.1 * (high - low) or 1.0
            ax.set_ylim(low - pad, high + pad)
        ax.set_title(name)
        ax.set_xlabel("iteration")
        ax.set_ylabel("bound per row")
        ax.legend(fontsize="x-small")
    return _save(figure, path, title)


def rmse_by_dataset(records: list[dict[str, Any]], reference: dict[str, dict[str, float]], path: str | Path,
                    title: str = "") -> Path:
    """One panel per data set: each model's mean RMSE over its runs with a standard-error bar, and a red
    tick at the published value where `reference[model][dataset]` gives one (the paper's table 1)."""
    if not records:
        raise ValueError("no records to plot")
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    models = list(dict.fromkeys(r["model"] for r in records))
    figure, axes = _panel_grid(len(datasets), 4.2, 0.35 * len(models) + 1.2)
    positions = np.arange(len(models))
    for ax, dataset in zip(axes.ravel(), datasets):
        values = [np.array([r["rmse"] for r in records if r["model"] == m and r["dataset"] == dataset])
                  for m in models]
        means = [v.mean() if v.size else np.nan for v in values]
        errors = [v.std(ddof=1) / np.sqrt(v.size) if v.size > 1 else 0.0 for v in values]
        ax.barh(positions, means, xerr=errors, color="C0", alpha=0.7, ecolor="0.3")
        published = [reference.get(m, {}).get(dataset, np.nan) for m in models]
        ax.plot(published, positions, "|", color="C3", markersize=14, markeredgewidth=2.5)
        ax.set_yticks(positions, models, fontsize="small")
        ax.invert_yaxis()  # the first model on top, as in the table
        ax.set_title(dataset)
        ax.set_xlabel("imputation RMSE")
    return _save(figure, path, title)
