"""The allocator tuning the command line applies (mnar_recsys.allocator)."""

import platform

import pytest

from mnar_recsys.allocator import keep_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="tunes glibc's malloc only")
def test_glibc_accepts_the_settings():
    assert keep_freed_memory() is True


@pytest.mark.skipif(platform.libc_ver()[0] == "glibc", reason="checks the refusal on other C libraries")
def test_other_c_libraries_are_left_alone():
    assert keep_freed_memory() is False
