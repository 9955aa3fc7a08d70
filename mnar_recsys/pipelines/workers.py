"""A pipeline's runs shared out to worker processes (`--jobs N`), or run one after another here.

Workers are spawned (no forked torch state), run torch on one thread each and tune glibc's allocator as
the command line does: small models gain little from a second thread and much from a second core.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

import torch

from mnar_recsys.allocator import keep_freed_memory

Task = TypeVar("Task", bound=tuple)


def run_tasks(function: Callable[..., Any], tasks: Sequence[Task], jobs: int) -> Iterator[tuple[Task, Any]]:
    """Yield (task, function(*task)) for every task: in order here when `jobs` is 1, else as they finish
    in `jobs` workers. `function` and the tasks must pickle; after a failure no further task starts."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if jobs == 1:
        for task in tasks:
            yield task, function(*task)
        return
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker)
    try:
        futures = {pool.submit(function, *task): task for task in tasks}
        for future in as_completed(futures):
            yield futures[future], future.result()
    finally:
        pool.shutdown(cancel_futures=True)


def _start_worker() -> None:
    torch.set_num_threads(1)
    keep_freed_memory()
