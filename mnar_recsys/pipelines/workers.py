"""A pipeline's runs shared out to worker processes (`--jobs N`), or run one after another here.

Workers are spawned (no forked torch state), run torch on one thread each and tune glibc's allocator as
the command line does: small models gain little from a second thread and much from a second core.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, TypeVar

import torch

from mnar_recsys.allocator import keep_freed_memory
from mnar_recsys.denormals import flush_denormals

Task = TypeVar("Task", bound=tuple)
WORKER_THREADS = 1  # torch threads in each worker process


def run_tasks(function: Callable[..., Any], tasks: Sequence[Task], jobs: int) -> Iterator[tuple[Task, Any]]:
    """Yield (task, function(*task)) for every task: in order here when `jobs` is 1, else as they finish
    in `jobs` workers. `function` and the tasks must pickle. After a failure no further task starts; with
    workers, the tasks already running finish and are yielded (an hour's training is not thrown away),
    then the failure is raised."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if jobs == 1:
        for task in tasks:
            yield task, function(*task)
        return
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker)
    waiting, running = iter(tasks), {}
    failure: BaseException | None = None

    def start_next() -> None:
        # one task a free worker: the pool would queue more, and a queued task can no longer be cancelled
        task = next(waiting, None)
        if task is not None:
            running[pool.submit(function, *task)] = task

    try:
        for _ in range(jobs):
            start_next()
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            finished = [(future, running.pop(future)) for future in done]
            # every failure of the batch first: a success beside one must not start the next task
            for future, _ in finished:
                if future.exception() is not None and failure is None:
                    failure = future.exception()
                    print(f"a run failed ({failure!r}); no other starts, and the {len(running)} running "
                          "finish first", file=sys.stderr, flush=True)
            for future, task in finished:
                if future.exception() is None:
                    yield task, future.result()
                    # after the caller is done with the result: if it raises, no new task holds up the exit
                    if failure is None:
                        start_next()
    finally:
        pool.shutdown(cancel_futures=True)
    if failure is not None:
        raise failure


def threads_per_run(jobs: int) -> int:
    """The CPU threads each run computes with: this process's own, or one in a worker (a seed repeats a run
    bit for bit at a fixed number of threads, so the results record it)."""
    return torch.get_num_threads() if jobs == 1 else WORKER_THREADS


def _start_worker() -> None:
    flush_denormals()  # before torch starts its threads: they inherit it
    torch.set_num_threads(WORKER_THREADS)
    keep_freed_memory()
