"""Fault injection: `ratings` runs killed with SIGKILL at seeded random moments leave no results.json or a valid
one that says it is incomplete, and a run into the same folder afterwards finishes as on a fresh one."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).parents[2]
RUN = ["-m", "mnar_recsys.cli", "ratings", "--users", "150", "--items", "30", "--selection", "race", "--seeds", "0,1",
       "--iterations", "60",
       "--importance-samples", "10", "--device", "cpu", "--models", "mf,notmiwae-gaussian", "--no-progress"]
KILLS = 5


def launch(out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *RUN, "--out", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})


def check_left(out: Path, finished: bool) -> str:
    """What a run left in `out`, checked: nothing, or a results.json that parses, whose records agree with its
    count of planned runs, and that says complete only when every run and figure is written."""
    path = out / "results.json"
    if not path.exists():
        assert not finished
        return "none"
    results = json.loads(path.read_text())
    records = results["records"]
    assert all(np.isfinite(record["mse"]) for record in records)
    if results["complete"]:
        assert len(records) == results["planned_runs"]
        assert all((out / name).is_file() for name in ("results.md", "predictions_histogram.png", "per_rating_mse.png"))
        return "complete"
    assert not finished and len(records) <= results["planned_runs"]
    return f"incomplete ({len(records)} of {results['planned_runs']})"


def visible(out: Path) -> set[str]:
    return {p.name for p in out.iterdir() if not p.name.startswith(".")}


@pytest.mark.slow
def test_runs_killed_at_random_moments_leave_no_or_an_incomplete_results_file(tmp_path):
    started = time.monotonic()
    reference = launch(tmp_path / "reference")
    assert reference.wait(timeout=600) == 0, reference.stderr.read()[-2000:]
    duration = time.monotonic() - started
    # seeded moments across a run's life, from start-up (nothing written) to its last figures, as fractions of
    # its length: a run that ends before its moment (the machine got faster) sets the length, and is run again
    fractions = np.sort(np.random.default_rng(39).uniform(0.05, 0.95, KILLS))  # the first into an empty folder
    out, outcomes, moments = tmp_path / "out", [], []
    for fraction in fractions:  # each into the folder the last killed run left
        for _ in range(3):
            process, started = launch(out), time.monotonic()
            try:
                process.wait(timeout=fraction * duration)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGKILL)
                process.wait()
                moments.append(round(time.monotonic() - started, 1))
                outcomes.append(check_left(out, finished=False))
                break
            assert process.returncode == 0, process.stderr.read()[-2000:]
            check_left(out, finished=True)
            duration = time.monotonic() - started
        else:
            pytest.fail(f"runs kept ending before {fraction:.2f} of their length")
    rerun = launch(out)
    assert rerun.wait(timeout=600) == 0, (outcomes, rerun.stderr.read()[-2000:])
    assert check_left(out, finished=True) == "complete"
    assert visible(out) == visible(tmp_path / "reference")
    assert {p.name for p in out.iterdir()} == visible(out)  # no lock file, no temporary copies left
    rerun_records = json.loads((out / "results.json").read_text())["records"]
    reference_records = json.loads((tmp_path / "reference" / "results.json").read_text())["records"]
    # seeded: the numbers of a run on a fresh folder, to rounding (a baseline's last bit varies between processes)
    assert [r["mse"] for r in rerun_records] == pytest.approx([r["mse"] for r in reference_records], rel=1e-9)
    print("killed after", moments, "s of runs of about", round(duration, 1), "s:", outcomes)
