"""SVHN .mat reading (on small files made with scipy.io.savemat), the digits stand-in, clipping."""

import numpy as np
import pytest
from scipy.io import savemat

from mnar_recsys.data import svhn


def _save(path, **arrays):
    savemat(path, arrays)


def test_load_gray_scale(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.integers(0, 256, size=(32, 32, 3, 5), dtype=np.uint8)
    _save(tmp_path / "test_32x32.mat", X=X, y=np.arange(5).reshape(-1, 1))
    images = svhn.load_svhn(tmp_path, "test")
    assert images.shape == (5, 32, 32) and images.dtype == np.float32
    expected = (0.299 * X[:, :, 0] + 0.587 * X[:, :, 1] + 0.114 * X[:, :, 2]) / 255.0
    np.testing.assert_allclose(images, expected.transpose(2, 0, 1), rtol=1e-6)
    assert 0.0 <= images.min() and images.max() <= 1.0


def test_white_pixel_is_one(tmp_path):
    _save(tmp_path / "train_32x32.mat", X=np.full((32, 32, 3, 1), 255, np.uint8))
    np.testing.assert_allclose(svhn.load_svhn(tmp_path), 1.0, rtol=1e-6)


def test_bad_files(tmp_path):
    path = tmp_path / "train_32x32.mat"
    _save(path, y=np.zeros((3, 1)))
    with pytest.raises(ValueError, match="no variable 'X'"):
        svhn.load_svhn(tmp_path)
    _save(path, X=np.zeros((28, 28, 3, 2), np.uint8))
    with pytest.raises(ValueError, match=r"shape \(28, 28, 3, 2\), expected \(32, 32, 3, N\)"):
        svhn.load_svhn(tmp_path)
    _save(path, X=np.zeros((32, 32, 3, 2), np.float64))
    with pytest.raises(ValueError, match="dtype float64, expected uint8"):
        svhn.load_svhn(tmp_path)
    path.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="not a readable MATLAB"):
        svhn.load_svhn(tmp_path)
    with pytest.raises(FileNotFoundError, match="test_32x32.mat.*datasets/svhn/README.md"):
        svhn.load_svhn(tmp_path, "test")
    with pytest.raises(ValueError, match="split must be one of"):
        svhn.load_svhn(tmp_path, "extra")


def test_digits_stand_in():
    images = svhn.digits_stand_in()
    assert images.shape == (1797, 32, 32) and images.dtype == np.float32
    assert images.min() >= 0.0 and images.max() == pytest.approx(1.0)
    subset = svhn.digits_stand_in(20, seed=3)
    assert subset.shape == (20, 32, 32)
    np.testing.assert_array_equal(subset, svhn.digits_stand_in(20, seed=3))
    with pytest.raises(ValueError, match="n must be in"):
        svhn.digits_stand_in(0)


def test_clipping_mask():
    assert (svhn.W, svhn.B) == (-50.0, 0.75)
    images = np.concatenate([np.zeros((1, 100, 100)), np.ones((1, 100, 100)), np.full((1, 100, 100), 0.75)])
    mask = svhn.clipping_mask(images, np.random.default_rng(0))
    assert mask.shape == images.shape and mask.dtype == np.uint8
    assert mask[0].all() and not mask[1].any()
    assert mask[2].mean() == pytest.approx(0.5, abs=0.03)
    np.testing.assert_array_equal(mask, svhn.clipping_mask(images, 0))
    with pytest.raises(ValueError, match="NaN"):
        svhn.clipping_mask(np.array([np.nan]), 0)
