"""Kernels built by torch.compile where a C++ compiler is at hand, and eager code where it is not.

Compiling costs a process seconds at its first call (docs/performance.md): importing torch.compile's
machinery, tracing, building or loading the kernels, and inductor's probe of the CPU's vector instruction
sets, one child Python process per set. So the built kernels are kept across processes in a cache under the
user's cache folder (TORCHINDUCTOR_CACHE_DIR, where the user has not set it), the probe's result is kept
there too once it passed for every set the CPU reports (later processes then skip it), and
MNAR_RECSYS_COMPILE says when to compile: '1' always, '0' never (eager code, 2 to 3 times slower
kernels), 'auto' (the default) not inside a job that declares itself short (`job`), where the build would
cost more than it saves.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

_RECOMPILE_LIMIT = 64
COMPILE_VARIABLE = "MNAR_RECSYS_COMPILE"
COMPILE_MODES = ("0", "1", "auto")
#: in 'auto' mode, jobs of fewer steps than this run the kernels eagerly: about where what compiling saves a
#: training step at the Yahoo! R3 shape repays a cold build (docs/performance.md)
SHORT_JOB_STEPS = 1_000
_job_steps: list[int] = []  # the steps of the jobs now running, innermost last


def compile_mode() -> str:
    """MNAR_RECSYS_COMPILE's value ('auto' when unset); ValueError for any other."""
    mode = os.environ.get(COMPILE_VARIABLE, "auto").strip().lower() or "auto"
    if mode not in COMPILE_MODES:
        raise ValueError(f"{COMPILE_VARIABLE} must be one of {COMPILE_MODES}, got {os.environ[COMPILE_VARIABLE]!r}")
    return mode


@contextmanager
def job(steps: int) -> Iterator[None]:
    """Declare a job of `steps` calls of the kernels (a fit's iterations) for the block: in 'auto' mode a
    short one runs them eagerly. Jobs nest; the innermost decides."""
    _job_steps.append(steps)
    try:
        yield
    finally:
        _job_steps.pop()


def compiling() -> bool:
    """Whether a kernel called now is to be compiled, by MNAR_RECSYS_COMPILE and the job running."""
    mode = compile_mode()
    if mode != "auto":
        return mode == "1"
    return not _job_steps or _job_steps[-1] >= SHORT_JOB_STEPS


def cache_folder() -> Path:
    """Where the built kernels are kept: TORCHINDUCTOR_CACHE_DIR, set to a folder under the user's cache
    (XDG_CACHE_HOME, or ~/.cache) where the user has not set it."""
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(base, "mnar_recsys", "torchinductor")
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


# at import, not at the first compile: importing torch._dynamo (torch.optim's optimisers do) fixes inductor's
# folder from the environment as it is then
cache_folder()


class Compiled:
    """A kernel compiled by torch.compile; the quadrature rule and whether gradients are needed are keyword
    constants, which the compiled code specialises on, so each combination (and each new input layout)
    compiles once. Dynamo stops recompiling a function after 8 versions and runs it eagerly from then on, a
    few times slower than the node loop; a process that fits several models (ranks, feature counts, shapes
    with a dimension of 1, grad or not) can need more, so the limit is raised for these calls. The function
    itself is compiled rather than a partial of it, which would share that limit with every other partial.
    Float constants (the quadrature's nodes and weights) are specialised on: with dynamic shapes dynamo would
    otherwise pass them to the kernel as doubles, converted at every vector of entries, which took the fused
    quadrature 1.6 to 1.9 times as long (docs/performance.md).
    Calls run without autograd, which the callers do by hand, unless `differentiable`, where torch.compile
    builds the backward pass too; `dynamic=False` specialises on the shapes (a fit's, which do not change).
    A call returns None where the caller is to run eagerly: where `compiling` says so, and from the call on
    where compiling failed (no C++ compiler), after one warning."""

    def __init__(self, function, differentiable: bool = False, dynamic: bool = True):
        self.function = function
        self.differentiable, self.dynamic = differentiable, dynamic
        self.compiled = None  # built at the first call: torch.compile's machinery takes seconds to import
        self.eager = False

    def __call__(self, *tensors, **constants):
        # by the job alone, not by whether this process built the kernel before: a fit's numbers must not depend
        # on what ran before it (a worker process and the main one give the same records)
        if self.eager or not compiling():
            return None
        if self.compiled is None:
            _settle_probe()
            self.compiled = torch.compile(self.function, dynamic=self.dynamic)
        try:
            with (nullcontext() if self.differentiable else torch.no_grad()), \
                    torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT, specialize_float=True):
                return self.compiled(*tensors, **constants)
        except torch._dynamo.exc.BackendCompilerFailed as error:
            warnings.warn(f"torch.compile could not build {self.function.__name__} ({str(error).splitlines()[0]}); "
                          "it runs eagerly from now on, 2 to 3 times slower", RuntimeWarning, stacklevel=3)
            self.eager = True
            return None


def _probe_marker() -> Path | None:
    """The file that says inductor's vector-ISA probe passed for every set this CPU reports, keyed by what
    the probe's outcome depends on (torch, the interpreter, the CPU's flags, the C++ compiler); None where
    the probe cannot be keyed (not x86 Linux, or torch internals that moved)."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return None
    try:
        from torch._inductor import cpu_vec_isa
        from torch._inductor.cpp_builder import get_cpp_compiler
        found = shutil.which(get_cpp_compiler()) or get_cpp_compiler()
        stat = os.stat(found) if os.path.isfile(found) else None
        flags = sorted(cpu_vec_isa.x86_isa_checker())
    except (ImportError, AttributeError, OSError, RuntimeError):
        return None
    key = repr((torch.__version__, sys.executable, flags, found, stat and (stat.st_size, stat.st_mtime_ns),
                os.environ.get("CXX"), os.environ.get("ATEN_CPU_CAPABILITY")))
    return cache_folder() / "mnar_recsys" / f"vec-isa-{hashlib.sha256(key.encode()).hexdigest()[:24]}.ok"


def _reported_sets() -> list[str] | None:
    """The vector instruction sets inductor would probe on this CPU (by its flags), None where unknown."""
    try:
        from torch._inductor import cpu_vec_isa
        flags = cpu_vec_isa.x86_isa_checker()
        return [str(isa) for isa in cpu_vec_isa.supported_vec_isa_list
                if all(flag in flags for flag in str(isa).split())]
    except (ImportError, AttributeError, RuntimeError):
        return None


def _settle_probe() -> None:
    """Before the first compile: where the probe passed for every set the CPU reports, in an earlier process
    (the marker) or now, tell inductor so, which spares later processes the probe's child processes and
    gives every process the same kernel cache keys. Left alone where the user set TORCHINDUCTOR_VEC_ISA_OK."""
    import torch._inductor.config as inductor_config
    if inductor_config.cpp.vec_isa_ok is not None:
        return
    marker = _probe_marker()
    if marker is None:
        return
    if not marker.is_file():
        try:
            from torch._inductor import cpu_vec_isa
            probed = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]  # the probe the compile would run
        except (ImportError, AttributeError, RuntimeError):
            return
        if not probed or probed != _reported_sets():
            return
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        except OSError:
            pass  # a read-only cache: the probe runs again next time
    inductor_config.cpp.vec_isa_ok = True
