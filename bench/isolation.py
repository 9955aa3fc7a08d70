"""Measurements in fresh processes, so that each reports its own peak memory; each process tunes the
allocator as the command line does (`mnar_recsys.allocator`) unless asked not to."""

from __future__ import annotations

import multiprocessing as mp
import resource

from mnar_recsys.allocator import keep_freed_memory


def peak_rss_mib() -> float:
    """This process's peak resident memory. Linux's ru_maxrss carries the peak of the parent across the
    exec that starts a child, so read the child's own VmHWM from /proc where there is one."""
    try:
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run(queue, function, args, keep_memory):
    if keep_memory:
        keep_freed_memory()
    queue.put(function(*args))


def isolated(function, *args, keep_memory: bool = True) -> dict:
    """Run `function(*args)` in a fresh (spawned) process and return its result."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_run, args=(queue, function, args, keep_memory))
    process.start()
    result = queue.get()
    process.join()
    return result
