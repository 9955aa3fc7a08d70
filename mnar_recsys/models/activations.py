"""The dense layers' activations by name, tanh written as 2 sigmoid(2x) - 1.

PyTorch's CPU tanh takes 3 to 5 ns an element on one thread; a compiled kernel of the sigmoid form takes
0.7 (docs/performance.md), equal to tanh within 2e-7. An importance pass of the UCI protocol spent 40% of
its time in tanh, so where no gradient is taken on the CPU (`Compiled` decides when to compile) the layer
runs that kernel; training keeps torch's tanh, and the stacked fit has the sigmoid form in its own graph.
"""

from __future__ import annotations

import torch
from torch import nn

from mnar_recsys.models.integrated.compiled import Compiled


def tanh_from_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """tanh(x) = 2 sigmoid(2x) - 1, which a compiled CPU kernel computes several times faster than tanh."""
    return torch.sigmoid(x * 2) * 2 - 1


_compiled_tanh = Compiled(tanh_from_sigmoid)


class Tanh(nn.Tanh):
    """nn.Tanh, by the compiled sigmoid form in passes without gradients on the CPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and not (torch.is_grad_enabled() and x.requires_grad):
            out = _compiled_tanh(x)
            if out is not None:
                return out
        return torch.tanh(x)


ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": Tanh}
