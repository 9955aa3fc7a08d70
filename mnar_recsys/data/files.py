"""File checks shared by the data-set loaders: presence and sha256 fingerprints."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path


class ChecksumWarning(UserWarning):
    """A data file differs from the published copy, so results may not compare with reported ones."""


def require_file(path: Path, card: str) -> Path:
    """Return ``path`` if it is a file, else raise FileNotFoundError pointing at the data card."""
    if not path.is_file():
        raise FileNotFoundError(f"missing data file {path}; see {card} for where to get it and where to put it")
    return path


def sha256_of(path: Path) -> str:
    """Hex sha256 digest of a file, read in chunks so large files need little memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_sha256(path: Path, expected: str, card: str) -> str:
    """Return the file's sha256; warn (``ChecksumWarning``) when it is not ``expected``."""
    actual = sha256_of(path)
    if actual != expected:
        warnings.warn(
            f"{path}: sha256 {actual} differs from the published {expected} (see {card}); "
            "the file may be modified or a different version",
            ChecksumWarning,
            stacklevel=3,
        )
    return actual
