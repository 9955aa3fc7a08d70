"""The dense layers' activations by name, tanh written as 2 sigmoid(2x) - 1 where that is faster.

PyTorch's CPU tanh (MKL's vector tanh in a build with MKL) took 0.4 ns an element on one thread of an Intel
Xeon, about a copy's time, and 3 to 5 ns on an earlier machine; a compiled kernel of the sigmoid form takes 0.7 to
0.8 on both (docs/performance.md), equal to tanh within 2e-7. An importance pass of the UCI protocol
spent 40% of its time in tanh, so where no gradient is taken on the CPU (`Compiled` decides when to compile)
and torch's tanh is not the fast one, the layer runs that kernel; training keeps torch's tanh, and the
stacked fit has the sigmoid form in its own graph.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from torch import nn

from mnar_recsys.models.integrated.compiled import Compiled


def tanh_from_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """tanh(x) = 2 sigmoid(2x) - 1, which a compiled CPU kernel computes several times faster than MKL's generic
    tanh."""
    return torch.sigmoid(x * 2) * 2 - 1


_compiled_tanh = Compiled(tanh_from_sigmoid)


@functools.cache
def torch_tanh_is_fast() -> bool:
    """Whether torch's CPU tanh is MKL's on an Intel CPU, where it was faster than the compiled sigmoid form."""
    if not torch.backends.mkl.is_available():
        return False
    try:
        return "GenuineIntel" in Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: the vendor is unknown, and the compiled form is the safe choice
        return False


class Tanh(nn.Tanh):
    """nn.Tanh, by the compiled sigmoid form in passes without gradients on the CPU where torch's tanh is slow."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        needs_grad = torch.is_grad_enabled() and x.requires_grad
        if x.device.type == "cpu" and not needs_grad and not torch_tanh_is_fast():
            out = _compiled_tanh(x)
            if out is not None:
                return out
        return torch.tanh(x)


ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": Tanh}
