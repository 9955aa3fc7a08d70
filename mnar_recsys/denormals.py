"""Denormal floats flushed to zero on the CPU while a model trains.

A training step makes denormal floats (magnitudes below 1.2e-38) where a sigmoid saturates: in the backward of
the missing term's quadrature, and of tanh where it is computed through a sigmoid. One denormal operand slows each
multiply-add of a matrix product that reads it by a microcode assist, so a few of them in a layer's gradient
slow its backward products several times over. Flushing them to zero changes no value above 1.2e-38.

The setting (`torch.set_flush_denormal`) belongs to a CPU thread, and threads inherit it from the thread that
starts them: `denormals_flushed` sets it for the calling thread while a fit runs, which covers a one-thread
job, and the command line calls `flush_denormals` before torch starts its worker threads, which covers the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

_DENORMAL = 1e-39


def flushing() -> bool:
    """Whether the calling thread flushes denormal floats to zero (float32 rounds 1e-39 to zero then)."""
    return torch.tensor([_DENORMAL]).item() == 0.0


def flush_denormals() -> bool:
    """Flush denormal floats to zero on this thread and on the threads it starts later; False where the CPU
    cannot (torch then changes nothing)."""
    return torch.set_flush_denormal(True)


@contextmanager
def denormals_flushed() -> Iterator[None]:
    """Flush denormal floats to zero on the calling thread within the block, then restore its setting."""
    was_flushing = flushing()
    flush_denormals()
    try:
        yield
    finally:
        if not was_flushing:
            torch.set_flush_denormal(False)
