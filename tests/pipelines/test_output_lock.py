"""One live run per results folder: a second run is refused naming the holder, and a killed run's lock is gone."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mnar_recsys.cli import main
from mnar_recsys.pipelines.output_lock import LOCK_FILE, OutputFolderInUse, hold_output
from mnar_recsys.pipelines.svhn import SVHNConfig, run_clipping
from mnar_recsys.pipelines.uci import UCIConfig, run_uci

ROOT = Path(__file__).parents[2]
HOLD = ("import sys, time\nfrom mnar_recsys.pipelines.output_lock import hold_output\n"
        "with hold_output(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(600)\n")
QUICK = ["--users", "200", "--items", "30", "--selection", "race", "--iterations", "300", "--importance-samples", "10",
         "--device", "cpu",
         "--models", "mf,notmiwae-gaussian", "--no-progress"]


def holder(out: Path) -> subprocess.Popen:
    """Another process holding `out`, once it has said so."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_held_folder_is_refused_naming_the_holder_until_it_dies(tmp_path, capsys):
    out = tmp_path / "out"
    process = holder(out)
    try:
        assert main(["ratings", "--out", str(out), "--no-progress"]) == 2
        expected = f"--out {out} is in use by another run (pid {process.pid} on {socket.gethostname()})"
        assert expected in capsys.readouterr().err
        with pytest.raises(OutputFolderInUse, match=r"\(pid \d+ on "):
            run_uci(["banknote"], ["mean"], UCIConfig(), out)
        images = np.zeros((2, 8, 8), dtype=np.float32)
        with pytest.raises(OutputFolderInUse, match=r"\(pid \d+ on "):
            run_clipping(images, images, SVHNConfig(), out, "zeros")
    finally:
        process.send_signal(signal.SIGKILL)  # no cleanup runs: the operating system alone releases the lock
        process.wait()
    assert (out / LOCK_FILE).read_text().startswith(f"pid {process.pid} ")  # left behind, but no longer held
    with hold_output(out):
        assert (out / LOCK_FILE).read_text() == f"pid {os.getpid()} on {socket.gethostname()}\n"
    assert not (out / LOCK_FILE).exists()


def test_a_refused_or_failed_run_leaves_no_folder_it_made(tmp_path):
    with pytest.raises(RuntimeError), hold_output(tmp_path / "new"):
        raise RuntimeError("stopped")
    assert not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir()
    with hold_output(tmp_path / "old"):
        pass
    assert (tmp_path / "old").is_dir() and not any((tmp_path / "old").iterdir())


@pytest.mark.slow
def test_a_second_ratings_run_into_a_live_runs_folder_is_refused(tmp_path):
    """Started a second apart, both once exited 0, leaving one run's results.json beside the other's figures."""
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = [sys.executable, "-m", "mnar_recsys.cli", "ratings", *QUICK, "--out", str(out)]
    first = subprocess.Popen([*run, "--seeds", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=ROOT, env=env)
    deadline = time.monotonic() + 120
    while not (out / LOCK_FILE).exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    second = subprocess.run([*run, "--seeds", "1"], check=False, capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=120)
    _, first_errors = first.communicate(timeout=300)
    assert first.returncode == 0, first_errors[-2000:]
    assert second.returncode == 2
    assert f"--out {out} is in use by another run (pid {first.pid} on " in second.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] and [r["seed"] for r in results["records"]] == [0, 0]
