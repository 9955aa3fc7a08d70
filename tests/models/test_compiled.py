"""When the quadrature kernels are compiled (MNAR_RECSYS_COMPILE, short jobs eager), where their builds are kept,
and the vector-ISA probe's outcome kept across processes."""

import json
import os
import platform
import subprocess
import sys

import numpy as np
import pytest
import torch

from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.models.integrated import compiled
from mnar_recsys.training import trainer
from mnar_recsys.training.trainer import TrainConfig, fit

X86_LINUX = sys.platform == "linux" and platform.machine() == "x86_64"


@pytest.fixture
def spy_compile(monkeypatch):
    """torch.compile replaced by a recorder that returns the function itself: no build."""
    calls = []

    def fake_compile(function, **options):
        calls.append(function)
        return function

    monkeypatch.setattr(compiled.torch, "compile", fake_compile)
    monkeypatch.setattr(compiled, "_settle_probe", lambda: None)
    return calls


@pytest.mark.parametrize("value, mode", [(None, "auto"), ("", "auto"), ("0", "0"), ("1", "1"), (" AUTO ", "auto")])
def test_the_compile_mode_is_read_from_the_environment(monkeypatch, value, mode):
    if value is None:
        monkeypatch.delenv(compiled.COMPILE_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(compiled.COMPILE_VARIABLE, value)
    assert compiled.compile_mode() == mode


def test_a_misspelt_compile_mode_is_refused_before_training(monkeypatch):
    monkeypatch.setenv(compiled.COMPILE_VARIABLE, "yes")
    with pytest.raises(ValueError, match=r"MNAR_RECSYS_COMPILE must be one of \('0', '1', 'auto'\), got 'yes'"):
        compiled.compile_mode()
    monkeypatch.setattr(trainer, "_step", lambda *args: pytest.fail("trained with a misspelt mode"))
    with pytest.raises(ValueError, match="MNAR_RECSYS_COMPILE must be one of"):
        fit(build_model(ModelConfig(n_features=3)), np.ones((6, 3)), TrainConfig(iterations=2, progress=False))


@pytest.mark.parametrize("mode, outside, short, long", [("auto", True, False, True), ("1", True, True, True),
                                                        ("0", False, False, False)])
def test_short_jobs_run_eagerly_in_auto_mode_alone(monkeypatch, mode, outside, short, long):
    """'auto' compiles outside any job and in long ones; the innermost of nested jobs decides."""
    monkeypatch.setenv(compiled.COMPILE_VARIABLE, mode)
    assert compiled.compiling() is outside
    with compiled.job(compiled.SHORT_JOB_STEPS - 1):
        assert compiled.compiling() is short
        with compiled.job(compiled.SHORT_JOB_STEPS):
            assert compiled.compiling() is long
        assert compiled.compiling() is short
    assert compiled.compiling() is outside


def test_a_kernel_in_a_short_job_runs_eagerly_without_building_or_warning(monkeypatch, spy_compile, recwarn):
    monkeypatch.setenv(compiled.COMPILE_VARIABLE, "auto")
    kernel = compiled.Compiled(lambda x: (x + 1,))
    with compiled.job(10):
        assert kernel(torch.zeros(2)) is None
    assert spy_compile == [] and kernel.compiled is None and not kernel.eager and len(recwarn) == 0
    (value,) = kernel(torch.zeros(2))
    assert torch.equal(value, torch.ones(2)) and len(spy_compile) == 1


def test_float_constants_are_built_into_the_kernel(monkeypatch):
    """A float constant is part of the compiled code (a new value builds a new kernel), not an input read at run
    time: the quadrature's nodes and weights ran 1.6 to 1.9 times slower as inputs."""
    monkeypatch.setenv(compiled.COMPILE_VARIABLE, "1")
    kernel = compiled.Compiled(lambda x, *, scale: (x * scale,))
    x = torch.arange(4.0)
    torch._dynamo.utils.counters.clear()
    for scale in (2.5, 2.5, 3.5):
        (value,) = kernel(x, scale=scale)
        assert torch.equal(value, x * scale)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2


@pytest.mark.parametrize("mode, iterations, expected", [("auto", 3, False), ("1", 3, True),
                                                        ("auto", compiled.SHORT_JOB_STEPS, True)])
def test_fit_declares_its_length(monkeypatch, mode, iterations, expected):
    """Inside fit the kernels are compiled by its iterations; the step sees the same answer every time."""
    monkeypatch.setenv(compiled.COMPILE_VARIABLE, mode)
    seen = set()

    def step(*args):
        seen.add(compiled.compiling())
        return torch.tensor(-1.0, dtype=torch.float64)

    monkeypatch.setattr(trainer, "_step", step)
    fit(build_model(ModelConfig(n_features=3)), np.ones((6, 3)), TrainConfig(iterations=iterations, batch_size=6,
                                                                           progress=False, device="cpu"))
    assert seen == {expected}
    assert compiled.compiling() is (mode != "0")  # the job ended with the fit


def test_builds_are_kept_under_the_users_cache_unless_the_user_chose_a_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compiled.cache_folder() == tmp_path / "mnar_recsys" / "torchinductor"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mnar_recsys" / "torchinductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compiled.cache_folder() == tmp_path / "mine"


def test_the_cache_folder_is_chosen_before_an_optimiser_fixes_inductors(tmp_path):
    """torch.optim imports torch._dynamo, which reads TORCHINDUCTOR_CACHE_DIR once: the package sets it first."""
    script = ("import os, torch; import mnar_recsys.models.integrated.compiled; "
              "torch.optim.Adam([torch.zeros(1, requires_grad=True)]); "
              "from torch._inductor.runtime.cache_dir_utils import cache_dir; print(cache_dir())")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.split()[-1] == str(tmp_path / "mnar_recsys" / "torchinductor")


@pytest.mark.skipif(not X86_LINUX, reason="the probe's outcome is kept on x86 Linux only")
@pytest.mark.parametrize("all_passed", [True, False])
def test_the_probe_is_skipped_only_where_it_passed_for_every_set(monkeypatch, tmp_path, all_passed):
    from torch._inductor import config as inductor_config
    from torch._inductor import cpu_vec_isa

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(inductor_config.cpp, "vec_isa_ok", None)
    flags = cpu_vec_isa.x86_isa_checker()
    reported = [isa for isa in cpu_vec_isa.supported_vec_isa_list if all(f in flags for f in str(isa).split())]
    if not reported:
        pytest.skip("this CPU reports no vector instruction set inductor knows")
    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", lambda: reported if all_passed else reported[1:])
    compiled._settle_probe()
    assert compiled._probe_marker().is_file() is all_passed
    assert inductor_config.cpp.vec_isa_ok is (True if all_passed else None)
    if all_passed:  # a later process trusts the marker and probes nothing
        monkeypatch.setattr(inductor_config.cpp, "vec_isa_ok", None)
        monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", lambda: pytest.fail("probed again"))
        compiled._settle_probe()
        assert inductor_config.cpp.vec_isa_ok is True


_FIRST_CALL = """
import json, sys, time
import torch
from mnar_recsys.models.integrated.gaussian_affine import masked_log_expected_sigmoid_sum
loc, keep = 1 + 4 * torch.rand(4, 3, 50), (torch.rand(4, 1, 50) > 0.5).float()
masked_log_expected_sigmoid_sum(loc, torch.tensor(0.7), torch.randn(50), 0.5 + torch.rand(50), keep)
from torch._dynamo.utils import counters
import torch._inductor.config as inductor_config
print(json.dumps({"hits": counters["inductor"]["fxgraph_cache_hit"], "vec_isa_ok": inductor_config.cpp.vec_isa_ok}))
"""


@pytest.mark.slow  # two fresh processes that each start torch.compile
def test_a_second_process_loads_the_kernel_from_the_cache_and_skips_the_probe(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "MNAR_RECSYS_COMPILE": "1"}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    runs = [json.loads(subprocess.run([sys.executable, "-c", _FIRST_CALL], env=env, capture_output=True, text=True,
                                      check=True).stdout.splitlines()[-1]) for _ in range(2)]
    assert (tmp_path / "mnar_recsys" / "torchinductor").is_dir()
    assert runs[0]["hits"] == 0 and runs[1]["hits"] > 0
    if X86_LINUX:  # where the probe passed for every set, both processes say so to inductor: the same cache keys
        assert runs[0]["vec_isa_ok"] is True and runs[1]["vec_isa_ok"] is True
