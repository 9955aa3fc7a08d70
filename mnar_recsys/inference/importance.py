"""Self-normalised importance sampling with a trained (not-)MIWAE: imputation and likelihoods.

With x_m integrated out per feature, imputations use the decoder tilted by the missing model given each
z_k, the exact posterior; with x_m sampled, ImportanceConfig.sampled_imputation chooses between the
decoder mean (the paper's) and the drawn x_m,k.

Rows are processed in chunks and the K samples of a chunk in sub-chunks, with a streaming logsumexp,
so the conditional mean (and the log-likelihood) with K = 10,000 samples over a thousand features stay within a
fixed memory budget; the median and multiple imputation keep every sample's decoder parameters at the targets.

The draws come from a generator seeded with ImportanceConfig.seed, in the order of the row chunks and their
sample sub-chunks: a call repeats bit for bit, but a row's estimate depends, within Monte Carlo error, on the
chunk sizes and on which other rows are imputed with it. The caller's global random state is left as it was.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from tqdm.auto import tqdm

from mnar_recsys.checks import check_positive_integer
from mnar_recsys.data.rows import RowBatch, RowSource
from mnar_recsys.devices import resolve_device
from mnar_recsys.inference.tilt import Posterior, conditional_mean, mixture_median
from mnar_recsys.models.notmiwae import NotMIWAE, prepare_rows
from mnar_recsys.training.seeds import seeded

METHODS = ("mean", "median", "multiple")
SAMPLED_IMPUTATIONS = ("decoder-mean", "draws")
# entries of one (rows x samples x features) sub-chunk by device type: each sub-chunk pays a few hundred
# operators' fixed cost, so larger ones are faster on either (docs/performance.md), up to what memory allows
DEFAULT_CHUNK_ENTRIES = {"cpu": 2 ** 23, "cuda": 2 ** 24}


@dataclass
class ImportanceConfig:
    """n_samples: K; row_chunk: rows per pass; chunk_entries: size of one (rows x samples x features) tensor,
    which sets the samples per sub-chunk (for the MIWAE, samples x its observed and target entries and latent
    codes), None for the default of the device (DEFAULT_CHUNK_ENTRIES); seed: seeds the draws; n_imputations:
    draws per entry for multiple imputation; device: where to compute ('auto': CUDA when available); progress:
    show a tqdm bar.

    sampled_imputation: what a model with x_m sampled averages under its weights at missing targets, for
    the mean and the median. 'decoder-mean' (the paper's code): the mean of p(x_m | z_k), low in variance,
    but the weights pick z_k, not x_m, so it ignores what the mask says about x_m within each z_k. 'draws':
    the x_m,k the weights were computed with, consistent for p(x_m | x_o, s) (drawn exactly here, on a discrete
    decoder's levels; training relaxes them). Multiple imputation resamples those x_m,k either way. Observed
    targets and the other models ignore it.
    """

    n_samples: int = 10_000
    row_chunk: int = 64
    chunk_entries: int | None = None
    seed: int = 0
    n_imputations: int = 5
    device: str = "auto"
    progress: bool = False
    sampled_imputation: str = "decoder-mean"

    def __post_init__(self) -> None:
        for name in ("n_samples", "row_chunk", "n_imputations"):
            check_positive_integer(name, getattr(self, name))
        if self.chunk_entries is not None:  # None: the device's default
            check_positive_integer("chunk_entries", self.chunk_entries)
        check_sampled_imputation(self.sampled_imputation)


def check_sampled_imputation(value: str) -> None:
    """Raise ValueError unless `value` is one of SAMPLED_IMPUTATIONS."""
    if value not in SAMPLED_IMPUTATIONS:
        raise ValueError(f"sampled_imputation must be one of {SAMPLED_IMPUTATIONS}, got {value!r}")


@dataclass
class Imputation:
    """Imputed values of the requested (row, column) targets.

    mean / median: (n_targets,) or None; draws: (n_imputations, n_targets) or None;
    ess: effective sample size of the importance weights per row, (n_rows,); log_likelihood: per row, the
    estimate of `log_likelihood` from the same draws, (n_rows,), which spares a second pass over the rows.
    """

    rows: np.ndarray
    cols: np.ndarray
    mean: np.ndarray | None
    median: np.ndarray | None
    draws: np.ndarray | None
    ess: np.ndarray
    log_likelihood: np.ndarray


def _weighted_median(alpha: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The α-weighted median of values (B, K, T) over K, alpha (B, K) summing to 1 -> (B, T)."""
    ordered, order = values.sort(dim=1)
    cumulative = alpha[:, :, None].expand_as(values).gather(1, order).cumsum(1)
    position = (cumulative < 0.5).sum(1, keepdim=True).clamp(max=values.shape[1] - 1)
    return ordered.gather(1, position)[:, 0]


def _targets_per_row(rows: np.ndarray, cols: np.ndarray, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Sort targets by row; return the order and the CSR-style row pointer."""
    order = np.argsort(rows, kind="stable")
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n_rows))])
    return order, indptr


class _Chunk:
    """Targets of one row chunk, padded to the longest row."""

    def __init__(self, start: int, stop: int, cols_sorted: np.ndarray, indptr: np.ndarray):
        counts = np.diff(indptr[start:stop + 1])
        self.width = max(int(counts.max(initial=0)), 1)
        self.valid = np.arange(self.width)[None, :] < counts[:, None]
        padded = np.zeros((stop - start, self.width), dtype=np.int64)
        padded[self.valid] = cols_sorted[indptr[start]:indptr[stop]]
        self.cols = torch.from_numpy(padded)


@torch.no_grad()
def impute(model: NotMIWAE, data: "np.ndarray | sp.spmatrix | RowSource", rows: np.ndarray | None = None,
           cols: np.ndarray | None = None, methods: tuple[str, ...] = ("mean",),
           config: ImportanceConfig | None = None) -> Imputation:
    """Impute entries (rows[i], cols[i]) of `data` by self-normalised importance sampling.

    Without rows/cols the targets are all missing entries. methods: 'mean' (conditional mean),
    'median' (conditional median) and/or 'multiple' (sampling-importance-resampling draws).
    """
    config = config or ImportanceConfig()
    unknown = set(methods) - set(METHODS)
    if unknown or not methods:
        raise ValueError(f"methods must be a non-empty subset of {METHODS}, got {methods}")
    source = prepare_rows(model, data)
    if rows is None or cols is None:
        if rows is not None or cols is not None:
            raise ValueError("give both rows and cols, or neither")
        rows, cols = _all_missing(source)
    rows, cols = np.asarray(rows), np.asarray(cols)
    for name, ids in (("rows", rows), ("cols", cols)):
        if ids.size and ids.dtype.kind not in "iu":  # a cast would truncate 0.9 to row 0 without a word
            raise ValueError(f"{name} must be integer indices, got dtype {ids.dtype}")
    rows, cols = rows.astype(np.int64), cols.astype(np.int64)
    if rows.shape != cols.shape or rows.ndim != 1:
        raise ValueError(f"rows and cols must be 1-d arrays of one length, got shapes {rows.shape}, {cols.shape}")
    if rows.size and (rows.min() < 0 or rows.max() >= source.n_rows or cols.min() < 0
                      or cols.max() >= source.n_features):
        raise ValueError(f"targets must lie in the {source.n_rows} x {source.n_features} rows")
    if "median" in methods and not model.decoder.has_cdf and (not _averages_draws(model, config)
                                                              or _any_observed(source, rows, cols)):
        raise ValueError(f"the conditional median needs the decoder's CDF, which {type(model.decoder).__name__} "
                         "does not give: ask for 'mean' or 'multiple', or, with x_m sampled, "
                         "sampled_imputation='draws' at missing targets only (an observed one has no draw)")
    device = resolve_device(config.device)
    model.to(device).eval()
    with seeded(config.seed, device):
        return _impute_targets(model, source, rows, cols, methods, config, device)


def _impute_targets(model: NotMIWAE, source: RowSource, rows: np.ndarray, cols: np.ndarray,
                    methods: tuple[str, ...], config: ImportanceConfig, device: torch.device) -> Imputation:
    order, indptr = _targets_per_row(rows, cols, source.n_rows)
    cols_sorted = cols[order]
    results = {m: np.zeros(rows.size) for m in ("mean", "median")}
    draws = np.zeros((config.n_imputations, rows.size))
    ess, log_likelihood = np.zeros(source.n_rows), np.zeros(source.n_rows)
    bar = tqdm(total=source.n_rows, disable=not config.progress, desc="imputing", mininterval=0.5)
    for start in range(0, source.n_rows, config.row_chunk):
        stop = min(start + config.row_chunk, source.n_rows)
        chunk = _Chunk(start, stop, cols_sorted, indptr)
        batch = source.batch(np.arange(start, stop)).to(device)
        out = _impute_chunk(model, batch, chunk.cols.to(device), methods, config)
        ess[start:stop], log_likelihood[start:stop] = out["ess"], out["log_likelihood"]
        positions = order[indptr[start]:indptr[stop]]
        for m in ("mean", "median"):
            if m in out:
                results[m][positions] = out[m][chunk.valid]
        if "multiple" in out:
            draws[:, positions] = out["multiple"][:, chunk.valid]
        bar.update(stop - start)
    bar.close()
    return Imputation(rows=rows, cols=cols, mean=results["mean"] if "mean" in methods else None,
                      median=results["median"] if "median" in methods else None,
                      draws=draws if "multiple" in methods else None, ess=ess, log_likelihood=log_likelihood)


def _all_missing(source: RowSource) -> tuple[np.ndarray, np.ndarray]:
    rows, cols = [], []
    for start in range(0, source.n_rows, 1024):
        mask = source.batch(np.arange(start, min(start + 1024, source.n_rows))).mask.numpy()
        r, c = np.nonzero(mask == 0)
        rows.append(r + start)
        cols.append(c)
    if not rows:  # no rows, no targets
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(rows), np.concatenate(cols)


def _any_observed(source: RowSource, rows: np.ndarray, cols: np.ndarray) -> bool:
    """Whether any target (rows[i], cols[i]) is an observed entry."""
    for start in range(0, rows.size, 1024):
        chunk_rows, chunk_cols = rows[start:start + 1024], cols[start:start + 1024]
        unique, position = np.unique(chunk_rows, return_inverse=True)
        if bool(source.batch(unique).mask[position, chunk_cols].any()):
            return True
    return False


def _sample_counts(model: NotMIWAE, batch: RowBatch, config: ImportanceConfig, n_targets: int = 0):
    """Split K into sub-chunks, as many samples per sub-chunk as config.chunk_entries (or the batch's device's
    default) allows: their sizes."""
    entries = config.chunk_entries
    if entries is None:
        entries = DEFAULT_CHUNK_ENTRIES[batch.obs_value.device.type]  # resolve_device gives 'cpu' or 'cuda'
    per_chunk = max(1, entries // model.entries_per_sample(batch, n_targets))
    for done in range(0, config.n_samples, per_chunk):
        yield min(per_chunk, config.n_samples - done)


def _draws_x_m(model: NotMIWAE) -> bool:
    """Whether the weights come with drawn x_m,k (`NotMIWAE.complete`): x_m sampled for a missing model."""
    return model.missing_factor == "sampled" and not model.missing_model.is_mcar


def _averages_draws(model: NotMIWAE, config: ImportanceConfig) -> bool:
    """Whether missing targets average the x_m,k the sampled factor drew (sampled_imputation='draws')."""
    return _draws_x_m(model) and config.sampled_imputation == "draws"


def _at_observed_targets(from_draws: torch.Tensor | None, observed: torch.Tensor,
                         from_decoder: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The estimate from the drawn x_m,k, with the decoder's in its place at observed targets (which have no
    draw) and everywhere when there are no draws; `observed` broadcasts against the estimates."""
    if from_draws is None:
        return from_decoder()
    if not bool(observed.any()):
        return from_draws
    return torch.where(observed > 0, from_decoder(), from_draws)


def _impute_chunk(model: NotMIWAE, batch: RowBatch, cols: torch.Tensor, methods: tuple[str, ...],
                  config: ImportanceConfig) -> dict[str, np.ndarray]:
    observed = batch.mask.gather(1, cols)
    use_draws = _averages_draws(model, config)
    # multiple imputation resamples the (z_k, x_m,k) pairs the weights were computed with, whatever
    # sampled_imputation says: a fresh x_m given the picked z_k would ignore the mask
    resample_draws = "multiple" in methods and _draws_x_m(model)
    keep_drawn = use_draws or resample_draws
    keep_all = "median" in methods or "multiple" in methods
    running_max = torch.full((batch.n_rows,), -float("inf"), device=batch.obs_value.device)
    weight_sum = torch.zeros_like(running_max)
    weight_sq_sum = torch.zeros_like(running_max)
    mean_sum = torch.zeros(cols.shape, device=cols.device)
    kept_log_w, kept_params, kept_offsets, kept_drawn = [], [], [], []
    for k in _sample_counts(model, batch, config, cols.numel()):
        samples = model.sample(batch, k, targets=cols)
        log_w, offset, targets = samples.terms.log_weights, samples.offset, samples.params
        drawn = samples.completed if keep_drawn else None  # the x_m,k the weights were computed with (B, K, T)
        new_max = torch.maximum(running_max, log_w.amax(1))
        rescale = torch.exp(running_max - new_max)
        w = torch.exp(log_w - new_max[:, None])
        weight_sum = weight_sum * rescale + w.sum(1)
        weight_sq_sum = weight_sq_sum * rescale ** 2 + (w ** 2).sum(1)
        if "mean" in methods:
            conditional = _at_observed_targets(drawn if use_draws else None, observed[:, None],
                                               lambda: conditional_mean(model, targets, cols, observed, offset))
            mean_sum = mean_sum * rescale[:, None] + (w[:, :, None] * conditional).sum(1)
        running_max = new_max
        if keep_all:
            kept_log_w.append(log_w)
            kept_params.append(targets)
            kept_offsets.append(offset)
            kept_drawn.append(drawn)
    out = {"ess": (weight_sum ** 2 / weight_sq_sum).cpu().numpy(),
           "log_likelihood": (weight_sum.log() + running_max - math.log(config.n_samples)).cpu().numpy()}
    if "mean" in methods:
        out["mean"] = (mean_sum / weight_sum[:, None]).cpu().numpy()
    if keep_all:
        alpha = torch.softmax(torch.cat(kept_log_w, 1), dim=1)
        params = tuple(torch.cat(parts, 1) for parts in zip(*kept_params))
        offset = None if model.row_offset is None else torch.cat(kept_offsets, 1)
        drawn = torch.cat(kept_drawn, 1) if keep_drawn else None
        if "median" in methods:
            median = _at_observed_targets(_weighted_median(alpha, drawn) if use_draws else None, observed,
                                          lambda: mixture_median(model, alpha, params, cols, observed, offset))
            out["median"] = median.cpu().numpy()
        if "multiple" in methods:
            picks = torch.multinomial(alpha, config.n_imputations, replacement=True)  # (B, M)
            rows = torch.arange(alpha.shape[0], device=alpha.device)[:, None]
            chosen = tuple(t[rows, picks] for t in params)
            chosen_offset = None if offset is None else offset[rows, picks]
            # sampling-importance-resampling: the picked x_m,k themselves, or draws given the picked z_k
            draws = _at_observed_targets(drawn[rows, picks] if resample_draws else None, observed[:, None],
                                         lambda: Posterior(model, chosen, cols, observed, chosen_offset).sample())
            out["multiple"] = draws.permute(1, 0, 2).cpu().numpy()
    return out


@torch.no_grad()
def log_likelihood(model: NotMIWAE, data: "np.ndarray | sp.spmatrix | RowSource",
                   config: ImportanceConfig | None = None) -> np.ndarray:
    """Importance-sampling estimate of log p(x_o, s) per row (log p(x_o) for the MIWAE)."""
    config = config or ImportanceConfig()
    source = prepare_rows(model, data)
    device = resolve_device(config.device)
    model.to(device).eval()
    with seeded(config.seed, device):
        return _log_likelihood_rows(model, source, config, device)


def _log_likelihood_rows(model: NotMIWAE, source: RowSource, config: ImportanceConfig,
                         device: torch.device) -> np.ndarray:
    out = np.zeros(source.n_rows)
    bar = tqdm(total=source.n_rows, disable=not config.progress, desc="log-likelihood", mininterval=0.5)
    for start in range(0, source.n_rows, config.row_chunk):
        stop = min(start + config.row_chunk, source.n_rows)
        batch = source.batch(np.arange(start, stop)).to(device)
        total = torch.full((stop - start,), -float("inf"), device=batch.obs_value.device)
        for k in _sample_counts(model, batch, config):
            total = torch.logaddexp(total, torch.logsumexp(model.exact_terms(batch, k).log_weights, dim=1))
        out[start:stop] = (total - math.log(config.n_samples)).cpu().numpy()
        bar.update(stop - start)
    bar.close()
    return out


@torch.no_grad()
def mask_accuracy(model: NotMIWAE, complete: np.ndarray, mask: np.ndarray) -> float:
    """Accuracy of the learnt missing model's predicted mask (Pr(s=1|x) > 0.5) on fully observed rows, over
    every entry, features that never go missing included (the paper's definition is silent on that)."""
    complete, mask = np.asarray(complete, dtype=np.float32), np.asarray(mask)
    if complete.shape != mask.shape:
        raise ValueError(f"complete data {complete.shape} and mask {mask.shape} must have one shape")
    if complete.ndim != 2 or complete.shape[0] == 0 or complete.shape[1] != model.n_features:
        raise ValueError(f"complete data must be rows of the model's {model.n_features} features, at least one, "
                         f"got shape {complete.shape}")
    if not np.isfinite(complete).all():
        raise ValueError("mask accuracy needs fully observed rows: the data holds NaN or inf")
    if model.missing_model.is_mcar:
        raise ValueError("the MIWAE (MCAR missing model) has no missing model to predict masks with")
    if model.row_offset is not None:
        raise ValueError("mask accuracy scores Pr(s=1|x) alone; a model with a row offset also needs each row's z")
    parameter = next(model.missing_model.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    logits = model.missing_model.logits(torch.from_numpy(complete).to(device))
    return float(((logits > 0).cpu().numpy() == (mask > 0)).mean())
