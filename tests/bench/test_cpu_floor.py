"""bench/cpu_floor.py: the floors are the work divided by the measured rates, and the rates are measured."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("cpu_floor", ROOT / "bench" / "cpu_floor.py")
cpu_floor = importlib.util.module_from_spec(SPEC)
sys.modules["cpu_floor"] = cpu_floor
SPEC.loader.exec_module(cpu_floor)


def test_the_floors_are_the_work_over_the_rates():
    rates = {"matmul GFLOP/s": 100.0, "reciprocal G/s": 2.0, "exp G/s": 1.0, "log G/s": 1.0,
             "multiply-add G/s": 4.0, "copy GB/s": 8.0}
    train, predict = cpu_floor.floors(rates, nodes=8).values()
    entries = 100 * 20 * 1000
    step = (3 * 2 * entries * 30 / 100e9 + entries * 8 / 2e9 + entries / 1e9 + entries / 1e9
            + entries * 80 / 4e9 + 6 * 4 * entries / 8e9)
    assert train == pytest.approx(1000 * step)
    entries = 5400 * 1000 * 1000
    assert predict == pytest.approx(2 * entries * 30 / 100e9 + entries * 8 / 2e9 + 2 * entries / 1e9
                                    + entries * 80 / 4e9 + 2 * 4 * entries / 8e9)
    assert cpu_floor.floors(rates, nodes=4)["training s per 1,000 iterations"] < train


def test_the_rates_are_positive_measurements():
    measured = cpu_floor.rates()
    assert set(measured) == {"matmul GFLOP/s", "reciprocal G/s", "exp G/s", "log G/s", "multiply-add G/s",
                             "copy GB/s"}
    assert all(value > 0 for value in measured.values())
