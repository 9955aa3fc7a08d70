"""bench/uci_table_time.py: the extrapolation of a fit and the replay of the tasks onto the workers."""

import importlib
from pathlib import Path

import pytest

from mnar_recsys.pipelines.uci import UCIConfig

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def uci_table_time(monkeypatch):
    """bench/uci_table_time.py as a module, with bench/ on the path as when the script runs."""
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("uci_table_time")


def test_a_fit_is_the_first_fit_and_the_rate_of_the_other_two(uci_table_time):
    # 10 s for the first 1,000 steps (with the build), then 4 s and 12 s: 4 ms a step for the 99,000 left
    assert uci_table_time.extrapolated(10.0, 4.0, 12.0, 1000, 3000, 100_000) == pytest.approx(10.0 + 0.004 * 99_000)


def test_the_tasks_go_in_order_to_the_first_free_worker(uci_table_time):
    # A takes 5; B 2, then 4 (free at 2, to 6); A 1 (free at 5, to 6); then 3 and 4, one each: 9 and 10
    assert uci_table_time.replay([5.0, 2.0, 4.0, 1.0, 3.0, 4.0], jobs=2) == pytest.approx(10.0)
    assert uci_table_time.replay([5.0, 2.0, 4.0], jobs=1) == pytest.approx(11.0)
    assert uci_table_time.replay([3.0], jobs=4) == pytest.approx(3.0)


def test_a_baseline_is_one_task_a_run_and_no_fit_time(uci_table_time):
    # Breast falls back to scikit-learn's copy, so this needs no UCI files
    measured = uci_table_time.measure("breast", "mean", None, UCIConfig(runs=3, device="cpu"), 2, 4)
    assert len(measured.task_seconds) == 3 and len(set(measured.task_seconds)) == 1
    assert measured.task_seconds[0] > 0 and measured.fit_seconds == 0.0


def test_a_stacked_model_is_one_task_with_its_fit_inside(uci_table_time):
    config = UCIConfig(iterations=8, importance_samples=4, runs=2, device="cpu")
    measured = uci_table_time.measure("breast", "miwae-ppca", None, config, 2, 6)
    assert len(measured.task_seconds) == 1
    assert 0 < measured.fit_seconds < measured.task_seconds[0]
