"""(user, item, rating) triples: fast parsing that still reports the exact bad line, and a generic loader.

Files are parsed in bulk (one string split, numpy/pandas conversions); only when a bulk check fails
is the first offending line located, so errors name the file and its 1-based line number.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from operator import methodcaller
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

from .files import utf8_errors_named
from .ratings import RatingsData

COLUMNS = ("user", "item", "rating")
_SNIFFED_SEPARATORS = ("\t", ",", ";", "|")
# header names read as each column (lower case, spaces and hyphens as underscores)
_HEADER_NAMES = {
    "user": {"user", "users", "user_id", "userid", "uid"},
    "item": {"item", "items", "item_id", "itemid", "iid", "song", "song_id", "movie", "movie_id", "movieid",
             "product", "product_id"},
    "rating": {"rating", "ratings", "score", "stars", "value"},
}


@dataclass(frozen=True)
class Triples:
    """Rows of one source, each with the 1-based line (file) or row (DataFrame) it came from.

    After ``read_triples``: ``ratings`` are int64 on the scale, ids follow ``read_triples``'s id rule, and no
    (user, item) pair repeats.
    """

    source: str
    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    lines: np.ndarray
    unit: str = "line"

    def error(self, k: int, what: str) -> ValueError:
        """A ValueError about triple ``k`` that names the source and the line it came from."""
        return ValueError(f"{self.source}, {self.unit} {self.lines[k]}: {what}")


def read_triples(
    source: str | Path | pd.DataFrame,
    *,
    sep: str | None = None,
    header: bool | None = None,
    rating_scale: tuple[int, int] = (1, 5),
    integer_ids: bool = False,
    label: str = "DataFrame",
) -> Triples:
    """Read and validate triples from a delimited text file or a DataFrame.

    Files: columns user, item, rating in that order, or as a header names them (see ``file_layout``);
    ``sep=None`` takes the first of tab, comma, semicolon or bar found on the first line, else whitespace;
    ``header=None`` takes the first line for a header when it names columns (see ``file_layout``), else for
    data. Blank lines are skipped; quoting is not supported. DataFrames: columns named user/item/rating, else
    exactly three columns in that order; errors name ``label`` and the 1-based row.
    Ids, each read by itself: one written as a plain integer within int64 ('7', '-3', '7.0'; no leading zero
    or exponent) is that integer, any other is its stripped text ('07', '1e3', 'u7'). The ids are int64 when
    all are integers, else strings with the integers in decimal, so '7' and '7.0' are one id and '07' another
    whatever else the file holds. ``integer_ids`` makes an id that is not an integer an error.
    Raises ValueError (naming source and line) on a source with no ratings, a wrong column count, a
    non-integer or off-scale rating, a missing or (with ``integer_ids``) non-integer id, or a repeated
    (user, item) pair.
    """
    raw = (_frame_triples(source, label) if isinstance(source, pd.DataFrame)
           else _file_triples(Path(source), sep, header))
    if not len(raw.ratings):
        raise no_ratings_error(raw.source, raw.unit)
    users = _parse_ids(raw, raw.users, "user", integer_ids)
    items = _parse_ids(raw, raw.items, "item", integer_ids)
    ratings = _parse_ratings(raw, rating_scale)
    triples = replace(raw, users=users, items=items, ratings=ratings)
    _check_unique_pairs(triples)
    return triples


def load_triples(
    train: str | Path | pd.DataFrame,
    test: str | Path | pd.DataFrame,
    *,
    sep: str | None = None,
    rating_scale: tuple[int, int] = (1, 5),
    name: str = "triples",
) -> RatingsData:
    """Load an MNAR train and an MCAR test set of (user, item, rating) triples into ``RatingsData``.

    Users and items are indexed from the train set (sorted original ids -> 0..n-1), and the test set
    uses the same map, so a test user or item absent from train is a ValueError naming its line.
    See ``read_triples`` for the accepted inputs and the other checks.
    """
    check_rating_scale(rating_scale)
    tr = read_triples(train, sep=sep, rating_scale=rating_scale, label="train DataFrame")
    te = read_triples(test, sep=sep, rating_scale=rating_scale, label="test DataFrame")
    user_ids, item_ids = np.unique(tr.users), np.unique(tr.items)
    rows_te = _index_known(te, te.users, user_ids, "user", tr.source)
    cols_te = _index_known(te, te.items, item_ids, "item", tr.source)
    shape = (len(user_ids), len(item_ids))
    return RatingsData(
        name=name,
        train=to_csr(np.searchsorted(user_ids, tr.users), np.searchsorted(item_ids, tr.items), tr.ratings, shape),
        test=to_csr(rows_te, cols_te, te.ratings, shape),
        rating_scale=rating_scale,
        user_ids=user_ids,
        item_ids=item_ids,
        meta={"train_source": tr.source, "test_source": te.source},
    )


def no_ratings_error(source: str, unit: str) -> ValueError:
    """A source with a header and nothing else (or a DataFrame with no rows) would make an empty matrix."""
    return ValueError(f"{source}: no ratings found (no data {unit}s)")


def check_rating_scale(rating_scale: tuple[int, int]) -> None:
    """Reject scales that would store a rating as 0 (a stored entry means observed, zeros are absent)."""
    lo, hi = rating_scale
    if not (int(lo) == lo and int(hi) == hi and 1 <= lo < hi):
        raise ValueError(f"rating_scale must be integers 1 <= low < high, got {rating_scale}")


def to_csr(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, shape: tuple[int, int]) -> sp.csr_matrix:
    """CSR matrix (float64, sorted indices) of distinct (row, col) entries."""
    matrix = sp.csr_matrix((np.asarray(values, dtype=np.float64), (rows, cols)), shape=shape)
    matrix.sort_indices()
    return matrix


def _file_triples(path: Path, sep: str | None, header: bool | None) -> Triples:
    """Split a file into raw string columns, checking that every data line has three fields."""
    with utf8_errors_named(path):
        lines = path.read_text(encoding="utf-8-sig").split("\n")  # universal newlines: CRLF arrives as "\n"
    if lines and lines[-1] == "":
        lines.pop()
    layout = file_layout(path, lines, sep, header)
    return split_lines(path, lines, 1, *layout)


def file_layout(path: Path, lines: Iterable[str], sep: str | None,
                header: bool | None) -> tuple[str | None, int, tuple[int, int, int]]:
    """The separator, the 1-based number of the header line (0: none) and the file's columns of user, item and
    rating, from the first non-blank line.

    ``sep=None`` takes the first of tab, comma, semicolon or bar found on that line, else whitespace
    (returned as None); ``header=None`` makes it a header when at least two of its fields are column names
    (``_HEADER_NAMES``), so a damaged first data line is refused as any other line is, not dropped. A header that
    names all three columns (``_HEADER_NAMES``: user, item_id, rating, ...) is read by name; one that names some
    of them where another is read is an error, rather than a matrix with users and items swapped.
    """
    number, first = next(((n, line) for n, line in enumerate(lines, 1) if line.strip()), (0, None))
    if first is None:
        raise ValueError(f"{path}: no ratings found (the file is empty)")
    if sep is None:
        sep = next((s for s in _SNIFFED_SEPARATORS if s in first), None)
    if header is None:
        header = sum(_column_role(field) is not None for field in first.split(sep)) >= 2
    if not header:
        return sep, 0, (0, 1, 2)
    return sep, number, _columns_by_name(path, number, first.split(sep))


def _columns_by_name(path: Path, number: int, names: list[str]) -> tuple[int, int, int]:
    """The columns of user, item and rating that a header line's names give (in order when it names none, or
    when it has other than three names, e.g. 'user id item id rating' split on whitespace)."""
    if len(names) != len(COLUMNS):
        return 0, 1, 2
    roles = [_column_role(name) for name in names]
    if sorted(filter(None, roles)) == sorted(COLUMNS):
        return tuple(roles.index(role) for role in COLUMNS)
    for position, (name, role) in enumerate(zip(names, roles)):
        if role is not None and role != COLUMNS[position]:
            raise ValueError(f"{path}, line {number}: the header names {name.strip()!r} in column {position + 1}, "
                             f"where the {COLUMNS[position]} is read; name all three columns (user, item, rating) "
                             "or give them in that order")
    return 0, 1, 2


def split_lines(path: Path, lines: list[str], first_number: int, sep: str | None, header_line: int,
                order: tuple[int, int, int] = (0, 1, 2)) -> Triples:
    """Raw string columns of consecutive lines numbered from ``first_number`` (blank lines and the header
    line skipped), user, item and rating taken from fields ``order``, checking that every data line has three
    fields; files can be split chunk by chunk."""
    data_idx = np.flatnonzero(np.fromiter(map(len, map(str.strip, lines)), np.int64, len(lines)))
    if header_line:
        data_idx = data_idx[data_idx + first_number != header_line]
    data = [lines[k] for k in data_idx] if len(data_idx) < len(lines) else lines
    if sep is None:
        n_fields = np.fromiter((len(line.split()) for line in data), np.int64, len(data))
    else:
        n_fields = np.fromiter(map(methodcaller("count", sep), data), np.int64, len(data)) + 1
    bad = np.flatnonzero(n_fields != len(COLUMNS))
    if len(bad):
        k = bad[0]
        where = "whitespace" if sep is None else repr(sep)
        raise ValueError(
            f"{path}, line {data_idx[k] + first_number}: expected 3 columns (user, item, rating) separated by "
            f"{where}, found {n_fields[k]}"
        )
    # Every data line has exactly three fields, so one flat split yields user, item, rating in turn.
    tokens = (" ".join(data).split() if sep is None else sep.join(data).split(sep)) if data else []
    users, items, ratings = (np.array(tokens[c :: len(COLUMNS)], dtype=object) for c in order)
    return Triples(str(path), users, items, ratings, data_idx + first_number, "line")


def _frame_triples(frame: pd.DataFrame, label: str) -> Triples:
    if all(c in frame.columns for c in COLUMNS):
        frame = frame[list(COLUMNS)]
    elif frame.shape[1] != len(COLUMNS):
        raise ValueError(
            f"{label}: expected columns user, item, rating (or exactly three columns), got {list(frame.columns)}"
        )
    users, items, ratings = (frame.iloc[:, c].to_numpy() for c in range(len(COLUMNS)))
    return Triples(label, users, items, ratings, np.arange(1, len(frame) + 1), "row")


def _column_role(name: str) -> str | None:
    """The column ('user', 'item' or 'rating') a header field names, None for another word."""
    name = name.strip().strip("\"'").lower().replace(" ", "_").replace("-", "_")
    return next((role for role, known in _HEADER_NAMES.items() if name in known), None)


def _show(value: object) -> str:
    """repr of a value as the user wrote it (numpy scalars as plain Python ones)."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def _as_float(values: np.ndarray) -> np.ndarray:
    """Numeric value of each entry, NaN where it is not a number."""
    return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=np.float64)


def _is_integer(numbers: np.ndarray) -> np.ndarray:
    return np.isfinite(numbers) & (numbers == np.round(numbers))


def _parse_ratings(raw: Triples, rating_scale: tuple[int, int]) -> np.ndarray:
    numbers = _as_float(raw.ratings)
    bad = np.flatnonzero(~_is_integer(numbers))
    if len(bad):
        raise raw.error(bad[0], f"rating {_show(raw.ratings[bad[0]])} is not an integer")
    lo, hi = rating_scale
    off = np.flatnonzero((numbers < lo) | (numbers > hi))
    if len(off):
        raise raw.error(off[0], f"rating {int(numbers[off[0]])} is outside the rating scale {lo}..{hi}")
    return numbers.astype(np.int64)


_PLAIN_INTEGER = r"-?(?:0|[1-9][0-9]*)(?:\.0*)?"  # '7.0' too: pandas writes integer ids so beside a NaN
_INT64_DIGITS = {False: str(2**63 - 1), True: str(2**63)}  # the largest magnitude int64 holds, by sign


def _id_keys(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(each value's id, whether it is an integer id, whether it is missing), each value read by itself.

    The rule (``read_triples``): a value written as a plain integer that int64 holds (digits, an optional
    minus, no leading zero, no exponent, an optional '.0') is that integer; any other is its text, stripped.
    Numbers are read as ``str`` writes them. The ids are int64 when all are integers, else strings, the
    integers then written in decimal ('7.0' as '7'): '7' and '7.0' are one id and '07' another, in any file.
    """
    values = np.asarray(values)
    if values.dtype.kind == "i":
        return values.astype(np.int64), np.ones(values.shape, dtype=bool), np.zeros(values.shape, dtype=bool)
    # each distinct token is read once: ids repeat, and a regular expression per rating is half a load's time
    codes, tokens = pd.factorize(values.astype(object))
    text = pd.Series(tokens, dtype=object).astype(str).str.strip()
    whole = text.str.replace(r"\.0*$", "", regex=True).where(text.str.fullmatch(_PLAIN_INTEGER), None)
    whole = whole.where(whole != "-0", "0")
    digits = whole.str.lstrip("-").str.len().fillna(0).to_numpy(dtype=np.int64)
    negative = whole.str.startswith("-").fillna(False).to_numpy(dtype=bool)
    largest = np.where(negative, _INT64_DIGITS[True], _INT64_DIGITS[False])
    magnitude = whole.str.lstrip("-").fillna("").to_numpy(dtype=object)
    token_integer = whole.notna().to_numpy() & ((digits < 19) | ((digits == 19) & (magnitude <= largest)))
    token_keys = text.where(whole.isna(), whole).to_numpy(dtype=object)
    token_empty = (text == "").to_numpy()
    missing = (codes < 0) | token_empty[codes]
    integer = ~missing & token_integer[codes]
    if integer.all():  # then so is every distinct token
        return pd.to_numeric(whole).to_numpy(dtype=np.int64)[codes], integer, missing
    keys = token_keys[codes]
    keys[missing] = None
    return keys, integer, missing


def _parse_ids(raw: Triples, values: np.ndarray, kind: str, integer: bool) -> np.ndarray:
    """The ids of ``_id_keys``; a missing id, or with ``integer`` one that is not an integer, is an error."""
    ids, is_int, missing = _id_keys(values)
    if missing.any():
        raise raw.error(np.flatnonzero(missing)[0], f"{kind} id is missing")
    if integer and not is_int.all():
        k = np.flatnonzero(~is_int)[0]
        raise raw.error(k, f"{kind} id {_show(values[k])} is not an integer written plainly (digits, no leading "
                           "zero, within int64)")
    return ids


def _check_unique_pairs(t: Triples) -> None:
    user_codes, item_codes = pd.factorize(t.users)[0], pd.factorize(t.items)[0]
    keys = user_codes.astype(np.int64) * (int(item_codes.max()) + 1) + item_codes
    dup = np.flatnonzero(pd.Series(keys).duplicated().to_numpy())
    if len(dup):
        k = dup[0]
        first = np.flatnonzero(keys == keys[k])[0]
        raise t.error(
            k, f"duplicate (user, item) pair ({_show(t.users[k])}, {_show(t.items[k])}); "
            f"first given on {t.unit} {t.lines[first]}"
        )


def _index_known(t: Triples, ids: np.ndarray, known: np.ndarray, kind: str, train_source: str) -> np.ndarray:
    """Positions of ``ids`` in the sorted ``known`` ids; an id not there is an error at its line."""
    if ids.dtype != known.dtype:  # integer ids on one side, strings on the other: compare as text
        ids, known = ids.astype(str), known.astype(str)
    pos = pd.Index(known).get_indexer(ids)
    unknown = np.flatnonzero(pos < 0)
    if len(unknown):
        k = unknown[0]
        raise t.error(k, f"{kind} {_show(ids[k])} does not appear in the train data ({train_source})")
    return pos
