"""Kernels built by torch.compile where a C++ compiler is at hand, and eager code where it is not."""

from __future__ import annotations

import warnings

import torch

_RECOMPILE_LIMIT = 64


class Compiled:
    """A kernel compiled by torch.compile; the quadrature rule and whether gradients are needed are keyword
    constants, which the compiled code specialises on, so each combination (and each new input layout)
    compiles once. Dynamo stops recompiling a function after 8 versions and runs it eagerly from then on, a
    few times slower than the node loop; a process that fits several models (ranks, feature counts, shapes
    with a dimension of 1, grad or not) can need more, so the limit is raised for these calls. The function
    itself is compiled rather than a partial of it, which would share that limit with every other partial.
    Calls run without autograd, which the callers do by hand, and return None from the one on where
    compiling failed (no C++ compiler), after one warning; the caller then runs eagerly."""

    def __init__(self, function):
        self.function = function
        self.compiled = None  # built at the first call: torch.compile's machinery takes seconds to import
        self.eager = False

    def __call__(self, *tensors, **constants):
        if self.eager:
            return None
        if self.compiled is None:
            self.compiled = torch.compile(self.function, dynamic=True)
        try:
            with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT):
                return self.compiled(*tensors, **constants)
        except torch._dynamo.exc.BackendCompilerFailed as error:
            warnings.warn(f"torch.compile could not build the quadrature kernel ({str(error).splitlines()[0]}); "
                          "it runs eagerly from now on, 2 to 3 times slower", RuntimeWarning, stacklevel=3)
            self.eager = True
            return None

