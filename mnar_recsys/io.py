"""Files written atomically, and the provenance that makes a result reproducible: the I/O every layer shares."""

from __future__ import annotations

import json
import math
import os
import platform
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import scipy
import sklearn
import torch

from mnar_recsys import __version__


def provenance() -> dict[str, Any]:
    """Package version, git commit and whether tracked files differ from it (when run from a checkout), library
    versions and machine."""
    commit, dirty = git_state(Path(__file__).resolve().parents[1])
    # scikit-learn and scipy too: the baselines' numbers can move with their versions
    return {"package_version": __version__, "commit": commit, "dirty": dirty, "torch": torch.__version__,
            "numpy": np.__version__, "scipy": scipy.__version__, "scikit-learn": sklearn.__version__,
            "python": platform.python_version(), "machine": platform.machine()}


def git_state(root: Path) -> tuple[str | None, bool | None]:
    """(HEAD's commit, whether tracked files differ from it) of the checkout whose top folder is `root`; (None,
    None) otherwise, e.g. for a package installed into a virtual environment that sits in another project's
    checkout, whose commit says nothing about this code. Untracked files do not count: results folders and
    data often sit in a checkout untracked."""
    try:
        if Path(_git(root, "rev-parse", "--show-toplevel")).resolve() != root.resolve():
            return None, None
        commit = _git(root, "rev-parse", "HEAD") or None
        return commit, bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None, None


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5,
                          check=True).stdout.strip()


@contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path beside `path` to write to; on success it replaces `path` in one step, on
    failure it is removed, so no half-written file remains. `suffix` keeps writers that go by the
    extension (numpy, matplotlib) happy."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0o600 would stay on the renamed file
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask


@contextmanager
def atomic_directory(directory: str | Path) -> Iterator[Path]:
    """Yield a new empty folder beside `directory` to fill; on success it is renamed to `directory` in one
    step, on failure it is removed, so a reader never sees a half-written folder. An existing `directory`
    is an error rather than replaced: a folder cannot be swapped in atomically, and a reader may be using it."""
    directory = Path(directory)
    if directory.exists():
        raise FileExistsError(f"{directory} already exists; remove it or choose another output folder")
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.parent / f".{directory.name}.{secrets.token_hex(4)}.tmp"
    tmp.mkdir()  # not mkdtemp: its 0o700 would stay on the renamed folder; mkdir honours the umask
    try:
        yield tmp
        os.rename(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_previous(out: str | Path, names: tuple[str, ...]) -> None:
    """Delete an earlier run's files `names` from `out` before a run that rewrites them: a run that writes its
    results as it goes, or that makes fewer figures, would otherwise leave them beside its own."""
    for name in names:
        (Path(out) / name).unlink(missing_ok=True)


def write_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN or infinity; Python would write a bare NaN that other readers refuse
    return value


def write_json(path: str | Path, payload: Any) -> Path:
    """Atomically write JSON (NumPy scalars and arrays, tuples and paths converted; NaN and infinities, e.g. an
    NDCG that no user qualified for, written as null)."""
    return write_atomic(path, json.dumps(_jsonable(payload), indent=2, allow_nan=False) + "\n")


def save_figure(figure: Any, path: str | Path, dpi: int = 120) -> Path:
    """Atomically save a matplotlib figure as PNG."""
    with atomic_path(path, suffix=".png") as tmp:
        figure.savefig(tmp, dpi=dpi, bbox_inches="tight")
    return Path(path)
