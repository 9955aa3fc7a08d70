"""Generic triples loader: CSV/TSV files (header detected) and DataFrames, shared id map, bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mnar_recsys.data.ondisk import convert_triples, open_csr
from mnar_recsys.data.triples import load_triples, read_triples


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_csv_with_header(tmp_path):
    train = write(tmp_path / "train.csv", "user,item,rating\nalice,book,5\nbob,book,2\nbob,film,4\n")
    test = write(tmp_path / "test.csv", "user,item,rating\nalice,film,1\n")
    data = load_triples(train, test, name="toy")
    assert data.name == "toy" and data.train.shape == (2, 2)
    assert list(data.user_ids) == ["alice", "bob"] and list(data.item_ids) == ["book", "film"]
    np.testing.assert_array_equal(data.train.toarray(), [[5, 0], [2, 4]])
    np.testing.assert_array_equal(data.test.toarray(), [[0, 1], [0, 0]])


def test_tsv_without_header_numeric_ids(tmp_path):
    train = write(tmp_path / "train.tsv", "10\t7\t3\n2\t7\t1\n10\t30\t5\n")
    test = write(tmp_path / "test.tsv", "2\t30\t2\n")
    data = load_triples(train, test)
    np.testing.assert_array_equal(data.user_ids, [2, 10])  # integer ids sort numerically
    np.testing.assert_array_equal(data.item_ids, [7, 30])
    assert data.train[1, 1] == 5 and data.test[0, 1] == 2


def test_large_integer_ids_stay_distinct(tmp_path):
    """Ids past 2^53 (hashes) are not read through float64, where 2^53 + 1 and 2^53 are one number."""
    train = write(tmp_path / "train.tsv", "9007199254740993\t1\t3\n9007199254740992\t1\t4\n"
                                          "18446744073709551615\t2\t5\n18446744073709551614\t2\t2\n")
    test = write(tmp_path / "test.tsv", "9007199254740993\t2\t1\n")
    data = load_triples(train, test)
    assert data.train.shape == (4, 2)
    assert data.test.nnz == 1 and data.train[data.test.nonzero()[0][0]].toarray()[0, 0] == 3


def test_whitespace_separated(tmp_path):
    train = write(tmp_path / "train.txt", "1 1 3\n2  1 4\n")
    test = write(tmp_path / "test.txt", "2 1 1\n")
    assert load_triples(train, test).train.nnz == 2


def test_dataframes_share_the_train_id_map():
    train = pd.DataFrame({"rating": [4, 2, 3], "user": ["u1", "u2", "u2"], "item": [5, 5, 9]})
    test = pd.DataFrame([("u2", 9, 1)], columns=["a", "b", "c"])  # three unnamed columns: positional
    data = load_triples(train, test, rating_scale=(1, 4))
    np.testing.assert_array_equal(data.train.toarray(), [[4, 0], [2, 3]])
    assert data.test[1, 1] == 1 and data.rating_scale == (1, 4)


def test_dataframe_and_file_mix(tmp_path):
    train = pd.DataFrame({"user": [1, 2], "item": [1, 1], "rating": [3.0, 4.0]})
    test = write(tmp_path / "test.csv", "2,1,5\n")
    assert load_triples(train, test).test[1, 0] == 5


def test_test_user_unknown_to_train(tmp_path):
    train = write(tmp_path / "train.csv", "user,item,rating\na,x,1\nb,x,2\n")
    test = write(tmp_path / "test.csv", "user,item,rating\na,x,1\nc,x,2\n")
    with pytest.raises(ValueError, match=r"test\.csv, line 3: user 'c' does not appear in the train data"):
        load_triples(train, test)


def test_test_item_unknown_to_train():
    train = pd.DataFrame({"user": [1, 2], "item": [1, 1], "rating": [3, 4]})
    test = pd.DataFrame({"user": [1, 2], "item": [1, 2], "rating": [3, 4]})
    with pytest.raises(ValueError, match=r"test DataFrame, row 2: item 2 does not appear in the train data"):
        load_triples(train, test)


def test_wrong_column_count(tmp_path):
    train = write(tmp_path / "train.csv", "1,1,3\n1,2,3,7\n")
    with pytest.raises(ValueError, match=r"train\.csv, line 2: expected 3 columns .* ',', found 4"):
        load_triples(train, train)


def test_non_integer_rating_in_dataframe():
    train = pd.DataFrame({"user": [1, 2], "item": [1, 1], "rating": [3.0, 3.5]})
    with pytest.raises(ValueError, match=r"train DataFrame, row 2: rating 3\.5 is not an integer"):
        load_triples(train, train)


def test_missing_rating_in_dataframe():
    train = pd.DataFrame({"user": [1, 2], "item": [1, 1], "rating": [3.0, None]})
    with pytest.raises(ValueError, match=r"train DataFrame, row 2: rating nan is not an integer"):
        load_triples(train, train)


def test_rating_off_scale(tmp_path):
    train = write(tmp_path / "train.csv", "user,item,rating\n1,1,3\n1,2,11\n")
    with pytest.raises(ValueError, match=r"train\.csv, line 3: rating 11 is outside the rating scale 1\.\.10"):
        load_triples(train, train, rating_scale=(1, 10))


def test_duplicate_pair(tmp_path):
    train = write(tmp_path / "train.csv", "a,x,1\nb,x,2\na,x,3\n")
    with pytest.raises(ValueError, match=r"train\.csv, line 3: duplicate \(user, item\) pair \('a', 'x'\); "
                                         r"first given on line 1"):
        load_triples(train, train)


def test_missing_id():
    train = pd.DataFrame({"user": ["a", None], "item": ["x", "x"], "rating": [1, 2]})
    with pytest.raises(ValueError, match=r"train DataFrame, row 2: user id is missing"):
        load_triples(train, train)


def test_rating_scale_must_start_at_one_or_more(tmp_path):
    train = write(tmp_path / "train.csv", "1,1,0\n")
    with pytest.raises(ValueError, match=r"rating_scale must be integers 1 <= low < high"):
        load_triples(train, train, rating_scale=(0, 5))


def test_dataframe_without_rating_columns():
    frame = pd.DataFrame({"a": [1], "b": [1], "c": [1], "d": [1]})
    with pytest.raises(ValueError, match=r"train DataFrame: expected columns user, item, rating"):
        load_triples(frame, frame)


def test_empty_file(tmp_path):
    empty = write(tmp_path / "train.csv", "\n\n")
    with pytest.raises(ValueError, match=r"train\.csv: no ratings found"):
        load_triples(empty, empty)


def test_header_alone_or_no_rows_is_no_ratings(tmp_path):
    header_only = write(tmp_path / "train.csv", "user,item,rating\n")
    with pytest.raises(ValueError, match=r"train\.csv: no ratings found \(no data lines\)"):
        load_triples(header_only, header_only)
    frame = pd.DataFrame({"user": [], "item": [], "rating": []})
    with pytest.raises(ValueError, match=r"train DataFrame: no ratings found \(no data rows\)"):
        load_triples(frame, frame)


def test_an_explicit_separator_and_header_are_used_as_given(tmp_path):
    """Sniffing would take a comma here (it comes before the bar in its list) and a header from line 1."""
    path = write(tmp_path / "r.txt", "user|item|rating,comment\n7|3|5,good\n")
    with pytest.raises(ValueError, match=r"line 2: rating '5,good' is not an integer"):
        read_triples(path, sep="|")  # the bar splits, the header is still found
    path = write(tmp_path / "r.txt", "7|3|5\n8|3|2\n")
    triples = read_triples(path, sep="|", header=False)
    assert list(triples.users) == [7, 8] and list(triples.ratings) == [5, 2]
    with pytest.raises(ValueError, match=r"line 1: rating 'rating' is not an integer"):
        read_triples(write(tmp_path / "h.txt", "user|item|rating\n7|3|5\n"), sep="|", header=False)


def test_a_header_is_read_by_name(tmp_path):
    """A header that names the columns in another order gives them by name; one that names a column where another
    is read is refused, where the two would have been read swapped."""
    train = write(tmp_path / "train.csv", "item_id,User,Rating\nx,1,5\ny,2,3\nx,2,4\n")
    test = write(tmp_path / "test.csv", "user,item,rating\n1,y,2\n")
    data = load_triples(train, test)
    np.testing.assert_array_equal(data.user_ids, [1, 2])
    np.testing.assert_array_equal(data.item_ids, ["x", "y"])
    np.testing.assert_array_equal(data.train.toarray(), [[5, 0], [4, 3]])
    swapped = write(tmp_path / "swapped.csv", "item,user,stars2\n1,2,5\n")
    with pytest.raises(ValueError, match=r"swapped\.csv, line 1: the header names 'item' in column 1, where the user"):
        read_triples(swapped)
    unnamed = write(tmp_path / "unnamed.csv", "a,b,c\n1,2,5\n")  # names no column: data, and bad data
    with pytest.raises(ValueError, match=r"unnamed\.csv, line 1: rating 'c' is not an integer"):
        read_triples(unnamed)
    assert read_triples(unnamed, header=True).users.tolist() == [1]
    spaced = write(tmp_path / "spaced.txt", "user id item id rating\n1 7 5\n2 8 4\n")  # five names, three columns
    assert read_triples(spaced).items.tolist() == [7, 8]


def test_ids_written_two_ways_stay_two_ids(tmp_path):
    """'0042' and '42', or '1e3' and '1000', are distinct codes (an ISBN keeps its leading zero), not one number."""
    source = write(tmp_path / "r.tsv", "u1\t0042\t5\nu1\t42\t3\nu2\t1e3\t4\nu2\t1000\t2\n")
    data = load_triples(source, source)
    np.testing.assert_array_equal(data.item_ids, ["0042", "1000", "1e3", "42"])
    assert data.train.nnz == 4
    # as pandas writes integer ids beside a missing value: still the integers
    floats = load_triples(write(tmp_path / "f.csv", "1.0,10.0,5\n2.0,20.0,4\n"), write(tmp_path / "t.csv", "1,20,3\n"))
    np.testing.assert_array_equal(floats.user_ids, [1, 2])


@pytest.mark.parametrize("others, kind", [("", "i"), ("01,x,3\nu9,x,3\n", "O")])
def test_an_id_is_read_by_itself(tmp_path, others, kind):
    """'7' and '7.0' are one user, and '01' another than '1', whether or not other lines hold text ids; the
    on-disk converter reads them alike."""
    source = write(tmp_path / "r.csv", "7,x,5\n7.0,y,4\n1,x,1\n1.0,y,2\n" + others)
    triples = read_triples(source)
    assert triples.users.dtype.kind == kind
    assert [str(user) for user in triples.users] == ["7", "7", "1", "1", "01", "u9"][:len(triples.users)]
    expected = [1, 7] if kind == "i" else ["01", "1", "7", "u9"]
    np.testing.assert_array_equal(load_triples(source, source).user_ids, expected)
    np.testing.assert_array_equal(open_csr(convert_triples(source, tmp_path / "csr", chunksize=2)).user_ids, expected)
    if others:
        with pytest.raises(ValueError, match=r"r\.csv, line 5: user id '01' is not an integer"):
            read_triples(source, integer_ids=True)


@pytest.mark.parametrize("text, line", [("u1,i1,five\nu2,i1,3\n", 1), ("u2,i1,3\nu1,i1,five\n", 2)])
def test_a_damaged_first_line_is_refused_like_any_other(tmp_path, text, line):
    """A header is known by its column names: a first line that fails to parse is bad data, not a header."""
    with pytest.raises(ValueError, match=rf"r\.csv, line {line}: rating 'five' is not an integer"):
        read_triples(write(tmp_path / "r.csv", text))
