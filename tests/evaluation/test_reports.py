"""Results files: written whole or not at all, readable as the umask says, strict JSON."""

import json
import os

import numpy as np
import pytest

from mnar_recsys.io import atomic_path, write_json


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = write_json(tmp_path / "results.json", {"mse": 1.0})
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_text('{"mse": ')
        raise RuntimeError("the run failed half way")
    assert json.loads(path.read_text()) == {"mse": 1.0}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_files_get_the_umasks_mode_not_the_temporary_files(tmp_path):
    old = os.umask(0o022)
    try:
        path = write_json(tmp_path / "results.json", {})
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644  # mkstemp alone gives 0o600: unreadable to a colleague


def test_nan_and_infinity_are_written_as_null():
    """Python's json writes a bare NaN, which JSON readers in other languages refuse."""
    payload = {"ndcg@5": float("nan"), "scores": np.array([1.5, np.inf]), "k": np.float32(-np.inf)}
    path = write_json(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"r{os.getpid()}.json"), payload)
    try:
        text = path.read_text()
        assert "NaN" not in text and "Infinity" not in text
        assert json.loads(text) == {"ndcg@5": None, "scores": [1.5, None], "k": None}
    finally:
        path.unlink()
