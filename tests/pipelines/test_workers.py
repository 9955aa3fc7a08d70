"""run_tasks: runs shared out to spawned workers, and what a failure leaves."""

from __future__ import annotations

import pytest

from mnar_recsys.pipelines.workers import run_tasks

# eval is a builtin, so the spawned workers need nothing from this module to run these
SLOW = "__import__('time').sleep(3) or 7"


def test_the_runs_already_going_when_one_fails_are_kept_then_the_failure_is_raised(capsys):
    """The failure comes at once, while the slow run goes on: that one is kept, and the two behind them never
    start (a pool given them all would have queued them, past cancelling)."""
    results = []
    with pytest.raises(ZeroDivisionError):
        for task, result in run_tasks(eval, [("1/0",), (SLOW,), ("3",), ("4",)], jobs=2):
            results.append((task, result))
    assert results == [((SLOW,), 7)]
    assert "a run failed (ZeroDivisionError" in capsys.readouterr().err


def test_every_task_comes_back_once_with_workers():
    tasks = [(f"{i} * {i}",) for i in range(7)]
    assert sorted(result for _, result in run_tasks(eval, tasks, jobs=2)) == [i * i for i in range(7)]


def test_one_job_runs_the_tasks_in_order_here_and_stops_at_a_failure():
    results = []
    with pytest.raises(ZeroDivisionError):
        for task, result in run_tasks(eval, [("1 + 1",), ("1/0",), ("3",)], jobs=1):
            results.append(result)
    assert results == [2]
