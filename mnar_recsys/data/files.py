"""File checks shared by the data-set loaders: presence, sha256 fingerprints, text that is not UTF-8."""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class ChecksumWarning(UserWarning):
    """A data file differs from the published copy, so results may not compare with reported ones."""


def require_file(path: Path, card: str) -> Path:
    """Return ``path`` if it is a file; else raise FileNotFoundError pointing at the data card, or, when the
    path is there but a folder (IsADirectoryError) or another non-file (OSError), one saying so."""
    if path.exists() and not path.is_file():
        error, kind = (IsADirectoryError, "a folder") if path.is_dir() else (OSError, "not a regular file")
        raise error(f"data file {path} is {kind}; put the data file itself there (see {card})")
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


# the first bytes of compressed files, which read as text fail on their first byte
_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"PK\x03\x04": "zip",
               b"\x28\xb5\x2f\xfd": "zstd"}


@contextmanager
def utf8_errors_named(path: Path) -> Iterator[None]:
    """Turn a UnicodeDecodeError while reading ``path`` as text into a ValueError naming the first bad line
    (the decoder's own message gives a byte offset, often within an internal buffer, and no file), or saying
    that the file is compressed."""
    try:
        yield
    except UnicodeDecodeError:
        with open(path, "rb") as file:
            start = file.read(8)
            kind = next((name for magic, name in _COMPRESSED.items() if start.startswith(magic)), None)
            if kind is not None:
                raise ValueError(f"{path} is {kind}-compressed, not text; decompress it first") from None
            file.seek(0)
            for number, line in enumerate(file, start=1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise ValueError(f"{path}, line {number}: byte 0x{line[err.start]:02x} at column {err.start + 1} "
                                     "is not UTF-8 text; re-save the file as UTF-8") from None
        raise
