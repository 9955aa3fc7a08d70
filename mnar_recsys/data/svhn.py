"""SVHN in gray scale for the clipping experiment of the not-MIWAE paper (table 2), and a stand-in.

``load_svhn`` reads the Stanford cropped-digits files (``train_32x32.mat`` / ``test_32x32.mat``, see
``datasets/svhn/README.md``). When they are absent, ``digits_stand_in`` gives scikit-learn's 8x8
digits up-sampled to the same 32x32 gray format so the pipeline runs end to end without downloads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

DATA_CARD = "datasets/svhn/README.md"
#: ITU-R BT.601 luma weights for R, G, B.
LUMA_WEIGHTS = np.array([0.299, 0.587, 0.114])
#: The paper's clipping process: P(observed | x) = sigmoid(W * (x - B)).
W = -50.0
B = 0.75
SPLITS = ("train", "test")


def load_svhn(data_dir: str | Path, split: str = "train") -> np.ndarray:
    """Load ``{split}_32x32.mat`` from ``data_dir`` as gray-scale images in [0, 1], float32 (N, 32, 32).

    The file holds ``X`` (32 x 32 x 3 x N, uint8 RGB) and ``y``; only ``X`` is used.
    """
    from scipy.io import loadmat

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    path = Path(data_dir) / f"{split}_32x32.mat"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; see {DATA_CARD} for how to obtain the SVHN files")
    try:
        contents = loadmat(path)
    except Exception as err:  # scipy raises several types for files that are not MATLAB v5
        raise ValueError(f"{path}: not a readable MATLAB .mat file ({err})") from err
    if "X" not in contents:
        raise ValueError(f"{path}: no variable 'X' (found {sorted(k for k in contents if not k.startswith('__'))})")
    X = contents["X"]
    if X.ndim != 4 or X.shape[:3] != (32, 32, 3):
        raise ValueError(f"{path}: 'X' has shape {X.shape}, expected (32, 32, 3, N)")
    if X.dtype != np.uint8:
        raise ValueError(f"{path}: 'X' has dtype {X.dtype}, expected uint8")
    gray = np.tensordot(X.astype(np.float64), LUMA_WEIGHTS, axes=([2], [0])) / 255.0  # (32, 32, N)
    return np.ascontiguousarray(gray.transpose(2, 0, 1), dtype=np.float32)


def digits_stand_in(n: int | None = None, seed: int = 0) -> np.ndarray:
    """scikit-learn's 8x8 digits scaled to [0, 1] and bilinearly up-sampled to float32 (N, 32, 32).

    ``n`` picks a random subset of that size (without replacement, by ``seed``); None keeps all 1797.
    """
    from scipy.ndimage import zoom
    from sklearn.datasets import load_digits

    images = load_digits().images / 16.0
    if n is not None:
        if not 0 < n <= len(images):
            raise ValueError(f"n must be in 1..{len(images)}, got {n}")
        images = images[np.random.default_rng(seed).choice(len(images), size=n, replace=False)]
    big = zoom(images, (1, 4, 4), order=1)
    return np.clip(big, 0.0, 1.0).astype(np.float32)  # clip: guards interpolation round-off


def clipping_probability(images: np.ndarray) -> np.ndarray:
    """P(pixel observed) = sigmoid(W * (x - B)): bright pixels (above about B) go missing."""
    z = W * (np.asarray(images, dtype=np.float64) - B)
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def clipping_mask(images: np.ndarray, rng: int | np.random.Generator | None = None) -> np.ndarray:
    """Draw the paper's clipping mask (1 = observed) of ``images``' shape, uint8.

    Each pixel is observed independently with probability sigmoid(W * (x - B)), W = -50, B = 0.75;
    the missingness conditions on the pixel's own value (self-masking MNAR).
    """
    images = np.asarray(images)
    if not np.isfinite(images).all():
        raise ValueError("images contain NaN or infinite values")
    rng = np.random.default_rng(rng)
    return (rng.random(images.shape) < clipping_probability(images)).astype(np.uint8)
