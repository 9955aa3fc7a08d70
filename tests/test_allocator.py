"""The allocator tuning the command line applies (mnar_recsys.allocator)."""

import platform
import subprocess
import sys

import pytest

from mnar_recsys.allocator import keep_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="tunes glibc's malloc only")
def test_glibc_accepts_the_settings():
    assert keep_freed_memory() is True


@pytest.mark.skipif(platform.libc_ver()[0] == "glibc", reason="checks the refusal on other C libraries")
def test_other_c_libraries_are_left_alone():
    assert keep_freed_memory() is False


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="tunes glibc's malloc only")
def test_a_freed_40_mb_block_is_filled_again_without_page_faults():
    """In a fresh process: a 40 MB tensor (the categorical decoder's size at the Yahoo! R3 shape) is freed
    and another filled. The block comes back with its pages mapped; with glibc's defaults the fill faults
    in all 10,240 pages of 4 KiB afresh (10,241 faults measured here)."""
    script = """
import resource, torch
from mnar_recsys.allocator import keep_freed_memory
assert keep_freed_memory()
torch.empty(10 * 2 ** 20).fill_(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.empty(10 * 2 ** 20).fill_(1.0)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
    faults = int(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                check=True).stdout)
    assert faults < 100
