"""The dense layers' activations by name, tanh as a rational function in compiled passes.

PyTorch's CPU tanh (MKL's vector tanh in a build with MKL) took 0.4 ns an element on one thread of an Intel
Xeon, about a copy's time, and 3 to 5 ns on AMD machines, where a compiled kernel of the rational tanh
(`tanh_rational`: multiply-adds and one division, no exponential) takes about 0.8, and 2 sigmoid(2x) - 1 about
1.2 (docs/performance.md). An importance pass of the UCI protocol spent 40% of its time in tanh, so where no
gradient is taken on the CPU (`Compiled` decides when to compile) and torch's tanh is not the fast one, the layer
runs that kernel; `fit` keeps torch's tanh. The stacked fit's compiled step has the rational tanh too, with a
backward that reads the output rather than recomputing the forward.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from torch import nn

from mnar_recsys.models.integrated.compiled import Compiled

#: tanh(x) ~ x P(x^2) / Q(x^2) on |x| <= 9 (clamped beyond, where float32's tanh is 1 to within 6e-8): a rational
#: least-squares fit to tanh on [0, 9], reweighted towards the minimax error (Lawson), whose error is 2e-8 in
#: exact arithmetic and 4.2e-7 evaluated in float32 (2 sigmoid(2x) - 1's is 1.8e-7, torch's 3e-8)
_TANH_CLAMP = 9.0
_TANH_NUMERATOR = (0.9999999063345363, 0.13373178465387925, 0.0034865595314154526, 2.047148401766426e-05,
                   1.3183789004944657e-08)
_TANH_DENOMINATOR = (1.0, 0.4670647531036473, 0.0258418928603701, 0.00032713497102564295, 7.702475677377751e-07)


def _horner(coefficients: tuple[float, ...], u: torch.Tensor) -> torch.Tensor:
    total = coefficients[-1]
    for coefficient in coefficients[-2::-1]:
        total = total * u + coefficient
    return total


class _RationalTanh(torch.autograd.Function):
    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        x = x.clamp(-_TANH_CLAMP, _TANH_CLAMP)
        u = x * x
        # rounding takes the ratio up to 1e-7 past 1 near the clamp
        return (x * _horner(_TANH_NUMERATOR, u) / _horner(_TANH_DENOMINATOR, u)).clamp(-1.0, 1.0)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y)


def tanh_rational(x: torch.Tensor) -> torch.Tensor:
    """tanh by a rational function, within 4.2e-7 of it in float32, its derivative taken as 1 - tanh^2 of the
    output: for compiled graphs, where its dozen vector multiply-adds and one division beat an exponential, and
    its backward needs none. Eagerly each of those is a pass over memory: use torch.tanh there."""
    return _RationalTanh.apply(x)


_compiled_tanh = Compiled(tanh_rational)


@functools.cache
def torch_tanh_is_fast() -> bool:
    """Whether torch's CPU tanh is MKL's on an Intel CPU, where it beat a compiled kernel (2 sigmoid(2x) - 1;
    the rational one was not measured there)."""
    if not torch.backends.mkl.is_available():
        return False
    try:
        return "GenuineIntel" in Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: the vendor is unknown, and the compiled form is the safe choice
        return False


class Tanh(nn.Tanh):
    """nn.Tanh, by the compiled rational tanh in passes without gradients on the CPU where torch's tanh is slow."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        needs_grad = torch.is_grad_enabled() and x.requires_grad
        if x.device.type == "cpu" and not needs_grad and not torch_tanh_is_fast():
            out = _compiled_tanh(x)
            if out is not None:
                return out
        return torch.tanh(x)


ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": Tanh}
