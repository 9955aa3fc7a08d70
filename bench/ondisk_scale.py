"""Time and memory of on-disk CSR rows at 1M users x 100k items x 20 ratings per user (20M ratings).

Prints, each step in its own process (so peak memory is its own):
  1. save: a synthetic matrix generated in memory with numpy, validated and written by save_csr;
  2. read: open_csr, the statistics fit starts from (observed_fraction, the values' range check and mean)
     and 1,000 random batches of 100 rows; memory is split into anonymous (heap) and file-backed pages
     (the memory map, which the operating system can drop at any time);
  3. convert: convert_triples on a --lines-line text file (default 2M, 20 per user), checked against
     the matrix it was written from, and the time scaled linearly to 20M lines.
The folders go to --dir (default: a temporary folder, removed at the end); files are in the page cache,
so reads are warm.

    python bench/ondisk_scale.py [--users 1000000] [--lines 2000000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import scipy.sparse as sp

from isolation import isolated, peak_rss_mib  # bench/, on the path when this script runs
from mnar_recsys.data.ondisk import convert_triples, open_csr, save_csr
from mnar_recsys.models.decoders import GaussianDecoder
from mnar_recsys.models.notmiwae import prepare_rows

ITEMS, PER_ROW, TARGET_LINES = 100_000, 20, 20_000_000


def synthetic(n_rows: int, n_cols: int, per_row: int, seed: int = 0) -> sp.csr_matrix:
    """`per_row` distinct sorted columns per row (sorted draws below n_cols - per_row, plus 0..per_row-1)."""
    rng = np.random.default_rng(seed)
    cols = np.sort(rng.integers(0, n_cols - per_row + 1, (n_rows, per_row), dtype=np.int32), axis=1)
    cols += np.arange(per_row, dtype=np.int32)
    data = rng.integers(1, 6, n_rows * per_row).astype(np.float32)
    return sp.csr_matrix((data, cols.ravel(), np.arange(0, n_rows * per_row + 1, per_row)), shape=(n_rows, n_cols))


def _memory(base: dict | None = None) -> dict:
    """Peak resident memory, and the current resident memory split into heap and file-backed pages, in MiB;
    with `base` (taken after the imports: torch alone is some 280 MiB), also the growth over it."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    kib = {key: int(status[key].split()[0]) for key in ("RssAnon", "RssFile")}
    now = {"peak_mib": peak_rss_mib(),
           "anon_mib": kib["RssAnon"] / 1024, "file_mib": kib["RssFile"] / 1024}
    if base is not None:
        now.update({f"{key}_growth": now[key] - base[key] for key in ("peak_mib", "anon_mib", "file_mib")})
    return now


def save_step(folder: str, n_rows: int) -> dict:
    base = _memory()
    start = time.perf_counter()
    matrix = synthetic(n_rows, ITEMS, PER_ROW)
    generated = time.perf_counter()
    save_csr(matrix, folder)
    return {"generate_s": generated - start, "save_s": time.perf_counter() - generated, **_memory(base)}


def read_step(folder: str, n_batches: int, batch_size: int) -> dict:
    base, times = _memory(), {}
    start = time.perf_counter()
    rows = open_csr(folder)
    times["open_s"] = time.perf_counter() - start
    start = time.perf_counter()
    # what fit reads before training: the values' checks and the missing model's starting statistics
    decoder = GaussianDecoder(2, rows.n_features, hidden=(), squash=(1.0, 5.0))
    prepare_rows(SimpleNamespace(n_features=rows.n_features, decoder=decoder), rows)
    rows.observed_summary(np.arange(rows.n_rows))
    times["fit_statistics_s"] = time.perf_counter() - start
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(n_batches):
        rows.batch(rng.integers(0, rows.n_rows, batch_size))
    times["batches_s"] = time.perf_counter() - start
    return {**times, **_memory(base)}


def text_step(text: str, n_lines: int) -> None:
    """A tab-separated file of the synthetic matrix with n_lines / 20 users, lines in no particular order."""
    expected = synthetic(n_lines // PER_ROW, ITEMS, PER_ROW, seed=1)
    users = np.repeat(np.arange(expected.shape[0]), PER_ROW)
    order = np.random.default_rng(2).permutation(n_lines)
    with open(text, "w") as file:
        for lo in range(0, n_lines, 1_000_000):
            k = order[lo:lo + 1_000_000]
            file.write("".join(f"{u}\t{i}\t{r:.0f}\n" for u, i, r in
                               zip(users[k].tolist(), expected.indices[k].tolist(), expected.data[k].tolist())))


def convert_step(text: str, folder: str) -> dict:
    base = _memory()
    start = time.perf_counter()
    convert_triples(text, folder)
    return {"convert_s": time.perf_counter() - start, **_memory(base)}


def same_matrix(folder: str, n_lines: int) -> bool:
    """Whether the converted folder holds the matrix the text was written from (items never rated get no column)."""
    expected, rows = synthetic(n_lines // PER_ROW, ITEMS, PER_ROW, seed=1), open_csr(folder)
    return (np.array_equal(rows.indptr, expected.indptr) and np.array_equal(rows.item_ids, np.unique(expected.indices))
            and np.array_equal(rows.item_ids[rows.indices], expected.indices)
            and np.array_equal(rows.data, expected.data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--lines", type=int, default=2_000_000)
    parser.add_argument("--batches", type=int, default=1_000)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp()) if args.dir is None else args.dir
    try:
        r = isolated(save_step, str(root / "matrix"), args.users)
        print(f"save: {args.users:,} x {ITEMS:,}, {PER_ROW} per row: generate {r['generate_s']:.1f} s, save_csr "
              f"{r['save_s']:.1f} s, peak {r['peak_mib']:.0f} MiB ({r['peak_mib_growth']:+.0f} over the imports)")
        r = isolated(read_step, str(root / "matrix"), args.batches, args.batch_size)
        print(f"read: open_csr {r['open_s']:.3f} s, fit's statistics {r['fit_statistics_s']:.2f} s, "
              f"{args.batches:,} batches of {args.batch_size} rows {r['batches_s']:.2f} s; peak {r['peak_mib']:.0f} "
              f"MiB ({r['peak_mib_growth']:+.0f} over the imports); at the end {r['anon_mib_growth']:+.0f} MiB heap "
              f"and {r['file_mib_growth']:+.0f} MiB mapped file pages")
        isolated(text_step, str(root / "ratings.tsv"), args.lines)
        r = isolated(convert_step, str(root / "ratings.tsv"), str(root / "converted"))
        same = same_matrix(str(root / "converted"), args.lines)
        print(f"convert: {args.lines:,} lines in {r['convert_s']:.1f} s (x{TARGET_LINES / args.lines:.0f} for "
              f"{TARGET_LINES:,} lines: ~{r['convert_s'] * TARGET_LINES / args.lines:.0f} s), peak "
              f"{r['peak_mib']:.0f} MiB ({r['peak_mib_growth']:+.0f} over the imports), same matrix: {same}")
    finally:
        if args.dir is None:
            shutil.rmtree(root)


if __name__ == "__main__":
    main()
