"""Measurements in fresh processes, so that each reports its own peak memory; each process tunes the
allocator as the command line does (`mnar_recsys.allocator`) unless asked not to."""

from __future__ import annotations

import multiprocessing as mp
import queue as queues
import resource
import traceback

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
    try:
        if keep_memory:
            keep_freed_memory()
        queue.put((True, function(*args)))
    except BaseException:
        queue.put((False, traceback.format_exc()))


def isolated(function, *args, keep_memory: bool = True) -> dict:
    """Run `function(*args)` in a fresh (spawned) process and return its result; RuntimeError, with the
    child's traceback or exit code, where it raised or died without one (rather than waiting forever)."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_run, args=(queue, function, args, keep_memory))
    process.start()
    try:
        while True:
            try:
                ok, result = queue.get(timeout=1.0)
                break
            except queues.Empty:
                if not process.is_alive() and queue.empty():
                    raise RuntimeError(f"{function.__name__} died in its process (exit code {process.exitcode}) "
                                       "before returning a result") from None
    except BaseException:  # an interrupt, or the child's death: leave no process behind
        process.kill()
        process.join()
        raise
    process.join()
    if not ok:
        raise RuntimeError(f"{function.__name__} failed in its process:\n{result}")
    return result
