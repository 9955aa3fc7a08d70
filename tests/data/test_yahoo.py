"""Yahoo! R3 loader on small files written in the real format (CRLF, tab-separated, 1-based ids)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from mnar_recsys.data import yahoo
from mnar_recsys.data.files import ChecksumWarning, sha256_of
from mnar_recsys.data.yahoo import TEST_FILE, TRAIN_FILE, load_yahoo_r3

TRAIN = [(1, 1, 5), (1, 3, 4), (2, 2, 1), (3, 6, 3), (4, 5, 2)]
TEST = [(1, 2, 1), (1, 6, 2), (2, 1, 3)]


def write_rows(path: Path, rows) -> Path:
    """Write rows the way the published files are: tab-separated, CRLF line ends."""
    path.write_bytes("".join("\t".join(map(str, row)) + "\r\n" for row in rows).encode())
    return path


def write_yahoo(tmp_path: Path, train=TRAIN, test=TEST) -> Path:
    write_rows(tmp_path / TRAIN_FILE, train)
    write_rows(tmp_path / TEST_FILE, test)
    return tmp_path


def load_quietly(data_dir: Path):
    """Load, ignoring the checksum warning that any file but the published one triggers."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ChecksumWarning)
        return load_yahoo_r3(data_dir)


def test_round_trip(tmp_path):
    data = load_quietly(write_yahoo(tmp_path))
    assert data.train.shape == data.test.shape == (4, 6)  # the train file's largest ids
    assert data.train.nnz == len(TRAIN) and data.test.nnz == len(TEST)
    for matrix, rows in ((data.train, TRAIN), (data.test, TEST)):
        for user, song, rating in rows:
            assert matrix[user - 1, song - 1] == rating
    np.testing.assert_array_equal(data.user_ids, [1, 2, 3, 4])
    np.testing.assert_array_equal(data.item_ids, [1, 2, 3, 4, 5, 6])
    assert data.rating_scale == (1, 5) and data.name == "yahoo_r3"
    users, items, ratings = data.test_triples()
    np.testing.assert_array_equal(ratings, [1, 2, 3])


def test_checksum_mismatch_warns(tmp_path):
    with pytest.warns(ChecksumWarning) as record:
        load_yahoo_r3(write_yahoo(tmp_path))
    messages = [str(w.message) for w in record]
    for name in (TRAIN_FILE, TEST_FILE):
        assert any(f"{name}: sha256" in m and "differs from the published" in m for m in messages)


def test_matching_checksum_is_silent(tmp_path, monkeypatch):
    write_yahoo(tmp_path)
    digests = {name: sha256_of(tmp_path / name) for name in (TRAIN_FILE, TEST_FILE)}
    monkeypatch.setattr(yahoo, "SHA256", digests)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = load_yahoo_r3(tmp_path)
    assert data.meta["sha256"] == digests


@pytest.mark.parametrize("missing", [TRAIN_FILE, TEST_FILE])
def test_missing_file_points_at_the_card(tmp_path, missing):
    write_yahoo(tmp_path)
    (tmp_path / missing).unlink()
    with pytest.raises(FileNotFoundError, match=rf"{missing}.*datasets/yahoo_r3/README\.md"):
        load_yahoo_r3(tmp_path)


def test_a_folder_where_a_file_belongs_is_named_as_a_folder(tmp_path):
    write_yahoo(tmp_path)
    (tmp_path / TRAIN_FILE).unlink()
    (tmp_path / TRAIN_FILE).mkdir()
    with pytest.raises(IsADirectoryError, match=rf"data file {tmp_path / TRAIN_FILE} is a folder; put the data file "
                                                r"itself there \(see datasets/yahoo_r3/README\.md\)"):
        load_yahoo_r3(tmp_path)


def with_train_line(line: str, position: int = 2) -> list:
    rows = [tuple(map(str, row)) for row in TRAIN]
    rows.insert(position, tuple(line.split("\t")))
    return rows


def load_bad_train(tmp_path, line: str):
    load_quietly(write_yahoo(tmp_path, train=with_train_line(line)))


def test_too_many_columns(tmp_path):
    with pytest.raises(ValueError, match=rf"{TRAIN_FILE}, line 3: expected 3 columns .* found 4"):
        load_bad_train(tmp_path, "2\t4\t3\t99")


def test_too_few_columns(tmp_path):
    with pytest.raises(ValueError, match=rf"{TRAIN_FILE}, line 3: expected 3 columns .* found 2"):
        load_bad_train(tmp_path, "2\t4")


def test_non_integer_user_id(tmp_path):
    with pytest.raises(ValueError, match=rf"{TRAIN_FILE}, line 3: user id 'u2' is not an integer"):
        load_bad_train(tmp_path, "u2\t4\t3")


def test_non_integer_song_id(tmp_path):
    with pytest.raises(ValueError, match=rf"{TRAIN_FILE}, line 3: item id '4.5' is not an integer"):
        load_bad_train(tmp_path, "2\t4.5\t3")


def test_non_integer_rating(tmp_path):
    with pytest.raises(ValueError, match=rf"{TRAIN_FILE}, line 3: rating '3.5' is not an integer"):
        load_bad_train(tmp_path, "2\t4\t3.5")


@pytest.mark.parametrize("rating", ["0", "6"])
def test_rating_off_scale(tmp_path, rating):
    with pytest.raises(ValueError, match=rf"{TRAIN_FILE}, line 3: rating {rating} is outside the rating scale 1\.\.5"):
        load_bad_train(tmp_path, f"2\t4\t{rating}")


def test_duplicate_pair(tmp_path):
    with pytest.raises(ValueError, match=rf"{TRAIN_FILE}, line 3: duplicate \(user, item\) pair \(1, 3\); "
                                         r"first given on line 2"):
        load_bad_train(tmp_path, "1\t3\t2")


def test_id_below_one(tmp_path):
    with pytest.raises(ValueError, match=rf"{TRAIN_FILE}, line 3: user id 0 is not a 1-based id"):
        load_bad_train(tmp_path, "0\t4\t3")


@pytest.mark.parametrize("line, message", [
    ("15401\t4\t3", "user id 15401 is beyond Yahoo! R3's users \\(expected 1..15,400\\)"),
    ("2\t1099511627776\t3", "song id 1099511627776 is beyond Yahoo! R3's songs \\(expected 1..1,000\\)"),
])
def test_id_beyond_the_published_range(tmp_path, line, message):
    """Ids are positions, so a stray large id would otherwise size the matrix by it (8 TiB for this song)."""
    with pytest.raises(ValueError, match=rf"{TRAIN_FILE}, line 3: {message}"):
        load_bad_train(tmp_path, line)


def test_checksum_warning_points_at_the_caller(tmp_path):
    with pytest.warns(ChecksumWarning) as record:
        load_yahoo_r3(write_yahoo(tmp_path))
    assert {Path(w.filename).name for w in record} == {Path(__file__).name}


def test_test_user_unknown_to_train(tmp_path):
    with pytest.raises(ValueError, match=rf"{TEST_FILE}, line 2: user id 5 is unknown to the train data"):
        load_quietly(write_yahoo(tmp_path, test=[(1, 2, 1), (5, 1, 3)]))


def test_test_song_unknown_to_train(tmp_path):
    with pytest.raises(ValueError, match=rf"{TEST_FILE}, line 3: song id 7 is unknown to the train data"):
        load_quietly(write_yahoo(tmp_path, test=[(1, 2, 1), (1, 6, 2), (2, 7, 3)]))


def test_test_ids_within_the_range_but_without_train_ratings(tmp_path):
    """Train rates songs 1, 2, 3, 5, 6 and users 1..4: song 4 and, once its one rating goes, user 3 are unknown."""
    with pytest.raises(ValueError, match=rf"{TEST_FILE}, line 2: song id 4 is unknown to the train data "
                                         r"\(no rating in"):
        load_quietly(write_yahoo(tmp_path, test=[(1, 2, 1), (2, 4, 3)]))
    train = [row for row in TRAIN if row[0] != 3] + [(5, 6, 1)]
    with pytest.raises(ValueError, match=rf"{TEST_FILE}, line 1: user id 3 is unknown to the train data"):
        load_quietly(write_yahoo(tmp_path, train=train, test=[(3, 2, 1)]))


def test_blank_lines_are_skipped_and_line_numbers_kept(tmp_path):
    rows = [tuple(map(str, row)) for row in TRAIN]
    (tmp_path / TRAIN_FILE).write_bytes(("\r\n".join("\t".join(r) for r in rows[:2]) + "\r\n\r\n2\t4\t9\r\n").encode())
    write_rows(tmp_path / TEST_FILE, TEST)
    with pytest.raises(ValueError, match=rf"{TRAIN_FILE}, line 4: rating 9 is outside"):
        load_quietly(tmp_path)
