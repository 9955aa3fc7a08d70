"""On-disk CSR rows: the same batches and fit as in memory, a converter that matches the triples loader,
and bad folders or files named in the error with nothing half-written left behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from mnar_recsys.cli import main
from mnar_recsys.data import ondisk
from mnar_recsys.data.ondisk import convert_triples, open_csr, save_csr
from mnar_recsys.data.rows import CSRRows, _check_csr
from mnar_recsys.data.triples import load_triples, read_triples
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.training.trainer import TrainConfig, fit


def ratings_matrix(n_rows: int = 120, n_cols: int = 30, density: float = 0.15, seed: int = 0) -> sp.csr_matrix:
    """Random 1..5 ratings, with some rows left empty."""
    rng = np.random.default_rng(seed)
    matrix = sp.random(n_rows, n_cols, density=density, format="csr", random_state=rng,
                       data_rvs=lambda n: rng.integers(1, 6, n).astype(float))
    matrix = sp.diags((np.arange(n_rows) % 17 != 0).astype(float)) @ matrix
    matrix.eliminate_zeros()
    return sp.csr_matrix(matrix)


def assert_same_batch(a, b) -> None:
    assert (a.n_rows, a.n_features) == (b.n_rows, b.n_features)
    for name in ("obs_row", "obs_col", "obs_value"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_round_trip_gives_the_in_memory_batches(tmp_path, monkeypatch):
    matrix = ratings_matrix()
    users, items = np.arange(matrix.shape[0]) * 10, np.array([f"item{j}" for j in range(matrix.shape[1])])
    rows = open_csr(save_csr(matrix, tmp_path / "m", user_ids=users, item_ids=items))
    memory = CSRRows(_check_csr(matrix))
    rng = np.random.default_rng(1)
    for index in [np.arange(matrix.shape[0]), np.array([], dtype=np.int64), np.array([0, 17, 17, 5]),
                  *(rng.integers(0, matrix.shape[0], 25) for _ in range(10))]:
        assert_same_batch(rows.batch(index), memory.batch(index))
    monkeypatch.setattr(ondisk, "CHUNK", 7)  # several chunks
    for index in (np.arange(matrix.shape[0]), np.array([3, 0, 9])):
        fraction, mean = rows.observed_summary(index)
        np.testing.assert_array_equal(fraction, memory.observed_summary(index)[0])
        assert mean == memory.observed_summary(index)[1]
    np.testing.assert_array_equal(rows.observed_values(), memory.observed_values())
    np.testing.assert_array_equal(rows.user_ids, users)
    np.testing.assert_array_equal(rows.item_ids, items)
    with pytest.raises(IndexError, match="out of range"):
        rows.batch(np.array([matrix.shape[0]]))


def test_save_validates_and_leaves_nothing_on_failure(tmp_path):
    matrix = ratings_matrix().astype(np.float64)
    matrix.data[3] = np.nan
    with pytest.raises(ValueError, match="finite"):
        save_csr(matrix, tmp_path / "m")
    with pytest.raises(ValueError, match="users ids must be one per user"):
        save_csr(ratings_matrix(), tmp_path / "m", user_ids=np.arange(3))
    assert leftovers(tmp_path) == []
    save_csr(ratings_matrix(), tmp_path / "m")
    with pytest.raises(FileExistsError, match="already exists"):
        save_csr(ratings_matrix(), tmp_path / "m")


def test_converter_matches_the_triples_loader(tmp_path):
    text = ("user,item,rating\r\n"  # header, CRLF, a blank line, ids as strings
            "carol,film,1\r\nalice,book,5\r\n\r\nbob,film,4\r\nbob,book,2\r\nalice,film,3\r\ndave,song,2\r\n")
    source = write(tmp_path / "r.csv", text)
    for chunksize in (1, 2, 1000):
        rows = open_csr(convert_triples(source, tmp_path / f"out{chunksize}", chunksize=chunksize))
        data = load_triples(source, source)
        np.testing.assert_array_equal(rows.batch(np.arange(rows.n_rows)).values.numpy(), data.train.toarray())
        np.testing.assert_array_equal(rows.user_ids, data.user_ids)
        np.testing.assert_array_equal(rows.item_ids, data.item_ids)


@pytest.mark.parametrize("text", [
    "10 7 3\n2  7 1\n10 30 5\n",     # whitespace, integer ids sort numerically
    "007\tx\t3\n7\ty\t1\nz\tx\t5\n",  # a non-integer id: every id stays the string it was written as
    "9007199254740993\t1\t3\n9007199254740992\t1\t4\n18446744073709551615\t2\t5\n",  # past 2^53 and int64
    "0042\tx\t3\n42\tx\t1\n1e3\ty\t5\n",  # an integer written two ways: two ids
    "item,user,rating\nx,7,3\ny,2,1\n",  # a header read by name
])
def test_converter_ids_as_the_loader_makes_them(tmp_path, text):
    source = write(tmp_path / "r.txt", text)
    rows = open_csr(convert_triples(source, tmp_path / "out", chunksize=2))
    data = load_triples(source, source)
    assert rows.user_ids.dtype.kind == ("i" if data.user_ids.dtype.kind == "i" else "U")
    np.testing.assert_array_equal(rows.user_ids, data.user_ids)
    np.testing.assert_array_equal(rows.batch(np.arange(rows.n_rows)).values.numpy(), data.train.toarray())


@pytest.mark.parametrize("text, message", [
    ("a,x,1\nb,x,2\nc,x\n", r"r\.csv, line 3: expected 3 columns"),
    ("a,x,1\nb,x,2\n\nc,x,good\n", r"r\.csv, line 4: rating 'good' is not an integer"),
    ("a,x,1\nb,x,7\n", r"r\.csv, line 2: rating 7 is outside the rating scale 1\.\.5"),
    ("a,x,1\n,x,2\n", r"r\.csv, line 2: user id is missing"),
    ("a,x,1\nb,x,2\nb,y,3\nc,x,1\na,x,4\nb,y,5\n", r"r\.csv, line 5: duplicate \(user, item\) pair \('a', 'x'\); "
                                                    r"first given on line 1"),
    ("user,item,rating\n\n", r"r\.csv: no ratings found \(no data lines\)"),
])
def test_converter_names_the_bad_line_and_leaves_no_folder(tmp_path, text, message):
    source = write(tmp_path / "r.csv", text)
    with pytest.raises(ValueError, match=message) as converted:
        convert_triples(source, tmp_path / "out", chunksize=2)
    with pytest.raises(ValueError) as loaded:
        read_triples(source)
    assert str(converted.value) == str(loaded.value)  # same line, same words as the in-memory loader
    assert leftovers(tmp_path) == ["r.csv"]


def test_text_that_is_not_utf8_is_named_by_line_by_both_readers(tmp_path):
    """Python's decoder names a byte offset within its buffer and no file; both readers name the line."""
    source = tmp_path / "r.csv"
    source.write_bytes("a,x,1\nb,x,2\nc,caf\u00e9,3\n".encode("latin-1"))
    message = r"r\.csv, line 3: byte 0xe9 at column 6 is not UTF-8 text"
    with pytest.raises(ValueError, match=message):
        convert_triples(source, tmp_path / "out", chunksize=2)
    with pytest.raises(ValueError, match=message):
        read_triples(source)
    assert leftovers(tmp_path) == ["r.csv"]


@pytest.fixture
def folder(tmp_path) -> Path:
    return save_csr(ratings_matrix(), tmp_path / "m")


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-40])


def edit_meta(folder: Path, **changes) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, **changes}))


@pytest.mark.parametrize("damage, message", [
    (lambda f: (f / "data.npy").unlink(), r"data\.npy is missing"),
    (lambda f: (f / "meta.json").unlink(), r"meta\.json is missing"),
    (lambda f: truncate(f / "indices.npy"), r"indices\.npy is truncated: \d+ bytes, expected \d+"),
    (lambda f: (f / "indptr.npy").write_bytes(b"\x93NUMPY\x01"), r"indptr\.npy is not a readable \.npy file"),
    (lambda f: (f / "meta.json").write_text("{"), r"meta\.json is not valid JSON"),
    (lambda f: edit_meta(f, format="other"), r"meta\.json: expected format 'mnar-recsys-csr'"),
    (lambda f: edit_meta(f, nnz=3), r"indices\.npy has shape \(\d+,\) but meta\.json gives nnz = 3"),
    (lambda f: edit_meta(f, shape=[5, 30]), r"indptr\.npy has shape \(121,\) but meta\.json gives n_rows \+ 1 = 6"),
    (lambda f: np.save(f / "data.npy", np.load(f / "data.npy").astype(np.float64)), r"data\.npy holds float64"),
    (lambda f: np.save(f / "indptr.npy", np.load(f / "indptr.npy")[::-1].copy()), r"indptr\.npy must run from 0"),
    (lambda f: np.save(f / "users.npy", np.arange(4)), r"users\.npy has shape \(4,\) but meta\.json gives n_rows"),
])
def test_open_names_the_bad_file(folder, damage, message):
    damage(folder)
    with pytest.raises(ValueError, match=message):
        open_csr(folder)


def test_indptr_that_decreases_and_columns_out_of_range_are_named(folder):
    indptr = np.load(folder / "indptr.npy")
    indptr[5], indptr[6] = indptr[6], indptr[5] - 1
    np.save(folder / "indptr.npy", indptr)
    with pytest.raises(ValueError, match=r"indptr\.npy decreases at row"):
        open_csr(folder)
    np.save(folder / "indptr.npy", np.sort(indptr))
    indices = np.load(folder / "indices.npy")
    indices[0] = 30
    np.save(folder / "indices.npy", indices)
    rows = open_csr(folder)
    with pytest.raises(ValueError, match=r"indices\.npy: entry 0 has column 30, outside 0\.\.29"):
        rows.batch(np.arange(3))
    with pytest.raises(ValueError, match=r"indices\.npy: entry 0 has column 30"):
        rows.observed_summary(np.arange(rows.n_rows))
    with pytest.raises(FileNotFoundError, match="no such folder"):
        open_csr(folder / "nowhere")


def test_fit_refuses_a_nan_value_in_the_folder(folder, monkeypatch):
    """A folder is memory-mapped, not validated value by value when opened: training reads every value first,
    a chunk at a time, and names the file, the entry and its row."""
    from mnar_recsys.data import ondisk

    monkeypatch.setattr(ondisk, "CHUNK", 4)
    data = np.load(folder / "data.npy")
    data[[7, 9]] = [np.nan, np.inf]
    np.save(folder / "data.npy", data)
    rows = open_csr(folder)
    row = int(np.searchsorted(rows.indptr, 7, side="right")) - 1
    model = build_model(ModelConfig(n_features=30, latent_dim=2, embedding_dim=4, code_dim=6))
    with pytest.raises(ValueError, match=rf"{folder / 'data.npy'}: entry 7 \(row {row}, column {rows.indices[7]}\) is "
                                         r"nan, .* the file is corrupt"):
        fit(model, rows, TrainConfig(iterations=2, batch_size=16, device="cpu", progress=False))


def test_the_values_are_checked_a_chunk_at_a_time(folder, monkeypatch):
    """Rows on disk are memory-mapped: fit's checks read their values a chunk at a time rather than holding
    a few bytes per rating, and a failure names the chunk it was found in."""
    from mnar_recsys.models import notmiwae

    monkeypatch.setattr(notmiwae, "CHECK_CHUNK", 16)
    data = np.load(folder / "data.npy")
    data[21] = 7.0
    np.save(folder / "data.npy", data)
    model = build_model(ModelConfig(n_features=30, latent_dim=2, embedding_dim=4, code_dim=6))
    config = TrainConfig(iterations=2, batch_size=16, device="cpu", progress=False)
    with pytest.raises(ValueError, match=r"squashed to \[1\.0, 5\.0\] but 1 observed values lie outside it "
                                         r"\(e\.g\. 7\.0\) among observed entries 16\.\.31"):
        fit(model, open_csr(folder), config)


def test_unsigned_ids_beyond_int64_are_refused(tmp_path):
    matrix = sp.csr_matrix(np.array([[1.0, 0.0], [0.0, 2.0]]))
    with pytest.raises(ValueError, match=r"users ids must fit in int64 or be strings: id 18446744073709551615 "
                                         r"\(position 1\) does not"):
        save_csr(matrix, tmp_path / "m", user_ids=np.array([5, 2**64 - 1], dtype=np.uint64))
    assert not (tmp_path / "m").exists()
    rows = open_csr(save_csr(matrix, tmp_path / "m", user_ids=np.array([5, 2**63 - 1], dtype=np.uint64)))
    np.testing.assert_array_equal(rows.user_ids, [5, 2**63 - 1])


def test_fit_from_disk_equals_fit_in_memory(tmp_path):
    matrix = ratings_matrix(n_rows=80, n_cols=12, density=0.3)
    config = ModelConfig(n_features=12, latent_dim=2, embedding_dim=4, code_dim=6)
    train = TrainConfig(iterations=6, batch_size=16, n_samples=3, seed=3, device="cpu", progress=False,
                        validation_fraction=0.25, validation_every=3)
    models = []
    for data in (matrix, open_csr(save_csr(matrix, tmp_path / "m"))):
        torch.manual_seed(0)
        models.append(build_model(config))
        fit(models[-1], data, train)
    memory, disk = (model.state_dict() for model in models)
    assert all(torch.equal(memory[name], disk[name]) for name in memory)
    assert not torch.equal(memory["missing_model.bias"], build_model(config).state_dict()["missing_model.bias"])


def test_cli_converts_and_reports_errors(tmp_path, capsys):
    source = write(tmp_path / "r.tsv", "u1\ti1\t4\nu2\ti1\t9\n")
    assert main(["convert-ratings", str(source), str(tmp_path / "out"), "--rating-scale", "1,10"]) == 0
    assert "2 users x 1 items, 2 ratings" in capsys.readouterr().out
    assert main(["convert-ratings", str(source), str(tmp_path / "out2")]) == 2
    assert "r.tsv, line 2: rating 9 is outside the rating scale 1..5" in capsys.readouterr().err
    assert main(["convert-ratings", str(source), str(tmp_path / "out")]) == 2
    assert "already exists" in capsys.readouterr().err
