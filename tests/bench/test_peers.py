"""bench/peers.py on tiny cells: both packages fit, the runs alternate, and the report ends with the ratio of
the speeds it prints. Skipped where the `bench` extra (notmiwae-pytorch) is not installed, as in CI."""

import importlib.util
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("notmiwae_pytorch", reason="notmiwae-pytorch (the bench extra) is not installed")

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("peers", ROOT / "bench" / "peers.py")
peers = importlib.util.module_from_spec(SPEC)
sys.modules["peers"] = peers  # its dataclasses look their module up there
SPEC.loader.exec_module(peers)

LINE = re.compile(r"^(\S+) +([\d.]+) run-its/s .* RMSE ([\d.]+) \(sd [\d.]+ over (\d+) runs\)$")


def tiny_cell(rows: int = 48, features: int = 4) -> "peers.Cell":
    rng = np.random.default_rng(0)
    data = rng.standard_normal((rows, 2)) @ rng.standard_normal((2, features)) + 0.3 * rng.standard_normal(
        (rows, features))
    return peers.Cell(*peers.masked_dataset(data, offset=0.0))


def parse(lines: list[str]) -> dict[str, tuple[float, float, int]]:
    found = {}
    for line in lines[:-1]:
        match = LINE.match(line)
        assert match, line
        found[match[1]] = float(match[2]), float(match[3]), int(match[4])
    return found


def test_both_packages_fit_the_cell_and_the_last_line_is_the_ratio_of_their_speeds():
    results = peers.compare(tiny_cell(), runs=2, iterations=3, importance_samples=5)
    assert [len(runs.seconds) for runs in results.values()] == [1, 1]  # one round: ours one stacked fit
    lines = peers.report(results, iterations=3)
    found = parse(lines)
    assert list(found) == [peers.OURS, peers.PEER]
    speeds = {name: runs.run_iterations_per_second(3) for name, runs in results.items()}
    for name, (speed, rmse, runs) in found.items():
        assert runs == 2 and speed == pytest.approx(speeds[name], abs=0.05), name
        assert math.isfinite(rmse) and rmse > 0 and rmse == pytest.approx(np.mean(results[name].rmse), abs=5e-4)
    ratio = float(re.fullmatch(rf"ratio {peers.OURS} / {peers.PEER} run-its/s: ([\d.]+)x", lines[-1])[1])
    assert ratio == pytest.approx(speeds[peers.OURS] / speeds[peers.PEER], abs=0.005)  # printed to 2 decimals


def test_the_packages_alternate_each_round_each_run_has_its_own_seed_and_each_round_is_logged(monkeypatch):
    cell, calls, logged = tiny_cell(), [], []

    def fake(name, seconds):
        def fit(cell, iterations, importance_samples, seeds):
            calls.append((name, seeds))
            return seconds, [cell.complete] * len(seeds)  # perfect imputations: RMSE 0
        return fit

    monkeypatch.setattr(peers, "FITS", {peers.OURS: fake(peers.OURS, 1.0), peers.PEER: fake(peers.PEER, 4.0)})
    results = peers.compare(cell, runs=2, iterations=10, importance_samples=5, seed=7, rounds=3, log=logged.append)
    assert calls == [(peers.OURS, [7, 8]), (peers.PEER, [7, 8]), (peers.PEER, [9, 10]), (peers.OURS, [9, 10]),
                     (peers.OURS, [11, 12]), (peers.PEER, [11, 12])]
    assert logged[:2] == [f"round 0 {peers.OURS}: 2 fits 1.0 s, RMSE 0.000",
                          f"round 0 {peers.PEER}: 2 fits 4.0 s, RMSE 0.000"]
    assert len(logged) == 6
    lines = peers.report(results, iterations=10)
    assert parse(lines) == {peers.OURS: (20.0, 0.0, 6), peers.PEER: (5.0, 0.0, 6)}
    assert lines[-1] == f"ratio {peers.OURS} / {peers.PEER} run-its/s: 4.00x"


def test_our_runs_fit_stacked_each_as_it_would_alone():
    cell = tiny_cell()
    _, stacked = peers.fit_ours(cell, 20, 5, [3, 4])
    _, alone = peers.fit_ours_one_by_one(cell, 20, 5, [3, 4])
    for ours, theirs in zip(stacked, alone):
        np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-3)
    assert not np.allclose(stacked[0], stacked[1])


def test_the_peer_trains_on_exactly_the_iterations_asked_for_in_full_batches():
    cell = tiny_cell(rows=40)
    dataset = peers.TensorDataset(*(peers.torch.as_tensor(a) for a in (cell.complete, cell.mask)))
    batches = [rows for rows, _ in peers.peer_batches(dataset, iterations=7)]
    assert len(batches) == 7 and all(len(rows) == peers.BATCH_SIZE for rows in batches)


@pytest.mark.parametrize("name", ["runs", "iterations", "importance_samples", "rounds"])
def test_a_count_below_one_is_refused_by_name(name):
    counts = {"runs": 1, "iterations": 1, "importance_samples": 1, "rounds": 1, name: 0}
    with pytest.raises(ValueError, match=f"{name} must be a positive integer"):
        peers.compare(tiny_cell(), **counts)


def test_the_script_on_banknote_prints_the_cell_the_warm_up_each_fit_and_the_ratio_last(capsys):
    data_dir = peers.DATA_DIR
    if not (data_dir / "data_banknote_authentication.txt").is_file():
        pytest.skip(f"the UCI files are not in {data_dir}")
    peers.main(["--runs", "2", "--rounds", "1", "--iterations", "2", "--importance-samples", "10"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("banknote: 1372 x 4, 25.7% missing; 1 x 2 runs x 2 iterations of 16 rows")
    assert lines[1].startswith("warm-up fit")
    assert [line.split(":")[0] for line in lines[2:4]] == [f"round 0 {peers.OURS}", f"round 0 {peers.PEER}"]
    assert list(parse(lines[4:])) == [peers.OURS, peers.PEER]
    assert lines[-1].startswith(f"ratio {peers.OURS} / {peers.PEER} run-its/s: ")
