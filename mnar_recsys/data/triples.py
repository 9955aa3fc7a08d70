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

    After ``read_triples``: ``ratings`` are int64 on the scale, ids are int64 when every id is an
    integer written plainly (no leading zero or exponent; else strings), and no (user, item) pair repeats.
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
    ``header=None`` treats a first line with no numeric field as a header. Blank lines are skipped; quoting
    is not supported.
    DataFrames: columns named user/item/rating, else exactly three columns in that order; errors
    name ``label`` and the 1-based row. ``integer_ids`` makes ids that are not integers written plainly an error.
    Raises ValueError (naming source and line) on a source with no ratings, a wrong column count, a
    non-integer or off-scale rating, a missing or (with ``integer_ids``) non-integer id, or a repeated
    (user, item) pair.
    """
    raw = _frame_triples(source, label) if isinstance(source, pd.DataFrame) else _file_triples(Path(source), sep, header)
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
    (returned as None); ``header=None`` makes it a header when none of its fields is a number. A header that
    names all three columns (``_HEADER_NAMES``: user, item_id, rating, ...) is read by name; one that names some
    of them where another is read is an error, rather than a matrix with users and items swapped.
    """
    number, first = next(((n, line) for n, line in enumerate(lines, 1) if line.strip()), (0, None))
    if first is None:
        raise ValueError(f"{path}: no ratings found (the file is empty)")
    if sep is None:
        sep = next((s for s in _SNIFFED_SEPARATORS if s in first), None)
    if header is None:
        header = not any(_is_number(field) for field in first.split(sep))
    if not header:
        return sep, 0, (0, 1, 2)
    return sep, number, _columns_by_name(path, number, first.split(sep))


def _columns_by_name(path: Path, number: int, names: list[str]) -> tuple[int, int, int]:
    """The columns of user, item and rating that a header line's names give (in order when it names none, or
    when it has other than three names, e.g. 'user id item id rating' split on whitespace)."""
    if len(names) != len(COLUMNS):
        return 0, 1, 2
    roles = [next((role for role, known in _HEADER_NAMES.items()
                   if name.strip().strip("\"'").lower().replace(" ", "_").replace("-", "_") in known), None)
             for name in names]
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
        raise ValueError(f"{label}: expected columns user, item, rating (or exactly three columns), got {list(frame.columns)}")
    users, items, ratings = (frame.iloc[:, c].to_numpy() for c in range(len(COLUMNS)))
    return Triples(label, users, items, ratings, np.arange(1, len(frame) + 1), "row")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


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


def _written_plainly(values: np.ndarray) -> np.ndarray:
    """Whether each value is a number, or text that writes an integer plainly (digits, an optional minus, no
    leading zero, no exponent; a '.0' is allowed): '0042' and '42', or '1e3' and '1000', are two ids, as codes
    such as ISBNs are."""
    # each distinct token is checked once: ids repeat, and a regular expression per rating is half a load's time
    codes, tokens = pd.factorize(np.asarray(values, dtype=object))
    strings = np.fromiter((isinstance(v, str) for v in tokens), dtype=bool, count=len(tokens))
    plain_tokens = np.ones(len(tokens), dtype=bool)
    if strings.any():
        text = pd.Series(tokens[strings], dtype=object).str.strip()
        plain_tokens[strings] = text.str.fullmatch(_PLAIN_INTEGER).to_numpy(dtype=bool)
    plain = np.ones(len(codes), dtype=bool)  # a missing value (code -1) is left to the id checks after this
    plain[codes >= 0] = plain_tokens[codes[codes >= 0]]
    return plain


def _integer_ids(values: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """(int64 ids if every value is an integer held exactly and written plainly, else None; which values are)."""
    plain = _written_plainly(values)
    parsed = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce")
    if parsed.dtype.kind == "i" and plain.all():  # all integers that fit int64, read exactly
        return parsed.to_numpy(dtype=np.int64), plain
    numbers = parsed.to_numpy(dtype=np.float64)
    # beyond 2^53 a float64 no longer tells neighbouring integers apart: such ids stay text
    is_int = _is_integer(numbers) & (np.abs(numbers) < 2.0 ** 53) & plain
    return (numbers.astype(np.int64) if is_int.all() else None), is_int


def _text_ids(values: np.ndarray) -> np.ndarray:
    return pd.Series(values, dtype=object).astype(str).str.strip().to_numpy(dtype=object)


def _parse_ids(raw: Triples, values: np.ndarray, kind: str, integer: bool) -> np.ndarray:
    """int64 ids when all are integers; else stripped strings (or an error when ``integer``)."""
    ids, is_int = _integer_ids(values)
    if ids is not None:
        return ids
    if integer:
        k = np.flatnonzero(~is_int)[0]
        raise raw.error(k, f"{kind} id {_show(values[k])} is not an integer written plainly (digits, no leading "
                           "zero)")
    text = _text_ids(values)
    missing = np.flatnonzero(pd.isna(values) | (text == ""))
    if len(missing):
        raise raw.error(missing[0], f"{kind} id is missing")
    return text


def _check_unique_pairs(t: Triples) -> None:
    user_codes, item_codes = pd.factorize(t.users)[0], pd.factorize(t.items)[0]
    keys = user_codes.astype(np.int64) * (int(item_codes.max()) + 1) + item_codes
    dup = np.flatnonzero(pd.Series(keys).duplicated().to_numpy())
    if len(dup):
        k = dup[0]
        first = np.flatnonzero(keys == keys[k])[0]
        raise t.error(
            k, f"duplicate (user, item) pair ({_show(t.users[k])}, {_show(t.items[k])}); first given on {t.unit} {t.lines[first]}"
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
