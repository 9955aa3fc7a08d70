"""Speed and memory of the core engine at the paper's Yahoo! R3 shape.

Prints, each measured in its own process (so peak memory is its own):
  1. seconds per 1,000 training iterations (15,400 x 1,000 sparse rows, ~20 observed per row, batch 100,
     K = 20, latent 30, embedding 20, code 50), with sampled and with integrated x_m (the latter also
     with glibc's default allocator settings, which the command line changes: `mnar_recsys.allocator`,
     its missing term alone, fused into one compiled pass against the compiled elementwise kernel with
     the mask and sum around it and against that kernel's eager loop, with and without gradients, and its
     decoder's mean at every item alone, the least an exact step computes), with integrated x_m and the
     missing term estimated from --unobserved-samples unobserved items per row; and for the categorical
     decoder with the row offset (`notmiwae-categorical-activity`), also with glibc's default allocator,
     whose exact sum over the levels, fused into one compiled pass, is timed against the looped kernel
     and the same sum written with PyTorch's log_softmax and logsumexp. Each after a 5-step
     warm-up fit, timed apart, which includes torch.compile's build of the quadrature kernel;
  2. the imputation of 5,400 rows x 10 held-out items with K = 10,000 (integrated x_m), after a 2-row
     warm-up that builds the quadrature kernel; by default on --impute-rows rows and scaled linearly to
     5,400 (the work is per row), --impute-rows 5400 for all; the decoder's mean alone at all its (row,
     sample, item) entries, the least an exact imputation computes; training and imputation of the MIWAE,
     whose decoder runs only where an observed or imputed entry needs it;
  3. the set encoder's sparse segment-sum path against a dense masked one, and a training step from CSR
     rows against the same rows given dense with NaN, at 1,000 and 10,000 items with 20 observed per row.
Targets on the 2-core machine: <= 10 s per 1,000 iterations, <= 30 s for the imputation.

    python bench/core_speed.py [--iterations 1000] [--impute-rows 270] [--unobserved-samples 100]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from isolation import isolated, peak_rss_mib  # bench/, on the path when this script runs
from mnar_recsys.data.rows import as_rows
from mnar_recsys.inference.importance import DEFAULT_CHUNK_ENTRIES, ImportanceConfig, impute
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.models.integrated import gaussian_affine
from mnar_recsys.models.integrated.categorical import (
    log_expected_sigmoid_categorical,
    masked_log_expected_sigmoid_categorical_sum,
)
from mnar_recsys.models.integrated.gaussian_affine import masked_log_expected_sigmoid_sum
from mnar_recsys.training.trainer import TrainConfig, fit

USERS, ITEMS, PER_ROW, TEST_USERS, TEST_ITEMS = 15_400, 1_000, 20, 5_400, 10
IMPUTE_ROWS = ImportanceConfig().row_chunk  # rows x samples of one imputation sub-chunk
IMPUTE_SAMPLES = DEFAULT_CHUNK_ENTRIES["cpu"] // (IMPUTE_ROWS * ITEMS)


def yahoo_shaped(n_rows: int, n_items: int, per_row: int, seed: int = 0) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    cols = np.argsort(rng.random((n_rows, n_items)), axis=1)[:, :per_row].ravel()
    rows = np.repeat(np.arange(n_rows), per_row)
    return sp.csr_matrix((rng.integers(1, 6, rows.size).astype(np.float32), (rows, cols)), shape=(n_rows, n_items))


def train_seconds(missing_factor: str, iterations: int, unobserved_samples: int | None = None,
                  decoder: str = "gaussian", row_offset: bool = False, missing: str = "itemwise") -> dict:
    data = yahoo_shaped(USERS, ITEMS, PER_ROW)
    config = ModelConfig(n_features=ITEMS, missing_factor=missing_factor, decoder=decoder, missing=missing,
                         unobserved_samples=unobserved_samples, row_offset=row_offset)
    start = time.perf_counter()
    # a short fit first, so that torch.compile's one-off build of the quadrature kernel is timed apart
    fit(build_model(config), data, TrainConfig(iterations=5, progress=False))
    warm_up = time.perf_counter() - start
    model = build_model(config)
    start = time.perf_counter()
    fit(model, data, TrainConfig(iterations=iterations, progress=False))
    seconds = time.perf_counter() - start
    return {"per_1000": seconds * 1000 / iterations, "peak_mib": peak_rss_mib(), "warm_up": warm_up}


def impute_seconds(n_rows: int, n_samples: int, missing: str = "itemwise") -> dict:
    data = yahoo_shaped(n_rows, ITEMS, PER_ROW)
    rng = np.random.default_rng(1)
    targets = np.argsort(rng.random((n_rows, ITEMS)), axis=1)[:, :TEST_ITEMS]
    model = build_model(ModelConfig(n_features=ITEMS, missing=missing))
    rows, cols = np.repeat(np.arange(n_rows), TEST_ITEMS), targets.ravel()
    config = ImportanceConfig(n_samples=n_samples)
    # two rows first, so that torch.compile's build of the quadrature kernel is not scaled up with the rows
    impute(model, data, rows[:2 * TEST_ITEMS], cols[:2 * TEST_ITEMS], config=config)
    start = time.perf_counter()
    impute(model, data, rows, cols, config=config)
    return {"seconds": time.perf_counter() - start, "peak_mib": peak_rss_mib()}


def _dense_set_encoder(encoder, values: torch.Tensor, mask: torch.Tensor):
    """The set encoder written densely over all items: what the segment sums avoid."""
    weight_e, weight_x = encoder.shared.weight[:, :-1], encoder.shared.weight[:, -1]
    item_code = encoder.embedding @ weight_e.T + encoder.shared.bias
    per_entry = encoder.activation(item_code[None] + values[..., None] * weight_x)  # (B, p, C)
    return encoder.head((per_entry * mask[..., None]).sum(1))


def _time(step, repeats: int) -> float:
    step()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - start) / repeats


def missing_term_seconds(mode: str, repeats: int = 20) -> dict:
    """The Gaussian decoder's integrated missing term over a batch's (100 x 20 x 1,000) entries, one sd per
    item, the item-wise model's one slope: Σ_j (1 - s_j) log E[sigmoid(-(w x_j + b_j))], forward and backward
    ('train') and forward alone ('impute'). mode 'fused': one compiled pass for the affine map, quadrature,
    mask and sum; 'composed': the compiled elementwise kernel with the rest around it; 'eager': the
    elementwise kernel's eager node loop."""
    if mode != "fused":  # this process only: `isolated` runs each call in its own
        gaussian_affine._fusable = lambda *args: False
    if mode == "eager":
        gaussian_affine._compiled_node_sums.eager = True
    generator = torch.Generator().manual_seed(0)
    loc = (1 + 4 * torch.rand(100, 20, ITEMS, generator=generator)).requires_grad_()
    keep = (torch.rand(100, 1, ITEMS, generator=generator) > PER_ROW / ITEMS).float()
    slope = torch.tensor(0.7, requires_grad=True)
    intercept = (torch.randn(ITEMS, generator=generator) - 2).requires_grad_()
    sd = (0.5 + torch.rand(ITEMS, generator=generator)).requires_grad_()

    def term():
        return masked_log_expected_sigmoid_sum(loc, slope, intercept, sd, keep)

    def impute():
        with torch.no_grad():
            term()

    return {"train": _time(lambda: term().sum().backward(), repeats), "impute": _time(impute, repeats)}


def decoder_seconds(repeats: int = 20) -> dict:
    """The Gaussian decoder's squashed mean at every item: forward and backward at a training step's
    (100 x 20) samples, and forward alone at a CPU imputation sub-chunk's (ImportanceConfig's defaults on a CPU).
    Any exact not-MIWAE step or imputation computes at least this."""
    decoder = build_model(ModelConfig(n_features=ITEMS)).decoder
    generator = torch.Generator().manual_seed(0)
    z_train = torch.randn(100, 20, decoder.mean_head.in_features, generator=generator)
    z_impute = torch.randn(IMPUTE_ROWS, IMPUTE_SAMPLES, decoder.mean_head.in_features, generator=generator)

    def train_step():
        decoder(z_train)[0].sum().backward()

    def impute_chunk():
        with torch.no_grad():
            decoder(z_impute)

    return {"train": _time(train_step, repeats), "impute": _time(impute_chunk, repeats)}


def categorical_sum_seconds(repeats: int = 5) -> dict:
    """Forward and backward of Σ_j keep_j log Σ_c π_c σ(-(s_c + a)) over a batch's (100 x 20 x 1,000 x 5)
    levels, the logits laid out level-major as the decoder gives them: the fused pass, the looped kernel
    and the same sum written with log_softmax and logsumexp."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(100, 20, 5, ITEMS, generator=generator).transpose(-1, -2).requires_grad_()
    selection = torch.randn(ITEMS, 5, generator=generator).requires_grad_()
    offset = torch.randn(100, 20, 1, generator=generator).requires_grad_()
    keep = (torch.rand(100, 1, ITEMS, generator=generator) > PER_ROW / ITEMS).float()

    def fused():
        masked_log_expected_sigmoid_categorical_sum(logits, selection, keep, offset).sum().backward()

    def looped():
        (keep * log_expected_sigmoid_categorical(logits, selection, offset)).sum().backward()

    def reference():
        log_pi = F.log_softmax(logits, -1)
        summed = torch.logsumexp(log_pi + F.logsigmoid(-(selection + offset[..., None])), -1)
        (keep * summed).sum().backward()

    return {"fused": _time(fused, repeats), "looped": _time(looped, repeats), "reference": _time(reference, repeats)}


def sparse_vs_dense(n_items: int, repeats: int = 20) -> dict:
    csr = yahoo_shaped(100, n_items, PER_ROW)
    dense = csr.toarray()
    dense[dense == 0] = np.nan
    model = build_model(ModelConfig(n_features=n_items, missing_factor="integrated"))
    sparse_rows, dense_rows = as_rows(csr), as_rows(dense)
    index = np.arange(100)
    batch = sparse_rows.batch(index)

    def encoder_sparse():
        model.encoder(batch)[0].sum().backward()

    def encoder_dense():
        _dense_set_encoder(model.encoder, batch.values, batch.mask)[0].sum().backward()

    def step(rows):
        return lambda: model.bound(rows.batch(index), 20).mean().backward()

    return {"encoder_sparse": _time(encoder_sparse, repeats), "encoder_dense": _time(encoder_dense, repeats),
            "step_csr": _time(step(sparse_rows), 5), "step_dense": _time(step(dense_rows), 5)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--impute-rows", type=int, default=270)
    parser.add_argument("--importance-samples", type=int, default=10_000)
    parser.add_argument("--unobserved-samples", type=int, default=100,
                        help="m of the subsampled missing-term estimator also timed (default 100)")
    args = parser.parse_args()
    # the kernels compiled as a long fit compiles them: the short warm-up fits would otherwise run eagerly
    os.environ.setdefault("MNAR_RECSYS_COMPILE", "1")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    floor = isolated(decoder_seconds)
    for factor, m in (("sampled", None), ("integrated", None), ("integrated", args.unobserved_samples)):
        r = isolated(train_seconds, factor, args.iterations, m)
        term = "exact missing term" if m is None else f"missing term from {m} unobserved items per row"
        print(f"training, {factor:10s} x_m, {term}: {r['per_1000']:7.1f} s per 1,000 iterations "
              f"(target 10; ratio {r['per_1000'] / 10:.1f}x), peak {r['peak_mib']:.0f} MiB; "
              f"the first 5 iterations, compiling included: {r['warm_up']:.1f} s")
        if factor == "integrated" and m is None:
            untuned = isolated(train_seconds, factor, args.iterations, m, keep_memory=False)
            print(f"  the same with glibc's default allocator settings: {untuned['per_1000']:7.1f} s "
                  f"(ratio {untuned['per_1000'] / r['per_1000']:.2f}x), peak {untuned['peak_mib']:.0f} MiB")
            term = {mode: isolated(missing_term_seconds, mode) for mode in ("fused", "composed", "eager")}
            for key, what in (("train", "forward and backward"), ("impute", "forward alone")):
                fused, composed, eager = (term[mode][key] * 1e3 for mode in ("fused", "composed", "eager"))
                print(f"  its Gauss-Hermite missing term, {what}: {fused:.1f} ms fused vs {composed:.1f} ms "
                      f"composed of the compiled elementwise kernel (ratio {composed / fused:.2f}x) vs {eager:.1f} "
                      f"ms with its eager node loop")
            print(f"  its decoder's mean at every item, forward and backward: {floor['train'] * 1e3:.1f} s per "
                  f"1,000 iterations ({floor['train'] * 1e5 / r['per_1000']:.0f}% of the step)")
    r = isolated(train_seconds, "integrated", args.iterations, None, "gaussian", False, "mcar")
    print(f"training, MIWAE (no missing term: its decoder runs at the observed entries only): "
          f"{r['per_1000']:7.1f} s per 1,000 iterations, peak {r['peak_mib']:.0f} MiB")
    r = isolated(train_seconds, "integrated", args.iterations, None, "categorical", True)
    print(f"training, categorical decoder with row offset, integrated x_m: {r['per_1000']:7.1f} s per 1,000 "
          f"iterations, peak {r['peak_mib']:.0f} MiB")
    untuned = isolated(train_seconds, "integrated", args.iterations, None, "categorical", True, keep_memory=False)
    print(f"  the same with glibc's default allocator settings: {untuned['per_1000']:7.1f} s "
          f"(ratio {untuned['per_1000'] / r['per_1000']:.2f}x), peak {untuned['peak_mib']:.0f} MiB")
    r = {key: seconds * 1e3 for key, seconds in isolated(categorical_sum_seconds).items()}
    print(f"  its exact sum over levels, forward and backward: {r['fused']:.0f} ms fused vs {r['looped']:.0f} ms "
          f"looped kernel (ratio {r['looped'] / r['fused']:.1f}x) vs {r['reference']:.0f} ms with log_softmax / "
          f"logsumexp")
    r = isolated(impute_seconds, args.impute_rows, args.importance_samples)
    scaled = r["seconds"] * TEST_USERS / args.impute_rows
    target = f"target 30; ratio {scaled / 30:.1f}x" if args.importance_samples == 10_000 \
        else "the target, 30 s, is for K = 10,000"
    print(f"imputation, K = {args.importance_samples}: {r['seconds']:.1f} s for {args.impute_rows} rows -> "
          f"{scaled:.0f} s for {TEST_USERS} rows x {TEST_ITEMS} items ({target}), peak {r['peak_mib']:.0f} MiB")
    chunks = TEST_USERS / IMPUTE_ROWS * args.importance_samples / IMPUTE_SAMPLES
    print(f"  the decoder's mean alone at every (row, sample, item) of it: {floor['impute'] * chunks:.0f} s, "
          f"the least any exact imputation computes ({floor['impute'] * chunks * 100 / scaled:.0f}% of it)")
    r = isolated(impute_seconds, args.impute_rows, args.importance_samples, "mcar")
    print(f"  the same with the MIWAE (decoder at the observed and target entries only): "
          f"{r['seconds'] * TEST_USERS / args.impute_rows:.0f} s for {TEST_USERS} rows")
    for n_items in (1_000, 10_000):
        r = isolated(sparse_vs_dense, n_items)
        print(f"{n_items:6d} items, {PER_ROW} observed per row: set encoder sparse {r['encoder_sparse'] * 1e3:.2f} ms "
              f"vs dense {r['encoder_dense'] * 1e3:.2f} ms "
              f"(dense/sparse {r['encoder_dense'] / r['encoder_sparse']:.1f}x); "
              f"training step from CSR {r['step_csr'] * 1e3:.1f} ms vs dense NaN rows {r['step_dense'] * 1e3:.1f} ms "
              f"(ratio {r['step_dense'] / r['step_csr']:.2f})")


if __name__ == "__main__":
    main()
