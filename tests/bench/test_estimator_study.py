"""bench/estimator_study.py (once `mnar-recsys ratings --estimator-k`): the trained not-MIWAE re-imputed with each
K, x_m sampled and integrated, from copies that leave the fitted model as it was."""

import importlib
import json
from pathlib import Path

import numpy as np
import pytest

from mnar_recsys.evaluation.protocol import mcar_split
from mnar_recsys.pipelines.ratings import build
from mnar_recsys.pipelines.ratings_config import RatingsRun
from mnar_recsys.pipelines.ratings_data import load_data

BENCH = Path(__file__).resolve().parents[2] / "bench"
STUDY = ["--users", "300", "--items", "60", "--selection", "race", "--importance-samples", "20"]


@pytest.fixture
def estimator_study(monkeypatch):
    """bench/estimator_study.py as a module, with bench/ on the path as when the script runs."""
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("estimator_study")


def test_the_estimator_study_reimputes_with_each_k_x_m_sampled_and_integrated(tmp_path, capsys, estimator_study):
    """Each seed's trained not-MIWAE re-imputed with each K, x_m sampled and integrated: an effective sample
    size between 1 and K, the table printed and written."""
    out = tmp_path / "study"
    estimator_study.main([*STUDY, "--iterations", "20", "--seeds", "0,1", "--k", "10,20", "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    records = results["records"]
    assert {(r["missing_factor"], r["k"]) for r in records} == {
        ("sampled", 10), ("sampled", 20), ("integrated", 10), ("integrated", 20)}
    assert [r["seed"] for r in records] == [0] * 4 + [1] * 4 and {r["model"] for r in records} == {"notmiwae-gaussian"}
    assert all(1 <= r["ess"] <= r["k"] for r in records)
    assert results["config"]["iterations"] == 20 and results["config"]["k"] == [10, 20]
    assert "ESS (mean over users)" in (out / "results.md").read_text()
    assert "| integrated | 20 |" in capsys.readouterr().out


def test_the_estimator_study_leaves_the_fitted_model_as_it_was(estimator_study):
    """The study predicts with copies of the fitted model, so the model keeps its own K and x_m factor."""
    run = RatingsRun(users=200, items=40, selection="race", iterations=20, importance_samples=20)
    data = load_data(run)
    split = mcar_split(data, seed=0)
    model = build("notmiwae-gaussian", run, data, seed=0, progress=False).fit(split.train)
    before = model.predict(split.users, split.items)
    sampled, integrated = estimator_study.estimator_records(model, split, (5,))
    assert (model.model.missing_factor, model.config.importance.n_samples) == ("integrated", 20)
    assert np.array_equal(model.predict(split.users, split.items), before)
    assert sampled["missing_factor"] == "sampled" and sampled["mse"] != integrated["mse"]  # the copies differ


@pytest.mark.parametrize("arguments, message", [
    (["--k", "10,10"], "--k names 10 more than once"),
    (["--k", "10,0"], "--k values must be positive, got 10,0"),
    (["--k", "10,,20"], "expected comma-separated integers, got '10,,20'"),
    (["--k", "10", "--iterations", "0"], "--iterations must be a positive integer, got 0"),
    (["--k", "10", "--models", "mf"], "unrecognized arguments: --models mf"),
])
def test_the_estimator_study_refuses_bad_options_before_any_work(tmp_path, capsys, estimator_study, arguments,
                                                                 message):
    with pytest.raises(SystemExit) as exit:
        estimator_study.main([*STUDY, *arguments, "--out", str(tmp_path / "bad")])
    assert exit.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow  # spawned workers; tests/pipelines/test_workers.py checks them in the fast tier
def test_the_estimator_study_gives_the_records_of_one_process_from_workers(tmp_path, estimator_study):
    """--jobs 2 studies the seeds in spawned one-thread workers: the same records, in seed order."""
    options = [*STUDY, "--iterations", "10", "--seeds", "0,1", "--k", "10"]
    one = estimator_study.main([*options, "--out", str(tmp_path / "one")])
    two = estimator_study.main([*options, "--jobs", "2", "--out", str(tmp_path / "two")])
    assert [(r["seed"], r["missing_factor"], r["mse"]) for r in two["records"]] == [
        (r["seed"], r["missing_factor"], r["mse"]) for r in one["records"]]
    assert one["records"][0]["mse"] != one["records"][2]["mse"]  # the seeds differ, so the comparison has teeth
