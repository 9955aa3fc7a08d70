"""A user x item CSR ratings matrix on disk, so that training reads a batch of rows at a time.

Past tens of millions of ratings the matrix need not fit in memory: the arrays are memory-mapped, a
batch reads only its rows, and the per-item statistics `fit` needs are streamed in chunks.

A folder holds ``indptr.npy`` (int64, n_rows + 1), ``indices.npy`` (int32), ``data.npy`` (float32),
``meta.json`` (format, version, shape, nnz) and, when rows and columns have outside ids, ``users.npy``
and ``items.npy``. The writers (:func:`save_csr`, :func:`convert_triples`) check everything that
in-memory rows check (sorted unique columns per row, finite values, no stored zeros), so
:func:`open_csr` checks only what costs O(n_rows), and each batch checks its own column indices.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from itertools import islice
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

from mnar_recsys.io import atomic_directory

from .files import utf8_errors_named
from .rows import RowBatch, RowSource, _check_csr, batch_from_csr
from .triples import (
    Triples,
    _id_keys,
    _parse_ids,
    _parse_ratings,
    _show,
    check_rating_scale,
    file_layout,
    no_ratings_error,
    split_lines,
)

FORMAT = "mnar-recsys-csr"
VERSION = 1
CHUNK = 1 << 22  # entries per streamed chunk (16 MB of int32 indices)
_MAX_COLUMNS = np.iinfo(np.int32).max
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


class DiskCSRRows(RowSource):
    """Rows of a CSR folder, memory-mapped: a batch reads only its rows, so memory stays O(batch) however
    large the matrix. Open one with :func:`open_csr`; ``user_ids`` / ``item_ids`` are None or the
    outside id of each row / column."""

    def __init__(self, directory: Path, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray,
                 n_features: int, user_ids: np.ndarray | None = None, item_ids: np.ndarray | None = None):
        self.directory, self.indptr, self.indices, self.data = directory, indptr, indices, data
        self.n_rows, self.n_features, self.nnz = len(indptr) - 1, n_features, len(data)
        self.user_ids, self.item_ids = user_ids, item_ids

    def batch(self, index: np.ndarray) -> RowBatch:
        index = np.asarray(index, dtype=np.int64)
        if index.size and (index.min() < 0 or index.max() >= self.n_rows):
            raise IndexError(f"row index out of range for {self.n_rows} rows: {index.min()}..{index.max()}")
        starts = self.indptr[index]
        counts = self.indptr[index + 1] - starts
        sub_indptr = np.concatenate(([0], np.cumsum(counts)))
        positions = np.repeat(starts - sub_indptr[:-1], counts) + np.arange(sub_indptr[-1])
        cols = self.indices[positions]
        _check_columns(self.directory / "indices.npy", cols, positions, self.n_features)
        return batch_from_csr(sp.csr_matrix((self.data[positions], cols, sub_indptr),
                                            shape=(index.size, self.n_features)))

    def observed_values(self) -> np.ndarray:
        """The memory-mapped values themselves: nothing is copied, and the operating system reads pages as
        the checks walk them (a chunk at a time, `prepare_rows`) and may drop them again. A NaN or infinity is
        refused here, naming data.npy, the entry and its row: the writers store none, so the file is damaged."""
        for start in range(0, self.nnz, CHUNK):
            bad = np.flatnonzero(~np.isfinite(self.data[start:start + CHUNK]))
            if bad.size:
                k = start + int(bad[0])
                row = int(np.searchsorted(self.indptr, k, side="right")) - 1
                raise ValueError(f"{self.directory / 'data.npy'}: entry {k} (row {row}, column {self.indices[k]}) is "
                                 f"{self.data[k]}, and the writers store finite values only; the file is corrupt, "
                                 "write the folder again")
        return self.data


def save_csr(matrix: sp.spmatrix, directory: str | Path, *, user_ids: np.ndarray | None = None,
             item_ids: np.ndarray | None = None) -> Path:
    """Write `matrix` (stored entries = observed ratings) as a new CSR folder, atomically.

    It is validated like in-memory rows, so that opening it later needs only cheap checks.
    `user_ids` / `item_ids` (integers or strings, one per row / column) map rows and columns back
    to the source's ids. An existing `directory` is an error (FileExistsError).
    """
    csr = _check_csr(matrix)
    _check_column_count(csr.shape[1], "the matrix")
    ids = {name: _id_array(ids, n, name) for name, ids, n in
           (("users", user_ids, csr.shape[0]), ("items", item_ids, csr.shape[1])) if ids is not None}
    with atomic_directory(directory) as tmp:
        np.save(tmp / "indptr.npy", csr.indptr.astype(np.int64))
        np.save(tmp / "indices.npy", csr.indices.astype(np.int32))
        np.save(tmp / "data.npy", csr.data)
        for name, array in ids.items():
            np.save(tmp / f"{name}.npy", array)
        _write_meta(tmp, csr.shape, csr.nnz)
    return Path(directory)


def open_csr(directory: str | Path) -> DiskCSRRows:
    """Memory-map a CSR folder written by :func:`save_csr` or :func:`convert_triples`.

    Checks, each error naming the file: every file present and readable, no .npy truncated, meta.json
    well-formed and consistent with the arrays' dtypes and lengths, indptr starting at 0, ending at
    nnz and never decreasing (streamed: O(n_rows) reads, O(1) memory).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such folder (write one with save_csr or convert_triples)")
    n_rows, n_cols, nnz = _read_meta(directory / "meta.json")
    indptr = _map(directory / "indptr.npy", n_rows + 1, "n_rows + 1", np.int64)
    indices = _map(directory / "indices.npy", nnz, "nnz", np.int32)
    data = _map(directory / "data.npy", nnz, "nnz", np.float32)
    _check_indptr(directory / "indptr.npy", indptr, nnz)
    user_ids, item_ids = (_map(directory / f"{name}.npy", n, what) if (directory / f"{name}.npy").exists() else None
                          for name, n, what in (("users", n_rows, "n_rows"), ("items", n_cols, "n_cols")))
    return DiskCSRRows(directory, indptr, indices, data, n_cols, user_ids, item_ids)


def convert_triples(path: str | Path, directory: str | Path, *, sep: str | None = None, header: bool | None = None,
                    rating_scale: tuple[int, int] = (1, 5), chunksize: int = 250_000) -> Path:
    """Convert a (user, item, rating) text file into a CSR folder, reading `chunksize` lines at a time.

    The file is read as :func:`~mnar_recsys.data.triples.read_triples` reads it (same separator and
    header detection, same checks, errors naming the file and line) and gives the same matrix: users
    and items indexed by their sorted ids, which are kept in users.npy / items.npy. Pass 1 collects
    the distinct ids and each user's count; pass 2 writes each rating at its user's cursor in
    memory-mapped output; each row's columns are then sorted block by block, and a repeated
    (user, item) pair is an error naming both lines. Memory is O(users + items + chunksize); a failed
    conversion leaves no folder behind.
    """
    check_rating_scale(rating_scale)
    path = Path(path)
    with open(path, encoding="utf-8-sig") as file, utf8_errors_named(path):
        layout = file_layout(path, (line.rstrip("\n") for line in file), sep, header)
    with atomic_directory(directory) as tmp:
        users, items = _Tally("user"), _Tally("item")
        for raw in _chunks(path, layout, chunksize):
            users.add(raw, raw.users)
            items.add(raw, raw.items)
            _ratings(raw, rating_scale)
        if not users.counts.any():
            raise no_ratings_error(str(path), "line")
        user_ids, item_ids = users.finish(), items.finish()
        _check_column_count(len(item_ids), str(path))
        indptr = np.concatenate(([0], np.cumsum(users.id_counts))).astype(np.int64)
        np.save(tmp / "indptr.npy", indptr)
        _write_rows(tmp, indptr, _chunks(path, layout, chunksize), users, items, rating_scale, path)
        _sort_rows(tmp, indptr, user_ids, item_ids, chunksize, path)
        (tmp / "lines.npy").unlink()
        np.save(tmp / "users.npy", _id_array(user_ids, len(user_ids), "users"))
        np.save(tmp / "items.npy", _id_array(item_ids, len(item_ids), "items"))
        _write_meta(tmp, (len(user_ids), len(item_ids)), int(indptr[-1]))
    return Path(directory)


class _Tally:
    """The distinct raw tokens of one id column, numbered in order of appearance, with their counts, merged
    chunk by chunk; once every chunk is in, the map from token to row or column. Memory O(distinct ids)."""

    def __init__(self, kind: str):
        self.kind = kind
        self.number: dict[str, int] = {}
        self.counts = np.zeros(0, dtype=np.int64)

    def add(self, raw: Triples, values: np.ndarray) -> None:
        codes, uniques = pd.factorize(values)
        # for its error naming the first line with a missing id; the ids themselves are made in finish()
        _parse_ids(replace(raw, lines=raw.lines[_first_positions(codes, len(uniques))]), uniques, self.kind, False)
        number = self.number
        numbers = np.fromiter((number.setdefault(token, len(number)) for token in uniques), np.int64, len(uniques))
        self.counts = np.concatenate((self.counts, np.zeros(len(number) - len(self.counts), dtype=np.int64)))
        self.counts[numbers] += np.bincount(codes, minlength=len(uniques))

    def finish(self) -> np.ndarray:
        """The sorted distinct ids, made as read_triples makes them (each token by itself: '7' and '7.0' one
        id); sets each token's position among them and each id's count."""
        tokens = np.fromiter(self.number, dtype=object, count=len(self.number))
        self.index = pd.Index(tokens)  # looks up a whole chunk at C speed
        del self.number
        keys = _id_keys(tokens)[0]
        ids, self.position = np.unique(keys, return_inverse=True)
        self.id_counts = np.zeros(len(ids), dtype=np.int64)
        np.add.at(self.id_counts, self.position, self.counts)
        return ids

    def codes(self, values: np.ndarray, path: Path) -> np.ndarray:
        """Row or column of each token (after :meth:`finish`)."""
        codes, uniques = pd.factorize(values)
        numbers = self.index.get_indexer(uniques)
        if (numbers < 0).any():
            raise ValueError(f"{path} changed while it was being converted; convert it again")
        return self.position[numbers][codes]


def _chunks(path: Path, layout: tuple[str | None, int, tuple[int, int, int]], chunksize: int) -> Iterator[Triples]:
    """Raw triples of `chunksize` lines at a time, with their line numbers in the whole file; `layout`: what
    `file_layout` read of the file."""
    with open(path, encoding="utf-8-sig") as file, utf8_errors_named(path):  # universal newlines, as read_triples
        first = 1
        while text := "".join(islice(file, chunksize)):  # one string, not a list of lines, while it waits
            lines = text.split("\n")
            del text
            if lines[-1] == "":
                lines.pop()
            yield split_lines(path, lines, first, *layout)
            first += len(lines)


def _first_positions(codes: np.ndarray, n: int) -> np.ndarray:
    """Where each of the `n` codes first appears (assignment keeps the last write, so write backwards)."""
    first = np.empty(n, dtype=np.int64)
    first[codes[::-1]] = np.arange(codes.size - 1, -1, -1)
    return first


def _ratings(raw: Triples, rating_scale: tuple[int, int]) -> np.ndarray:
    """The chunk's ratings, parsed once per distinct token; an error names the first offending line."""
    codes, uniques = pd.factorize(raw.ratings)
    distinct = replace(raw, ratings=uniques, lines=raw.lines[_first_positions(codes, len(uniques))])
    return _parse_ratings(distinct, rating_scale)[codes]


def _write_rows(folder: Path, indptr: np.ndarray, chunks: Iterator[Triples], users: _Tally, items: _Tally,
                rating_scale: tuple[int, int], path: Path) -> None:
    """Pass 2: write each rating, and the line it came from, at its user's cursor in memory-mapped arrays."""
    nnz = int(indptr[-1])
    indices = np.lib.format.open_memmap(folder / "indices.npy", "w+", np.int32, (nnz,))
    data = np.lib.format.open_memmap(folder / "data.npy", "w+", np.float32, (nnz,))
    lines = np.lib.format.open_memmap(folder / "lines.npy", "w+", np.int64, (nnz,))
    cursor = indptr[:-1].copy()
    for raw in chunks:
        rows = users.codes(raw.users, path)
        order = np.argsort(rows, kind="stable")  # stable: a user's ratings keep their file order
        sorted_rows = rows[order]
        positions = cursor[sorted_rows] + np.arange(rows.size) - np.searchsorted(sorted_rows, sorted_rows)
        indices[positions] = items.codes(raw.items, path)[order]
        data[positions] = _ratings(raw, rating_scale)[order]
        lines[positions] = raw.lines[order]
        cursor += np.bincount(rows, minlength=len(cursor))
    if not np.array_equal(cursor, indptr[1:]):
        raise ValueError(f"{path} changed while it was being converted; convert it again")
    for array in (indices, data, lines):
        array.flush()


def _sort_rows(folder: Path, indptr: np.ndarray, user_ids: np.ndarray, item_ids: np.ndarray, chunksize: int,
               path: Path) -> None:
    """Sort each row's columns in place, a block of about `chunksize` entries at a time. A repeated pair is
    reported as read_triples reports it: the first repeat in the file, and the line it repeats."""
    indices, data, lines = (np.load(folder / f"{name}.npy", mmap_mode="r+") for name in ("indices", "data", "lines"))
    repeat = None  # (line, first line, row, column) of the earliest repeat so far
    n_rows, n_cols = len(indptr) - 1, len(item_ids)
    start = 0
    while start < n_rows:
        stop = max(start + 1, int(np.searchsorted(indptr, indptr[start] + chunksize, side="right")) - 1)
        lo, hi = indptr[start], indptr[stop]
        rows = np.repeat(np.arange(stop - start), np.diff(indptr[start:stop + 1]))
        keys = rows * n_cols + indices[lo:hi]
        order = np.argsort(keys, kind="stable")  # ties stay in file order, so the first given comes first
        keys, block_lines = keys[order], lines[lo:hi][order]
        indices[lo:hi] = indices[lo:hi][order]
        data[lo:hi] = data[lo:hi][order]
        again = np.flatnonzero(keys[1:] == keys[:-1]) + 1
        if again.size:
            k = again[np.argmin(block_lines[again])]
            first = np.searchsorted(keys, keys[k])
            candidate = (int(block_lines[k]), int(block_lines[first]), start + int(keys[k] // n_cols),
                         int(keys[k] % n_cols))
            repeat = candidate if repeat is None else min(repeat, candidate)
        start = stop
    indices.flush()
    data.flush()
    if repeat is not None:
        line, first, row, col = repeat
        raise ValueError(f"{path}, line {line}: duplicate (user, item) pair ({_show(user_ids[row])}, "
                         f"{_show(item_ids[col])}); first given on line {first}")


def _check_column_count(n_cols: int, what: str) -> None:
    if n_cols > _MAX_COLUMNS:
        raise ValueError(f"{what} has {n_cols} items, more than the {_MAX_COLUMNS} that int32 column indices hold")


def _check_columns(path: Path, cols: np.ndarray, positions: np.ndarray | range, n_cols: int) -> None:
    """Column indices `cols`, read from `positions` of indices.npy, must lie in 0..n_cols-1."""
    bad = np.flatnonzero((cols < 0) | (cols >= n_cols))
    if bad.size:
        k = bad[0]
        raise ValueError(f"{path}: entry {positions[k]} has column {cols[k]}, outside 0..{n_cols - 1}; "
                         "the file is corrupt, write the folder again")


def _id_array(ids: np.ndarray, n: int, name: str) -> np.ndarray:
    """Ids as .npy stores them without pickling: int64, or fixed-width strings."""
    array = np.asarray(ids)
    if array.shape != (n,):
        raise ValueError(f"{name} ids must be one per {name[:-1]} ({n}), got shape {array.shape}")
    if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
        # astype would wrap them round to negative ids without a word
        k = int(np.argmax(array > np.iinfo(np.int64).max))
        raise ValueError(f"{name} ids must fit in int64 or be strings: id {array[k]} (position {k}) does not")
    if array.dtype.kind in "iu":
        return array.astype(np.int64)
    if array.dtype.kind in "UO":
        return array.astype(str)
    raise ValueError(f"{name} ids must be integers or strings, got dtype {array.dtype}")


def _write_meta(directory: Path, shape: tuple[int, int], nnz: int) -> None:
    meta = {"format": FORMAT, "version": VERSION, "shape": [int(shape[0]), int(shape[1])], "nnz": int(nnz)}
    (directory / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _read_meta(path: Path) -> tuple[int, int, int]:
    """(n_rows, n_cols, nnz) from meta.json, after checking that it describes this format."""
    if not path.is_file():
        raise ValueError(f"{path} is missing: {path.parent} is not a CSR folder written by save_csr or convert_triples")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise ValueError(f"{path}: expected format {FORMAT!r}, found {found!r}")
    if meta.get("version") != VERSION:
        raise ValueError(f"{path}: format version {meta.get('version')!r}, this package reads version {VERSION}")
    shape, nnz = meta.get("shape"), meta.get("nnz")
    if not (isinstance(shape, list) and len(shape) == 2 and all(map(_is_count, shape)) and _is_count(nnz)):
        raise ValueError(f"{path}: shape must be two non-negative integers and nnz one, got shape {shape!r}, "
                         f"nnz {nnz!r}")
    return shape[0], shape[1], nnz


def _map(path: Path, length: int, what: str, dtype: type | None = None) -> np.ndarray:
    """Memory-map a 1-d .npy file, checking its header against meta.json and its size against its header
    before numpy maps it, so a truncated or foreign file is named rather than failing deep inside numpy."""
    if not path.is_file():
        raise ValueError(f"{path} is missing: {path.parent} is not a complete CSR folder (write it again)")
    try:
        with open(path, "rb") as file:
            version = np.lib.format.read_magic(file)
            if version not in _HEADER_READERS:
                raise ValueError(f"unsupported .npy version {version}")
            shape, _, found = _HEADER_READERS[version](file)
            offset = file.tell()
    except (ValueError, EOFError) as error:
        raise ValueError(f"{path} is not a readable .npy file ({error}): it is truncated or corrupt") from error
    if shape != (length,):
        raise ValueError(f"{path} has shape {shape} but meta.json gives {what} = {length}")
    if dtype is not None and found != np.dtype(dtype):
        raise ValueError(f"{path} holds {found} values, expected {np.dtype(dtype)}")
    if found.hasobject or (dtype is None and found.kind not in "iU"):
        raise ValueError(f"{path} holds {found} values; ids must be int64 or fixed-width strings")
    expected = offset + length * found.itemsize
    size = path.stat().st_size
    if size < expected:
        raise ValueError(f"{path} is truncated: {size} bytes, expected {expected} ({length} {found} values after a "
                         f"{offset}-byte header)")
    return np.load(path, mmap_mode="r")


def _check_indptr(path: Path, indptr: np.ndarray, nnz: int) -> None:
    if indptr[0] != 0 or indptr[-1] != nnz:
        raise ValueError(f"{path} must run from 0 to nnz = {nnz}, but runs from {indptr[0]} to {indptr[-1]}")
    for start in range(0, len(indptr) - 1, CHUNK):
        drops = np.flatnonzero(np.diff(indptr[start:start + CHUNK + 1]) < 0)
        if drops.size:
            row = start + drops[0]
            raise ValueError(f"{path} decreases at row {row} ({indptr[row]} -> {indptr[row + 1]}); the file is corrupt")
