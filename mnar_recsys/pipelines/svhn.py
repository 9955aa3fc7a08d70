"""The paper's SVHN clipping experiment (table 2): not-MIWAE with the true missing process vs MIWAE.

Each pixel of a gray 32x32 training image is observed with probability sigmoid(-50 (x - 0.75)), so
bright pixels go missing. Both models use a conv encoder and a transposed-conv decoder (sigmoid mean,
variance floor 0.02, latent 20), K = 5, batch 64; the not-MIWAE knows the clipping model. Scores:
RMSE of the imputed clipped pixels, and the test log-likelihood of complete test images after the
encoder has been refit on complete training images with the decoder frozen (as the paper does).
"""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.figure import Figure

from mnar_recsys.checks import check_positive_finite
from mnar_recsys.data.amputation import apply_mask
from mnar_recsys.data.svhn import B, W, clipping_mask, digits_stand_in, load_svhn
from mnar_recsys.devices import resolve_device
from mnar_recsys.evaluation.metrics import imputation_rmse
from mnar_recsys.evaluation.reports import markdown_table
from mnar_recsys.inference.importance import ImportanceConfig, impute, log_likelihood
from mnar_recsys.io import provenance, remove_previous, save_figure, write_atomic, write_json
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.models.missing import MCAR
from mnar_recsys.models.notmiwae import NotMIWAE
from mnar_recsys.pipelines.arguments import (
    TORCH_MAX_SEED,
    add_config_options,
    check_counts,
    check_device_option,
    check_output_folder,
    check_seeds,
    config_from_options,
    option,
)
from mnar_recsys.pipelines.output_lock import holds_output
from mnar_recsys.training.trainer import TrainConfig, fit

MODELS = ("notmiwae", "miwae")
OUTPUTS = ("results.json", "results.md", "histograms.png", "images.png")
#: the paper's table 2: imputation RMSE and test log-likelihood (10k importance samples)
PAPER = {"notmiwae": {"rmse": 0.073, "test_log_likelihood": 1894.4},
         "miwae": {"rmse": 0.173, "test_log_likelihood": 1867.7}, "constant-ones": {"rmse": 0.176}}


@dataclass
class SVHNConfig:
    """The paper's setup: conv encoder and decoder, latent 20, K = 5, batch 64."""

    iterations: int = option(100_000, "training steps (the paper gives no count; 100,000 as for UCI)")
    refit_iterations: int = option(10_000, "encoder-only steps on complete images before the log-likelihood")
    batch_size: int = option(64, "images per training step")
    n_samples: int = option(5, "K, importance samples of the training bound")
    lr: float = option(1e-3, "Adam's step size")
    importance_samples: int = option(1_000, "importance samples per image for the imputation")
    ll_samples: int = option(10_000, "importance samples per test image for the log-likelihood")
    n_train: int = option(0, "training images used (0: all of the split; the digits stand-in has 1,797 in all)")
    n_test: int = option(0, "test images used (0: all of the split)")
    conv_channels: str = option("64,128,256", "the encoder's channel widths, comma-separated; the decoder "
                                              "mirrors them")
    seed: int = option(0, "seed of initialisation, training and imputation")
    device: str = option("auto", "auto (CUDA when torch sees a GPU), cpu, cuda or cuda:N")

    def __post_init__(self) -> None:
        check_counts(self, {**dict.fromkeys(("iterations", "refit_iterations", "batch_size", "n_samples",
                                             "importance_samples", "ll_samples"), 1), "n_train": 0, "n_test": 0})
        check_device_option(self.device)
        check_seeds("--seed", [self.seed], most=TORCH_MAX_SEED)  # torch and NumPy's Generator only
        check_positive_finite("--lr", self.lr)
        self.channels()  # a bad --conv-channels is refused now, not after the images are loaded

    def channels(self) -> tuple[int, ...]:
        try:
            channels = tuple(int(c) for c in self.conv_channels.split(","))
        except ValueError:
            raise ValueError(f"--conv-channels must be comma-separated integers, got {self.conv_channels!r}") from None
        if not channels or min(channels) < 1:
            raise ValueError(f"--conv-channels must be positive integers, got {self.conv_channels!r}")
        return channels


def check_images(images: np.ndarray, name: str) -> np.ndarray:
    """Images as float32 (N, side, side) in [0, 1] with side divisible by 8 (three stride-2 layers)."""
    images = np.asarray(images, dtype=np.float32)
    if images.ndim != 3 or images.shape[1] != images.shape[2] or images.shape[1] % 8 or len(images) == 0:
        raise ValueError(f"{name} images must have shape (N, side, side) with side divisible by 8, "
                         f"got {images.shape}")
    if not np.isfinite(images).all() or images.min() < 0 or images.max() > 1:
        raise ValueError(f"{name} images must hold finite gray values in [0, 1]")
    return images


def load_images(data_dir: str | None, config: SVHNConfig) -> tuple[np.ndarray, np.ndarray, str]:
    """(train, test, source): SVHN from `data_dir`, else the digits stand-in split in two."""
    if data_dir is not None:
        train, test = load_svhn(data_dir, "train"), load_svhn(data_dir, "test")
        rng = np.random.default_rng(config.seed)
        if config.n_train:
            train = train[rng.choice(len(train), min(config.n_train, len(train)), replace=False)]
        if config.n_test:
            test = test[rng.choice(len(test), min(config.n_test, len(test)), replace=False)]
        return train, test, f"svhn:{data_dir}"
    n_test = config.n_test or 297
    n_train = config.n_train or 1797 - n_test
    if n_train < 1:
        raise ValueError(f"--n-test {n_test} leaves none of the digits stand-in's 1,797 images for training")
    if n_train + n_test > 1797:
        raise ValueError(f"the digits stand-in has 1,797 images: --n-train {n_train} and --n-test {n_test} ask for "
                         f"{n_train + n_test}")
    images = digits_stand_in(n_train + n_test, seed=config.seed)
    return images[:n_train], images[n_train:], "digits-stand-in"


def model_config(missing: str, side: int, config: SVHNConfig) -> ModelConfig:
    """The paper's SVHN architecture; `missing` is 'fixed-logistic' (the true clipping) or 'mcar'."""
    return ModelConfig(n_features=side * side, latent_dim=20, activation="relu", encoder="conv",
                       conv_channels=config.channels(), decoder="conv-gaussian", squash=(0.0, 1.0),
                       variance="shared", min_variance=0.02, missing=missing, fixed_weight=W, fixed_offset=B,
                       missing_factor="sampled")  # slope 50: too steep for Gauss-Hermite (docs/inference.md)


def refit_encoder(model: NotMIWAE, complete: np.ndarray, train: TrainConfig) -> NotMIWAE:
    """A MIWAE copy of `model` whose encoder (started from the trained one) is refit on complete rows
    with the decoder frozen: the encoder learnt q(z | x_o) for masked rows, not for complete ones."""
    refit = NotMIWAE(copy.deepcopy(model.encoder), copy.deepcopy(model.decoder), MCAR(), model.latent_dim,
                     model.n_features, "sampled")
    refit.decoder.requires_grad_(False)  # Adam skips parameters that never receive a gradient
    fit(refit, complete, train, initialise_missing=False)
    return refit


def train_and_score(missing: str, train_images: np.ndarray, masked: np.ndarray, mask: np.ndarray,
                    test_images: np.ndarray, config: SVHNConfig,
                    progress: bool = False) -> tuple[dict[str, Any], np.ndarray]:
    """Fit one model on the masked training rows; return its scores and the imputed rows."""
    side = train_images.shape[1]
    cfg = model_config(missing, side, config)
    torch.manual_seed(config.seed)
    model = build_model(cfg)
    start = time.perf_counter()
    train = TrainConfig(iterations=config.iterations, batch_size=config.batch_size, n_samples=config.n_samples,
                        lr=config.lr, seed=config.seed, device=config.device, progress=progress)
    history = fit(model, masked, train)
    imputation = impute(model, masked, config=ImportanceConfig(n_samples=config.importance_samples, seed=config.seed,
                                                              device=config.device, progress=progress))
    complete = train_images.reshape(len(train_images), -1)
    imputed = masked.copy()
    imputed[imputation.rows, imputation.cols] = imputation.mean
    refit = refit_encoder(model, complete, TrainConfig(**{**asdict(train), "iterations": config.refit_iterations}))
    ll = log_likelihood(refit, test_images.reshape(len(test_images), -1),
                        ImportanceConfig(n_samples=config.ll_samples, seed=config.seed, device=config.device,
                                         progress=progress))
    scores = {"rmse": imputation_rmse(complete, imputed, mask), "test_log_likelihood": float(ll.mean()),
              "fraction_imputed_above_clip": float((imputation.mean > B).mean()),
              "mean_ess": float(imputation.ess.mean()), "seconds": time.perf_counter() - start,
              "final_bound": history.bound[-1][1], "model_config": cfg.to_dict()}
    return scores, imputed


def histogram_figure(truth: np.ndarray, imputed: dict[str, np.ndarray]) -> Figure:
    """Histograms of the true clipped pixel values and of each model's imputations of them."""
    figure = Figure(figsize=(4 * len(imputed), 3))
    bins = np.linspace(0, 1, 41)
    for i, (name, values) in enumerate(imputed.items()):
        axis = figure.add_subplot(1, len(imputed), i + 1)
        axis.hist(truth, bins=bins, alpha=0.5, label="true")
        axis.hist(values, bins=bins, alpha=0.5, label="imputed")
        axis.axvline(B, color="k", linestyle=":", label=f"clipping point {B}")
        axis.set_title(name)
        axis.set_xlabel("pixel value of a missing pixel")
        axis.legend(fontsize=7)
    return figure


def grid_figure(rows: dict[str, np.ndarray], n_show: int = 8) -> Figure:
    """Image grid: one row per entry of `rows` (N, side, side); NaN (missing) pixels in red."""
    figure = Figure(figsize=(1.2 * n_show, 1.3 * len(rows)))
    cmap = colormaps["gray"].with_extremes(bad="red")
    for r, (name, images) in enumerate(rows.items()):
        for c in range(min(n_show, len(images))):
            axis = figure.add_subplot(len(rows), n_show, r * n_show + c + 1)
            axis.imshow(np.ma.masked_invalid(images[c]), cmap=cmap, vmin=0, vmax=1)
            axis.set_xticks([])
            axis.set_yticks([])
            if c == 0:
                axis.set_ylabel(name, fontsize=8)
    return figure


def run_svhn(config: SVHNConfig, out: Path, data_dir: str | None = None, progress: bool = False) -> dict[str, Any]:
    """Run the experiment on SVHN (`data_dir`) or the digits stand-in; see `run_clipping`."""
    check_output_folder(out)  # before reading the images, as run_clipping checks again for its other callers
    train_images, test_images, source = load_images(data_dir, config)
    return run_clipping(train_images, test_images, config, out, source, progress)


@holds_output("out", OUTPUTS)
def run_clipping(train_images: np.ndarray, test_images: np.ndarray, config: SVHNConfig, out: Path,
                 source: str, progress: bool = False) -> dict[str, Any]:
    """Clip, fit both models, score; write results.json / results.md / figures to `out`; return the results.
    `progress` shows progress bars for training and importance sampling."""
    check_output_folder(out)
    train_images, test_images = check_images(train_images, "training"), check_images(test_images, "test")
    flat = train_images.reshape(len(train_images), -1)
    mask = clipping_mask(flat, np.random.default_rng(config.seed))
    masked = apply_mask(flat, mask)
    results: dict[str, Any] = {"constant-ones": {"rmse": imputation_rmse(flat, np.ones_like(flat), mask)}}
    payload = {"provenance": provenance(), "config": asdict(config), "device_used": str(resolve_device(config.device)),
               "threads": torch.get_num_threads(), "source": source,
               "n_train": len(train_images), "n_test": len(test_images), "missing_rate": float(1 - mask.mean()),
               "results": results, "paper": PAPER, "complete": False}
    imputed = {}
    for name, missing in zip(MODELS, ("fixed-logistic", "mcar")):
        results[name], imputed[name] = train_and_score(missing, train_images, masked, mask, test_images, config,
                                                       progress)
        if name == MODELS[0]:  # an earlier run's files stay until this run has a result to replace them
            remove_previous(out, OUTPUTS)
        write_json(out / "results.json", payload)  # after each model, so a stopped run keeps what it finished
    missing_entries = mask == 0
    save_figure(histogram_figure(flat[missing_entries], {m: imputed[m][missing_entries] for m in MODELS}),
                out / "histograms.png")
    shape = train_images.shape
    save_figure(grid_figure({"original": train_images, "masked": masked.reshape(shape),
                             **{m: imputed[m].reshape(shape) for m in MODELS}}), out / "images.png")
    write_atomic(out / "results.md", results_markdown(payload))
    payload["complete"] = True
    write_json(out / "results.json", payload)
    return payload


def results_markdown(payload: dict[str, Any]) -> str:
    results = payload["results"]

    def cell(model: str, key: str, source: dict) -> str:
        value = source.get(model, {}).get(key)
        return "–" if value is None else f"{value:.3f}" if key == "rmse" else f"{value:.1f}"

    rows = [[m, cell(m, "rmse", results), cell(m, "rmse", PAPER), cell(m, "test_log_likelihood", results),
             cell(m, "test_log_likelihood", PAPER)] for m in (*MODELS, "constant-ones")]
    return (f"# SVHN clipping ({payload['source']}, {payload['n_train']} training / {payload['n_test']} test "
            f"images, {payload['missing_rate']:.1%} of pixels missing)\n\nconfig: {payload['config']}\n\n"
            + markdown_table(["model", "RMSE (clipped pixels)", "paper", "test log-likelihood", "paper"], rows)
            + "\nFigures: histograms.png (imputed vs true clipped pixels), images.png "
              "(original / masked / not-MIWAE / MIWAE).\n")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("svhn", help="the paper's SVHN clipping experiment (table 2)",
                                   description="The paper's SVHN clipping experiment; the defaults are the paper's "
                                               "setup where it gives one.")
    parser.add_argument("--data", choices=("digits", "svhn"), default=None,
                        help="'digits' (scikit-learn's digits up-sampled to 32x32; the default without "
                             "--data-dir) or 'svhn' (needs --data-dir)")
    parser.add_argument("--data-dir", default=None, help="folder with train_32x32.mat and test_32x32.mat")
    parser.add_argument("--out", type=Path, default=Path("results/svhn"), help="output folder (default results/svhn)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_config_options(parser, SVHNConfig)
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    if args.data == "svhn" and args.data_dir is None:
        raise ValueError("--data svhn needs --data-dir with the SVHN .mat files")
    if args.data == "digits" and args.data_dir is not None:
        raise ValueError("--data digits takes no --data-dir")
    config = config_from_options(args, SVHNConfig)
    payload = run_svhn(config, args.out, args.data_dir, progress=not args.no_progress)
    print(results_markdown(payload))
    print(f"wrote {args.out}/results.json, results.md, histograms.png, images.png")
    return 0
