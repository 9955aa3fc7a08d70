"""Data-parallel training with torch.distributed: process groups, ranks and each rank's share of a batch.

A job launched by `torchrun --nproc_per_node N ...` (or any launcher that sets RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT) calls :func:`initialise` once; `fit` then wraps the model in
DistributedDataParallel and every rank trains on its own shards of each global batch. Errors that
one rank meets before training are shared with all ranks (:func:`agree`), so no rank is left
waiting in a collective for a peer that has already failed; a job run inside :func:`process_group`
leaves the group at once when any rank fails anywhere else, which stops its peers (see there).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from mnar_recsys.devices import resolve_device

BACKENDS = ("auto", "gloo", "nccl")


def launched() -> bool:
    """True in a process started by a distributed launcher with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def choose_backend(backend: str, device: torch.device) -> str:
    """'auto' is NCCL for GPU training and gloo on the CPU; an explicit choice is checked here."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    available = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available() and torch.cuda.is_available()}
    if not available[backend]:
        raise ValueError(f"the {backend} backend is not available in this torch build ({torch.__version__}) "
                         f"on this machine{'' if torch.cuda.is_available() else ' (no GPU)'}; "
                         f"use backend 'gloo' or 'auto'")
    if backend == "nccl" and device.type != "cuda":
        raise ValueError("the nccl backend needs the model on a GPU: use --device cuda or backend 'gloo'")
    return backend


def initialise(device: str = "auto", backend: str = "auto", timeout_minutes: float = 30.0) -> torch.device:
    """Join the process group the launcher describes (if not yet joined); return this rank's device."""
    resolved = resolve_device(device)
    if not dist.is_initialized():
        chosen = choose_backend(backend, resolved)
        if resolved.type == "cuda":
            torch.cuda.set_device(resolved)
        dist.init_process_group(chosen, timeout=timedelta(minutes=timeout_minutes))
    return resolved


def shutdown() -> None:
    """Leave the group once every rank is done: a rank that tears its connections down while a peer
    still works (process 0 scoring and writing) can make the peer's transport abort."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


@contextmanager
def process_group(device: str = "auto", backend: str = "auto") -> Iterator[torch.device]:
    """Join the group for a job (see :func:`initialise`) and leave it together when the job ends.

    When this rank fails, it leaves at once instead of waiting at the final barrier and re-raises: its
    connections close, so a peer blocked in a collective (a barrier, DDP's gradient all-reduce) fails
    within moments rather than at the group's timeout, and a launcher such as torchrun stops the others as
    soon as this process exits with an error. Work only one rank does (process 0 writing results) may
    therefore fail without a hang, whatever its peers are doing.
    """
    resolved = initialise(device, backend)
    try:
        yield resolved
    except BaseException:
        if dist.is_initialized():
            dist.destroy_process_group()
        raise
    shutdown()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def backend_in_use() -> str | None:
    """The process group's backend (its reductions may round differently), None outside one."""
    return dist.get_backend() if dist.is_initialized() else None


def is_main_process() -> bool:
    """Only this process writes checkpoints, results and progress bars."""
    return rank() == 0


def agree(error: BaseException | None) -> None:
    """Collective: raise on every rank if any rank met an error (the failing rank re-raises its own)."""
    if world_size() == 1:
        if error is not None:
            raise error
        return
    failed = torch.tensor([0 if error is None else 1], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        failed = failed.cuda()
    dist.all_reduce(failed)
    if error is not None:
        raise error
    if int(failed.item()):
        raise RuntimeError(f"{int(failed.item())} other rank(s) failed before training; rank {rank()} stops too")


def sum_across_ranks(value: float, device: torch.device) -> float:
    """The sum of a float over all ranks (the value itself in a single process)."""
    if world_size() == 1:
        return value
    total = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return float(total.item())


def shards_of(batch: np.ndarray, n_shards: int) -> list[np.ndarray]:
    """A global batch cut into `n_shards` contiguous shards of nearly equal size."""
    return np.array_split(batch, n_shards)


def my_shards(n_shards: int) -> range:
    """The shard numbers this rank computes: r, r + W, r + 2W, ..."""
    return range(rank(), n_shards, world_size())
