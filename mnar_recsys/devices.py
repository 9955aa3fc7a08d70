"""Where tensors live: resolved when a job starts (never at import), so one config runs anywhere."""

from __future__ import annotations

import os

import torch

DEVICES = ("auto", "cpu", "cuda")


def check_device_name(name: str) -> str:
    """The kind of a device name ('auto', 'cpu', 'cuda' or 'cuda:N'); ValueError for any other spelling, so
    a config can refuse it before any work, on a machine with or without a GPU."""
    kind, colon, index = name.partition(":")
    if kind not in DEVICES or (colon and (kind == "auto" or not index.isdigit())):  # "cuda:" too
        raise ValueError(f"device must be one of {DEVICES} (or 'cuda:N'), got {name!r}")
    return kind


def resolve_device(name: str) -> torch.device:
    """'auto' is CUDA when a GPU is visible, else the CPU. Under a distributed launcher each process
    takes the GPU of its local rank (LOCAL_RANK), as torchrun sets it."""
    kind = check_device_name(name)
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asks for CUDA but torch sees no GPU (torch {torch.__version__}, "
                         f"CUDA build: {torch.version.cuda or 'none'}); use --device cpu or auto")
    if ":" in name:
        index, count = int(name.partition(":")[2]), torch.cuda.device_count()
        if index >= count:
            raise ValueError(f"device {name!r} asks for GPU {index} but torch sees {count} "
                             f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''}); use --device cuda or auto")
        return torch.device(name)
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())


def cpu_normal(*shape: int, device: torch.device) -> torch.Tensor:
    """Standard normal noise drawn from the CPU generator, then moved: the same seed gives the same
    draws on CPU and GPU, so results agree across devices up to floating-point rounding."""
    noise = torch.randn(*shape)
    return noise if device.type == "cpu" else noise.to(device, non_blocking=True)
