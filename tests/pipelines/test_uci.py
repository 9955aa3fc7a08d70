"""The UCI pipeline: results files on Breast (scikit-learn's copy), and the paper's effect on real files."""

import json
import os
from pathlib import Path

import pytest
import torch

from mnar_recsys.cli import main
from mnar_recsys.data.uci import UCI_DATASETS, expected_file, load_uci
from mnar_recsys.evaluation.metrics import imputation_rmse
from mnar_recsys.pipelines import uci as uci_pipeline
from mnar_recsys.pipelines.uci import (
    NEURAL_MODELS,
    UCIConfig,
    make_imputer,
    masked_dataset,
    paper_rmse,
    results_markdown,
)

# the shared data folder beside the project root; $MNAR_RECSYS_UCI_DIR overrides (e.g. from a worktree)
UCI_DIR = Path(
    os.environ.get("MNAR_RECSYS_UCI_DIR") or Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "uci"
)


def _records(out: Path) -> list[dict]:
    return json.loads((out / "results.json").read_text())["records"]


def test_breast_cli_writes_results(tmp_path, monkeypatch):
    monkeypatch.delenv("MNAR_RECSYS_UCI_DIR", raising=False)  # Breast then comes from scikit-learn
    models = ["notmiwae-self-masking-known", "miwae-ppca", "mean"]
    code = main(["uci", "--dataset", "breast", "--models", *models, "--runs", "2", "--iterations", "5",
                 "--importance-samples", "10", "--out", str(tmp_path)])
    assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md", "rmse.png"]
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["provenance"]["package_version"] and payload["protocol"]["iterations"] == 5
    assert payload["complete"] is True  # false while runs are still to come, and in a stopped run's file
    records = payload["records"]
    assert [(r["model"], r["run"]) for r in records] == [(m, run) for m in models for run in (0, 1)]
    for r in records:
        assert r["dataset"] == "breast" and r["n_rows"] == 569 and r["n_features"] == 30
        assert 0 < r["rmse"] < 3 and r["seconds"] > 0 and r["seed"] == r["run"]
        assert (r["mask_accuracy"] is not None) == (r["model"] == "notmiwae-self-masking-known")
        assert (r["log_likelihood"] is not None) == (r["model"] != "mean") and r["init_scores"] is None  # one fit
    assert records[0]["config"]["model"]["variance"] == "per_row"
    assert records[2]["config"]["model"]["decoder"] == "linear"
    assert abs(records[-1]["rmse"] - 1.82) < 0.01  # mean imputation matches the paper's 1.82 exactly
    text = (tmp_path / "results.md").read_text()
    assert "| notmiwae-self-masking-known | 0.76 |" in text  # the paper's table, Breast column
    assert "| mean | 1.82 |" in text and "Mask accuracy" in text


def test_n_init_runs_keep_the_kept_fits_score(tmp_path, monkeypatch):
    monkeypatch.delenv("MNAR_RECSYS_UCI_DIR", raising=False)
    code = main(["uci", "--dataset", "breast", "--models", "notmiwae-ppca-self-masking", "--runs", "1",
                 "--iterations", "5", "--importance-samples", "10", "--n-init", "2", "--out", str(tmp_path)])
    assert code == 0
    record = _records(tmp_path)[0]
    assert record["config"]["estimator"]["n_init"] == 2 and record["config"]["protocol"]["n_init"] == 2
    imputer = make_imputer("notmiwae-ppca-self-masking", UCIConfig(iterations=5, importance_samples=10, n_init=2),
                           record["seed"])
    complete, mask, masked = masked_dataset(load_uci("breast"), 0.0)
    imputer.fit(masked)
    assert record["init_scores"] == pytest.approx(imputer.init_scores_) and len(record["init_scores"]) == 2
    assert record["log_likelihood"] == pytest.approx(max(imputer.init_scores_))
    assert record["log_likelihood"] == pytest.approx(imputer.score(masked))


@pytest.mark.slow
def test_the_low_rank_model_takes_the_protocols_standardised_data_as_given(tmp_path, monkeypatch):
    """Re-centred on the observed means, which the self-masking pulls down, the low-rank joint model imputed
    Breast at 1.72, no better than the mean (1.82); on the protocol's scale, as the paper fed it, 1.01
    (paper 1.22)."""
    monkeypatch.delenv("MNAR_RECSYS_UCI_DIR", raising=False)
    assert main(["uci", "--dataset", "breast", "--models", "lowrank-joint", "mean", "--runs", "1", "--out",
                 str(tmp_path), "--no-progress"]) == 0
    lowrank, mean = _records(tmp_path)
    assert lowrank["config"]["estimator"]["standardize"] is False
    assert lowrank["rmse"] < mean["rmse"] - 0.5


@pytest.mark.slow
def test_worker_processes_give_the_records_of_a_one_process_run(tmp_path, monkeypatch):
    """--jobs 2 shares the runs out to spawned workers: the same records, in the same order, as --jobs 1."""
    monkeypatch.delenv("MNAR_RECSYS_UCI_DIR", raising=False)
    arguments = ["uci", "--dataset", "breast", "--models", "notmiwae-ppca-self-masking-known", "mean", "--runs", "2",
                 "--iterations", "20", "--importance-samples", "10"]
    assert main([*arguments, "--out", str(tmp_path / "one")]) == 0
    assert main([*arguments, "--jobs", "2", "--out", str(tmp_path / "two")]) == 0
    # the workers take one thread each, which the record says: a seed repeats bit for bit at a fixed thread count
    assert {key: json.loads((tmp_path / "two" / "results.json").read_text())[key]
            for key in ("jobs", "threads", "device_used")} == {"jobs": 2, "threads": 1, "device_used": "cpu"}
    one, two = _records(tmp_path / "one"), _records(tmp_path / "two")
    assert [(r["model"], r["run"]) for r in two] == [(r["model"], r["run"]) for r in one]
    assert [r["rmse"] for r in two] == pytest.approx([r["rmse"] for r in one], rel=1e-5)
    assert one[0]["rmse"] != one[1]["rmse"]  # the runs differ by seed, so the comparison above has teeth


def test_the_runs_of_a_model_fit_stacked_as_each_would_alone(tmp_path, monkeypatch):
    """--runs 2 trains each model's two runs as one stacked fit (the agnostic model's with x_m drawn), and every
    record is the single fit's: its RMSE to rounding of the parameters."""
    monkeypatch.delenv("MNAR_RECSYS_UCI_DIR", raising=False)
    models = ["miwae", "notmiwae-self-masking-known", "notmiwae-agnostic"]
    assert main(["uci", "--dataset", "breast", "--models", *models, "--runs", "2", "--iterations", "30",
                 "--importance-samples", "50", "--no-progress", "--out", str(tmp_path)]) == 0
    records = _records(tmp_path)
    assert [r["stacked_runs"] for r in records] == [2, 2, 2, 2, 2, 2]
    config = UCIConfig(iterations=30, importance_samples=50, runs=2)
    complete, mask, masked = masked_dataset(load_uci("breast"), 0.0)
    for record in records:
        alone = make_imputer(record["model"], config, record["seed"]).fit(masked)
        assert record["rmse"] == pytest.approx(imputation_rmse(complete, alone.transform(masked), mask), rel=1e-4)
        assert record["log_likelihood"] == pytest.approx(alone.score(masked), rel=1e-4)
    assert records[0]["rmse"] != records[1]["rmse"]  # the runs differ by seed, so the comparison has teeth


def test_one_process_runs_show_progress_bars_unless_told_not_to(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MNAR_RECSYS_UCI_DIR", raising=False)
    arguments = ["uci", "--dataset", "breast", "--models", "notmiwae-ppca-self-masking-known", "--runs", "1",
                 "--iterations", "5", "--importance-samples", "10"]
    assert main([*arguments, "--out", str(tmp_path / "bars")]) == 0
    err = capsys.readouterr().err
    assert "training" in err and "imputing" in err
    assert main([*arguments, "--no-progress", "--out", str(tmp_path / "quiet")]) == 0
    err = capsys.readouterr().err
    assert "training" not in err and "imputing" not in err


def test_a_model_named_twice_is_an_error(tmp_path, capsys):
    """It would run twice on the same seeds and count as two runs (mean 1.820 ± 0.000, n=2)."""
    assert main(["uci", "--dataset", "breast", "--models", "mean", "ppca", "mean", "--out", str(tmp_path / "r")]) == 2
    assert "--models names mean more than once" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal of a GPU that is not there")
def test_a_gpu_that_is_not_there_is_refused_before_an_earlier_runs_files_go(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["uci", "--dataset", "breast", "--models", "mean", "--runs", "1", "--out", str(out)]) == 0
    assert main(["uci", "--dataset", "breast", "--models", "mean", "--device", "cuda", "--out", str(out)]) == 2
    assert "sees no GPU" in capsys.readouterr().err
    assert (out / "results.json").exists()


def test_jobs_below_one_are_an_error(tmp_path, capsys):
    assert main(["uci", "--dataset", "breast", "--models", "mean", "--jobs", "0", "--out", str(tmp_path)]) == 2
    assert "--jobs must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--iterations", "--batch-size", "--n-samples", "--importance-samples", "--runs",
                                    "--n-init"])
def test_counts_below_one_are_refused_before_any_data_is_read(tmp_path, capsys, option):
    """An --importance-samples 0 would otherwise surface only at imputation, after hours of training."""
    empty = tmp_path / "no_files_here"
    assert main(["uci", "--dataset", "yeast", "--data-dir", str(empty), option, "0", "--out", str(tmp_path)]) == 2
    assert f"{option} must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("options, message", [
    (["--seed", "-1"], "--seed (and the last run's seed + runs - 1) must lie in 0..4294967295, got -1"),
    (["--seed", "4294967295", "--runs", "2"], "must lie in 0..4294967295, got 4294967296"),
    (["--offset", "nan"], "--offset must be finite, got nan"),
])
def test_seeds_and_offsets_no_run_could_use_are_refused_before_any_data_is_read(tmp_path, capsys, options, message):
    """A seed of -1 had failed in NumPy after an earlier run's files were gone; an offset of NaN masked nothing and
    failed in the mean imputer."""
    empty = tmp_path / "no_files_here"
    assert main(["uci", "--dataset", "yeast", "--data-dir", str(empty), *options, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_an_out_that_is_a_file_is_refused_and_an_earlier_run_is_kept_until_a_record_replaces_it(
        tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MNAR_RECSYS_UCI_DIR", raising=False)
    (tmp_path / "taken").write_text("mine")
    assert main(["uci", "--dataset", "breast", "--models", "mean", "--out", str(tmp_path / "taken")]) == 2
    assert f"--out {tmp_path / 'taken'} is a file, not a folder" in capsys.readouterr().err
    out = tmp_path / "r"
    assert main(["uci", "--dataset", "breast", "--models", "mean", "--runs", "1", "--out", str(out)]) == 0
    earlier = (out / "results.json").read_text()

    def fail(*args):
        raise ValueError("the first run failed")
    monkeypatch.setattr(uci_pipeline, "run_one", fail)
    assert main(["uci", "--dataset", "breast", "--models", "mean", "--runs", "1", "--out", str(out)]) == 2
    assert (out / "results.json").read_text() == earlier and (out / "rmse.png").exists()


@pytest.mark.parametrize("name", NEURAL_MODELS)
def test_each_neural_row_is_the_model_its_name_says(name):
    """'ppca' names the linear decoder, 'miwae' the MCAR model, the rest the missing model; large values go missing."""
    imputer = make_imputer(name, UCIConfig(), seed=0)
    decoder = "linear" if "ppca" in name else "gaussian"
    missing = "mcar" if name.startswith("miwae") else name.removeprefix("notmiwae-").removeprefix("ppca-")
    assert (imputer.decoder, imputer.missing, imputer.missing_sign) == (decoder, missing, -1)


def test_unknown_dataset_files_are_an_error(tmp_path, capsys):
    assert main(["uci", "--dataset", "yeast", "--data-dir", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert expected_file("yeast") in capsys.readouterr().err


@pytest.mark.parametrize("name", ["banknote", "concrete", "red", "yeast-no-erl"])
def test_the_papers_deterministic_baselines_come_out_as_in_its_table(name):
    """PPCA and MICE have no seed, so under the same protocol and data they should give the paper's RMSE. They do
    on these sets: on Concrete only with its ninth column, strength (PPCA 1.62 and MICE 1.70, paper 1.61 and
    1.70; 1.69 and 1.87 without it), on Yeast only without one of its eight features (1.67 and 1.72, paper
    1.67 and 1.72; 1.72 and 1.76 with all eight). On White and Breast one or both differ (PPCA 1.51 / 0.85
    against 1.57 / 0.90, MICE 1.41 / 0.95 against 1.41 / 1.17), as two implementations of one method can."""
    if not (UCI_DIR / expected_file(name)).is_file():
        pytest.skip(f"{expected_file(name)} not in {UCI_DIR}")
    complete, mask, masked = masked_dataset(load_uci(name, UCI_DIR), offset=0.0)
    for model in ("ppca", "mice"):
        imputed = make_imputer(model, UCIConfig(), seed=0).fit(masked).transform(masked)
        assert imputation_rmse(complete, imputed, mask) == pytest.approx(paper_rmse(model, name), abs=0.025), model


def test_a_variant_stands_beside_its_data_set_and_is_read_against_its_column_of_the_paper():
    records = [{"dataset": name, "model": "mean", "rmse": rmse, "mask_accuracy": None}
               for name, rmse in (("breast", 1.8), ("yeast-no-erl", 1.7), ("yeast", 1.73))]
    text = results_markdown(records, {})
    assert "| model | yeast | yeast-no-erl | breast |" in text
    assert "| mean | 1.730 | 1.700 | 1.800 |" in text
    assert "| mean | 1.69 | 1.69 | 1.82 |" in text  # the paper's


@pytest.mark.slow
@pytest.mark.skipif(not all((UCI_DIR / expected_file(name)).is_file() for name in UCI_DATASETS),
                    reason=f"UCI files absent from {UCI_DIR}")
def test_the_papers_ordering_holds_on_all_six_sets(tmp_path):
    """Issue 4's bar, shortened to 500 of the paper's 100k iterations (K_pred 200), and to 3,000 for the
    PPCA-like self-masking model, whose weights start at random signs (as in the paper's code) and take
    longer to find them: Banknote 1.81 after 500, 1.55 after 2,000, 1.23 after 3,000 (0.52 after 100k).
    Measured RMSE, Banknote / Concrete / Red / White / Yeast / Breast: not-MIWAE self-masking known 1.13 /
    1.52 / 1.41 / 1.44 / 1.43 / 0.93, MIWAE 1.41 / 1.73 / 1.71 / 1.65 / 1.67 / 1.28, mean 1.73 / 1.85 /
    1.84 / 1.74 / 1.73 / 1.82; PPCA-like not-MIWAE self-masking (3,000) 1.23 / 1.37 / 1.32 / 1.35 / 1.21 /
    0.76, PPCA 1.39 / 1.62 / 1.62 / 1.51 / 1.72 / 0.85. PPCA's Breast was 1.14 while EM stopped at 300
    iterations, far from the maximum; at the maximum PPCA sits 0.09 above the PPCA-like not-MIWAE there
    (0.14 at the full protocol), hence the smaller margin for that pair."""
    shortened = {"500": ["notmiwae-self-masking-known", "miwae", "mean", "ppca"],
                 "3000": ["notmiwae-ppca-self-masking"]}
    rmse = {}
    for iterations, models in shortened.items():
        out = tmp_path / iterations
        assert main(["uci", "--dataset", "all", "--data-dir", str(UCI_DIR), "--models", *models, "--runs", "1",
                     "--iterations", iterations, "--importance-samples", "200", "--jobs", "2",
                     "--out", str(out), "--no-progress"]) == 0
        rmse |= {(r["dataset"], r["model"]): r["rmse"] for r in _records(out)}
    for name in UCI_DATASETS:
        assert rmse[name, "notmiwae-self-masking-known"] < rmse[name, "miwae"] - 0.05, name
        assert rmse[name, "notmiwae-self-masking-known"] < rmse[name, "mean"] - 0.2, name
        assert rmse[name, "notmiwae-ppca-self-masking"] < rmse[name, "ppca"] - 0.05, name


def test_sampled_imputation_reaches_the_agnostic_imputer(tmp_path, monkeypatch, capsys):
    """--sampled-imputation draws is recorded with the protocol and the imputer's parameters, and changes what
    the agnostic model (x_m sampled) imputes; an unknown estimate is refused before any training."""
    monkeypatch.delenv("MNAR_RECSYS_UCI_DIR", raising=False)
    base = ["uci", "--dataset", "breast", "--models", "notmiwae-agnostic", "--runs", "1", "--iterations", "20",
            "--importance-samples", "20", "--no-progress"]
    rmse = {}
    for estimate in ("decoder-mean", "draws"):
        assert main([*base, "--sampled-imputation", estimate, "--out", str(tmp_path / estimate)]) == 0
        payload = json.loads((tmp_path / estimate / "results.json").read_text())
        assert payload["protocol"]["sampled_imputation"] == estimate
        record = payload["records"][0]
        assert record["config"]["estimator"]["sampled_imputation"] == estimate
        rmse[estimate] = record["rmse"]
    assert rmse["draws"] != rmse["decoder-mean"]
    with pytest.raises(SystemExit):
        main([*base, "--sampled-imputation", "tilted", "--out", str(tmp_path / "bad")])
    assert "argument --sampled-imputation: invalid choice: 'tilted'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
