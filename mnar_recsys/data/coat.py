"""Coat shopping ratings (Schnabel et al., ICML 2016): 290 users x 300 coats, MNAR train, MCAR test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

from .files import check_sha256, require_file, utf8_errors_named
from .ratings import RatingsData
from .triples import to_csr

CARD = "datasets/coat/README.md"
SHAPE = (290, 300)
RATING_SCALE = (1, 5)
PROPENSITIES = "propensities.ascii"
SHA256 = {
    "train.ascii": "a87bd9e7eaf3b89f976df3f25d4aa5d5d871be8a00b58947df9e6e015559bd37",
    "test.ascii": "de6714ab105a5e0be8166be7fd313901b29f9a09c3bea307901457d1d71847e6",
    PROPENSITIES: "d1b11b12465dc6e1df35eeed92dfec5e17a997f920d60777cc44571fe9b054e5",
}


def load_coat(data_dir: str | Path) -> RatingsData:
    """Load Coat from ``data_dir`` (``train.ascii``, ``test.ascii``: dense 290 x 300, 0 = not rated).

    Row u / column j keep their positions (``user_ids``/``item_ids`` are 0..289 / 0..299).
    Warns (``ChecksumWarning``) on a sha256 differing from the published files; raises
    FileNotFoundError for a missing file and ValueError, naming file and line, for a wrong shape,
    a value that is not an integer in {0} u 1..5, or a user or item rated in test but not in train.
    """
    data_dir = Path(data_dir)
    matrices, digests = {}, {}
    for name in ("train.ascii", "test.ascii"):
        path = require_file(data_dir / name, CARD)
        digests[name] = check_sha256(path, SHA256[name], CARD)
        matrices[name] = read_dense_ratings(path, SHAPE, RATING_SCALE)
    _check_known(matrices["test.ascii"], matrices["train.ascii"], data_dir)
    train, test = (_sparse(matrices[n]) for n in ("train.ascii", "test.ascii"))
    return RatingsData(
        name="coat",
        train=train,
        test=test,
        rating_scale=RATING_SCALE,
        user_ids=np.arange(SHAPE[0]),
        item_ids=np.arange(SHAPE[1]),
        meta={"data_dir": str(data_dir), "sha256": digests, "card": CARD},
    )


def load_coat_propensities(data_dir: str | Path) -> np.ndarray:
    """The authors' propensities P(O_ui = 1) for every cell (``propensities.ascii``, 290 x 300), estimated from the
    user and item covariates, with which Schnabel et al. trained their published MF-IPS (``mf-ips-given``).

    Warns (``ChecksumWarning``) on a sha256 differing from the published file; raises FileNotFoundError for a
    missing file and ValueError, naming file, line and column, for a wrong shape or a value outside (0, 1].
    """
    path = require_file(Path(data_dir) / PROPENSITIES, CARD)
    check_sha256(path, SHA256[PROPENSITIES], CARD)
    rows = []
    for number, fields, values in _dense_lines(path, SHAPE):
        bad = np.flatnonzero(~((values > 0) & (values <= 1)))  # NaN (not a number) fails too
        if len(bad):
            raise ValueError(f"{path}, line {number}, column {bad[0] + 1}: expected a propensity in (0, 1], found "
                             f"{fields[bad[0]]!r}")
        rows.append(values)
    return np.vstack(rows)


def _dense_lines(path: Path, shape: tuple[int, int]) -> Iterator[tuple[int, list[str], np.ndarray]]:
    """(line number, fields, their numeric values, NaN where not a number) of a whitespace-separated dense matrix,
    one user per line; raises ValueError naming the file and line for a wrong number of lines or columns."""
    with utf8_errors_named(path):
        lines = path.read_text(encoding="utf-8-sig").split("\n")  # universal newlines: CRLF arrives as "\n"
    while lines and not lines[-1].strip():  # blank lines at the end are no users
        lines.pop()
    if len(lines) != shape[0]:
        raise ValueError(f"{path}: expected {shape[0]} lines (users), found {len(lines)}")
    for number, line in enumerate(lines, start=1):
        fields = line.split()
        if len(fields) != shape[1]:
            raise ValueError(f"{path}, line {number}: expected {shape[1]} columns (items), found {len(fields)}")
        yield number, fields, pd.to_numeric(pd.Series(fields), errors="coerce").to_numpy(dtype=np.float64)


def read_dense_ratings(path: Path, shape: tuple[int, int], rating_scale: tuple[int, int]) -> np.ndarray:
    """Read a whitespace-separated dense rating matrix (one user per line, 0 = not rated) as int64.

    Raises ValueError naming the file and 1-based line for a wrong number of lines or columns, a
    non-integer entry, or an entry that is neither 0 nor on the rating scale.
    """
    lo, hi = rating_scale
    rows = []
    for number, fields, values in _dense_lines(path, shape):
        on_scale = (values == 0) | ((values >= lo) & (values <= hi))
        bad = np.flatnonzero(~on_scale | (values != np.round(values)))  # NaN (not a number) fails on_scale
        if len(bad):
            j = bad[0]
            raise ValueError(
                f"{path}, line {number}, column {j + 1}: expected 0 (not rated) or an integer rating "
                f"{lo}..{hi}, found {fields[j]!r}"
            )
        rows.append(values.astype(np.int64))
    return np.vstack(rows)


def _check_known(test: np.ndarray, train: np.ndarray, data_dir: Path) -> None:
    """Every user and item rated in the test matrix must have train ratings, as the published files' do."""
    rated = train > 0
    users = np.flatnonzero((test > 0).any(axis=1) & ~rated.any(axis=1))
    if len(users):
        raise ValueError(f"{data_dir / 'test.ascii'}, line {users[0] + 1}: this user has test ratings but none "
                         f"in train.ascii (line {users[0] + 1} is all zeros there)")
    items = np.flatnonzero((test > 0).any(axis=0) & ~rated.any(axis=0))
    if len(items):
        raise ValueError(f"{data_dir / 'test.ascii'}, column {items[0] + 1}: this item has test ratings but none "
                         f"in train.ascii (column {items[0] + 1} is all zeros there)")


def _sparse(dense: np.ndarray) -> sp.csr_matrix:
    rows, cols = np.nonzero(dense)
    return to_csr(rows, cols, dense[rows, cols], dense.shape)
