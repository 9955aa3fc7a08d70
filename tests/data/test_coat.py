"""Coat loader: the real files (when the shared copy is present) and malformed copies."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from mnar_recsys.data import coat
from mnar_recsys.data.coat import load_coat
from mnar_recsys.data.files import ChecksumWarning

# The shared copy sits beside the project root; MNAR_RECSYS_COAT_DIR overrides it (e.g. in a worktree).
COAT_DIR = Path(
    os.environ.get("MNAR_RECSYS_COAT_DIR", Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "coat")
)


@pytest.fixture(scope="module")
def real_coat():
    if not (COAT_DIR / "train.ascii").is_file():
        pytest.skip(f"Coat data not found at {COAT_DIR} (see datasets/coat/README.md)")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ChecksumWarning)  # the shared copy is the published one
        return load_coat(COAT_DIR)


def test_real_coat_counts(real_coat):
    assert real_coat.train.shape == real_coat.test.shape == (290, 300)
    assert real_coat.train.nnz == 6_960 and real_coat.test.nnz == 4_640
    assert real_coat.train.data.mean() == pytest.approx(2.61, abs=0.005)
    assert real_coat.test.data.mean() == pytest.approx(2.23, abs=0.005)
    assert set(np.unique(real_coat.train.data)) == {1, 2, 3, 4, 5}
    assert np.all(np.diff(real_coat.train.indptr) == 24) and np.all(np.diff(real_coat.test.indptr) == 16)


def write_coat(directory: Path, train: np.ndarray, test: np.ndarray) -> Path:
    for name, matrix in (("train.ascii", train), ("test.ascii", test)):
        lines = [" ".join(str(v) for v in row) for row in matrix]
        (directory / name).write_bytes(("\r\n".join(lines) + "\r\n").encode())
    return directory


def small_coat(tmp_path: Path, rng_seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(rng_seed)
    train = rng.integers(1, 6, coat.SHAPE) * (rng.random(coat.SHAPE) < 0.08)
    test = rng.integers(1, 6, coat.SHAPE) * (rng.random(coat.SHAPE) < 0.05)
    write_coat(tmp_path, train, test)
    return train, test


def load_quietly(data_dir: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ChecksumWarning)
        return load_coat(data_dir)


def test_round_trip_and_checksum_warning(tmp_path):
    train, test = small_coat(tmp_path)
    with pytest.warns(ChecksumWarning) as record:
        data = load_coat(tmp_path)
    messages = [str(w.message) for w in record]
    for name in ("train.ascii", "test.ascii"):
        assert any(f"{name}: sha256" in m and "differs from the published" in m for m in messages)
    np.testing.assert_array_equal(data.train.toarray(), train)
    np.testing.assert_array_equal(data.test.toarray(), test)
    assert data.train.nnz == np.count_nonzero(train)


def test_missing_file(tmp_path):
    small_coat(tmp_path)
    (tmp_path / "test.ascii").unlink()
    with pytest.raises(FileNotFoundError, match=r"test\.ascii.*datasets/coat/README\.md"):
        load_quietly(tmp_path)


def test_wrong_number_of_lines(tmp_path):
    train, test = small_coat(tmp_path)
    write_coat(tmp_path, train[:-1], test)
    with pytest.raises(ValueError, match=r"train\.ascii: expected 290 lines \(users\), found 289"):
        load_quietly(tmp_path)


def test_a_byte_order_mark_and_blank_lines_at_the_end_are_no_users(tmp_path):
    train, test = small_coat(tmp_path)
    path = tmp_path / "train.ascii"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes() + b"\r\n \r\n")
    np.testing.assert_array_equal(load_quietly(tmp_path).train.toarray(), train)


def test_text_that_is_not_utf8_is_named_by_line(tmp_path):
    small_coat(tmp_path)
    path = tmp_path / "test.ascii"
    lines = path.read_bytes().split(b"\r\n")
    lines[3] = b"\xff" + lines[3]
    path.write_bytes(b"\r\n".join(lines))
    with pytest.raises(ValueError, match=r"test\.ascii, line 4: byte 0xff at column 1 is not UTF-8 text"):
        load_quietly(tmp_path)


def test_wrong_number_of_columns(tmp_path):
    train, test = small_coat(tmp_path)
    lines = (tmp_path / "test.ascii").read_bytes().decode().split("\r\n")
    lines[6] += " 0"
    (tmp_path / "test.ascii").write_bytes("\r\n".join(lines).encode())
    with pytest.raises(ValueError, match=r"test\.ascii, line 7: expected 300 columns \(items\), found 301"):
        load_quietly(tmp_path)


@pytest.mark.parametrize("value", ["2.5", "x", "6", "-1"])
def test_bad_value(tmp_path, value):
    train, test = small_coat(tmp_path)
    train = train.astype(object)
    train[9, 4] = value
    write_coat(tmp_path, train, test)
    with pytest.raises(ValueError, match=r"train\.ascii, line 10, column 5: expected 0 \(not rated\) or an integer "
                                         rf"rating 1\.\.5, found '{value}'"):
        load_quietly(tmp_path)


def test_users_and_items_rated_in_test_but_not_in_train(tmp_path):
    train, test = small_coat(tmp_path)
    test[11, :] = 0
    test[11, 7] = 3
    train[11, :] = 0
    write_coat(tmp_path, train, test)
    with pytest.raises(ValueError, match=r"test\.ascii, line 12: this user has test ratings but none in train\.ascii"):
        load_quietly(tmp_path)
    train, test = small_coat(tmp_path)
    test[:, 41] = 0
    test[5, 41] = 2
    train[:, 41] = 0
    write_coat(tmp_path, train, test)
    with pytest.raises(ValueError, match=r"test\.ascii, column 42: this item has test ratings but none in "
                                         r"train\.ascii"):
        load_quietly(tmp_path)
    train[:, 41] = 0
    test[:, 41] = 0  # unrated in both: a column like any other
    write_coat(tmp_path, train, test)
    assert load_quietly(tmp_path).train.shape == coat.SHAPE


def test_the_authors_propensities_load_and_a_bad_one_is_named(tmp_path):
    """The real file's (when present): every cell, mean the train density 0.080; a copy with a value outside
    (0, 1] is refused naming its line and column."""
    if (COAT_DIR / coat.PROPENSITIES).is_file():
        with warnings.catch_warnings():
            warnings.simplefilter("error", ChecksumWarning)
            real = coat.load_coat_propensities(COAT_DIR)
        assert real.shape == (290, 300) and real.mean() == pytest.approx(6_960 / 87_000, abs=1e-4)
    values = np.full(coat.SHAPE, 0.08).astype(object)
    values[3, 7] = "1.5"
    (tmp_path / coat.PROPENSITIES).write_text("\n".join(" ".join(map(str, row)) for row in values) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ChecksumWarning)
        with pytest.raises(ValueError, match=r"propensities\.ascii, line 4, column 8: expected a propensity in "
                                             r"\(0, 1\], found '1\.5'"):
            coat.load_coat_propensities(tmp_path)


def test_the_results_record_the_files_checksums(tmp_path):
    """A file that differs from the published one only warns, so the results keep the sha256 of what was read:
    the propensities file's too when a model reads it."""
    from mnar_recsys.data.files import sha256_of
    from mnar_recsys.pipelines.ratings import RatingsRun, describe

    small_coat(tmp_path)
    row = " ".join(["0.08"] * coat.SHAPE[1])
    (tmp_path / coat.PROPENSITIES).write_text("\n".join([row] * coat.SHAPE[0]))
    data = load_quietly(tmp_path)
    ratings = {name: sha256_of(tmp_path / name) for name in ("train.ascii", "test.ascii")}
    run = RatingsRun(data="coat", data_dir=str(tmp_path), models=("mf", "mf-ips"))
    assert describe(data, run)["sha256"] == ratings
    run = RatingsRun(data="coat", data_dir=str(tmp_path), models=("mf", "mf-ips-given"))
    assert describe(data, run)["sha256"] == {**ratings, coat.PROPENSITIES: sha256_of(tmp_path / coat.PROPENSITIES)}
