"""One run at a time per results folder: a lock file in `--out`, held with flock while a pipeline writes there.

Two runs writing into one folder would leave one's results.json beside the other's figures. The lock is
the operating system's (``fcntl.flock``), so a run that dies, even by SIGKILL, releases it with its last
file descriptor: a dead run never leaves the folder locked. The file names the holder (pid and host) for
the refusal's message. A run killed while it wrote a file leaves that file's hidden temporary copy
(``atomic_path``): once the lock is held no live run writes there, so those of the run's outputs are removed.
In a data-parallel job only process 0 writes, so only it takes the lock.
"""

from __future__ import annotations

import fcntl
import functools
import inspect
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from mnar_recsys.pipelines.arguments import check_output_folder
from mnar_recsys.training import distributed

LOCK_FILE = ".mnar-recsys.lock"
Function = TypeVar("Function", bound=Callable[..., Any])


class OutputFolderInUse(OSError):
    """Another live run holds the results folder."""


@contextmanager
def hold_output(out: str | Path, outputs: tuple[str, ...] = ()) -> Iterator[Path]:
    """Hold `out` (created if need be) for this run; refuse, naming the holder, when another run holds it.

    Once held, the temporary copies that a killed run left of the files `outputs` are removed. On leaving,
    the lock file is removed, and so is `out` when this run created it and left it empty. Only process 0 of
    a data-parallel job takes the lock; the others pass straight through.
    """
    out = Path(out)
    if not distributed.is_main_process():
        yield out
        return
    check_output_folder(out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    descriptor = _acquire(out / LOCK_FILE, out)
    try:
        for name in outputs:
            for stale in out.glob(f".{name}.*"):
                stale.unlink()
        yield out
    finally:
        # unlinked while still held, so a run that opened it meanwhile finds it replaced and tries again
        (out / LOCK_FILE).unlink(missing_ok=True)
        os.close(descriptor)
        if created and not any(out.iterdir()):
            out.rmdir()


def holds_output(parameter: str, outputs: tuple[str, ...] = ()) -> Callable[[Function], Function]:
    """Decorate a pipeline function so that it runs holding (`hold_output`) the folder its argument
    `parameter` gives: a path, or an object (a run config) with an `out` path."""

    def decorate(function: Function) -> Function:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def holding(*args: Any, **kwargs: Any) -> Any:
            value = signature.bind(*args, **kwargs).arguments[parameter]
            with hold_output(getattr(value, "out", value), outputs):
                return function(*args, **kwargs)

        return holding  # type: ignore[return-value]

    return decorate


def _acquire(path: Path, out: Path) -> int:
    """An open descriptor of `path` holding its exclusive lock, with this process's pid and host written in."""
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(descriptor, 200).decode("utf-8", "replace").strip() or "a process that is starting"
            os.close(descriptor)
            raise OutputFolderInUse(f"--out {out} is in use by another run ({holder}): wait for it to finish, "
                                    "or give another folder") from None
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(descriptor).st_ino:  # not a file its last holder removed as this run opened it
            break
        os.close(descriptor)
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    return descriptor
