"""bench/isolation.py: a measurement's process that fails reports why instead of leaving the bench waiting."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from isolation import isolated  # noqa: E402


def _double(x: int) -> int:
    return 2 * x


def _raises() -> None:
    raise ValueError("no such shape")


def _dies() -> None:
    os._exit(3)


def test_result_comes_back():
    assert isolated(_double, 21) == 42


def test_an_exception_in_the_child_is_raised_with_its_traceback():
    with pytest.raises(RuntimeError, match="(?s)_raises failed in its process.*ValueError: no such shape"):
        isolated(_raises)


def test_a_child_that_dies_without_a_result_is_reported():
    with pytest.raises(RuntimeError, match="_dies died in its process \\(exit code 3\\)"):
        isolated(_dies)
