"""`mnar-recsys ratings`: the files it writes, and not-MIWAE's advantage on MCAR ratings."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mnar_recsys.cli import main
from mnar_recsys.data import load_coat
from mnar_recsys.data.files import ChecksumWarning
from mnar_recsys.data.yahoo import TEST_FILE as YAHOO_TEST
from mnar_recsys.data.yahoo import TRAIN_FILE as YAHOO_TRAIN
from mnar_recsys.devices import resolve_device
from mnar_recsys.evaluation.protocol import fit_and_score, mcar_split
from mnar_recsys.pipelines import ratings as ratings_pipeline
from mnar_recsys.pipelines import ratings_config
from mnar_recsys.pipelines.ratings import build
from mnar_recsys.pipelines.ratings_config import RatingsRun, uses_mcar_sample
from mnar_recsys.pipelines.ratings_data import load_data
from mnar_recsys.pipelines.ratings_report import summary_table

REQUIRED = {"model", "seed", "mse", "mae", "ndcg@5", "per_rating", "train_seconds", "predict_seconds", "n_test",
            "config", "provenance"}
# The shared copy sits beside the project root; MNAR_RECSYS_COAT_DIR overrides it.
COAT = Path(os.environ.get("MNAR_RECSYS_COAT_DIR",
                          Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "coat"))


def test_cli_writes_results_table_and_plots(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["ratings", "--users", "300", "--items", "60", "--selection", "race", "--iterations", "20",
                 "--importance-samples", "20",
                 "--seeds", "0,1", "--models", "notmiwae-gaussian,mf,mf-ips,train-mean,oracle",
                 "--out", str(out), "--no-progress"])
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["per_rating_mse.png", "predictions_histogram.png",
                                                     "results.json", "results.md",
                                                     "training_curves.png"]  # no temp files left
    results = json.loads((out / "results.json").read_text())
    assert len(results["records"]) == 10
    for record in results["records"]:
        assert REQUIRED <= set(record)
        assert record["config"]["run"]["iterations"] == 20 and record["provenance"]["package_version"]
        # the not-MIWAE's bound, logged every 100 steps and at the last, and the held-out rows' bound at the
        # checks (here only the last); the baselines have no curve
        curve = record.get("training_curve")
        assert (curve is not None) == (record["model"] == "notmiwae-gaussian")
        assert curve is None or ([i for i, _ in curve["bound"]] == [i for i, _ in curve["validation"]] == [20]
                                 and record["best_iteration"] == 20)
    by_seed = {}
    for record in results["records"]:
        by_seed.setdefault(record["seed"], set()).add(record["n_test"])
    assert all(len(n) == 1 for n in by_seed.values())  # every model of a seed scored on the same entries
    printed = capsys.readouterr().out
    assert "| notmiwae-gaussian | MNAR | 2 |" in printed and "| oracle | reference | 2 |" in printed
    assert ("| mf-ips | MNAR + 5% MCAR | 2 |" in printed
            and "Protocol quick: seeds 0, 1; not-MIWAE iterations 20" in printed)
    assert "| model | trains on | seeds | MCAR MSE" in (out / "results.md").read_text()


def test_the_protocol_sets_what_is_left_unset():
    quick, paper = ratings_config.PROTOCOLS["quick"], ratings_config.PROTOCOLS["paper"]
    run = RatingsRun()
    assert (run.protocol, run.iterations, run.lr, run.seeds) == ("quick", quick["iterations"], quick["lr"],
                                                                 quick["seeds"])
    run = RatingsRun(protocol="paper", seeds=(3,))
    assert (run.iterations, run.lr, run.seeds) == (10_000, 1e-3, (3,)) and paper["seeds"] == (0, 1, 2, 3, 4)
    with pytest.raises(ValueError, match="--protocol must be one of quick, paper, got 'long'"):
        RatingsRun(protocol="long")


def test_model_sets_expand_in_place_and_keep_each_model_once():
    paper = RatingsRun(models=("paper",)).models
    assert paper[-1] == "oracle" and all(ratings_config.published(name) is not None for name in paper[:-1])
    assert {"notmiwae-gaussian", "miwae-categorical", "mf", "pmf", "autorec", "mf-ips"} <= set(paper)
    assert "mf-dr" not in paper and "oracle" not in RatingsRun(data="coat", data_dir="x", models=("paper",)).models
    assert RatingsRun(models=("mf-dr", "paper", "mf")).models == ("mf-dr", *paper)
    default = RatingsRun().models
    assert default == (*ratings_config.DEFAULT_MODELS, "oracle") and "train-mean" in default
    with pytest.raises(ValueError, match="--models names mf more than once"):
        RatingsRun(models=("mf", "paper", "mf"))


def test_the_table_sorts_methods_by_mse_and_puts_reference_rows_last():
    def record(model, mse):
        return {"model": model, "mse": mse, "mae": 0.5, "ndcg@5": 0.8, "train_seconds": 1.0, "predict_seconds": 0.1}
    records = [record("mf", 1.9), record("oracle", 0.4), record("mf-ips", 1.0), record("train-mean", 2.3),
               record("notmiwae-gaussian", 0.9), record("mf", 2.1)]
    table = summary_table(records).splitlines()
    assert [line.split(" | ")[0][2:] for line in table[2:]] == ["notmiwae-gaussian", "mf-ips", "mf", "oracle",
                                                                "train-mean"]
    assert table[4].startswith("| mf | MNAR | 2 | 2.000 ± 0.141 |")
    published = summary_table(records, with_published=True).splitlines()
    assert published[0].endswith("| paper (Yahoo! R3) |") and published[2].endswith("| 0.939 |")
    assert published[5].endswith("| |") or published[5].endswith("|  |")


def test_cli_refuses_bad_requests(tmp_path, capsys):
    assert main(["ratings", "--models", "notmiwae-poisson", "--out", str(tmp_path)]) == 2
    assert "unknown models" in capsys.readouterr().err
    assert main(["ratings", "--data", "coat", "--out", str(tmp_path)]) == 2
    assert "needs --data-dir" in capsys.readouterr().err
    assert main(["ratings", "--models", "mf,pmf,mf", "--out", str(tmp_path)]) == 2
    assert "--models names mf more than once" in capsys.readouterr().err
    assert main(["ratings", "--seeds", "0,1,0", "--out", str(tmp_path)]) == 2
    assert "--seeds names 0 more than once" in capsys.readouterr().err


@pytest.mark.parametrize("arguments, message", [
    (["--lr", "-1"], "--lr must be positive and finite, got -1.0"),
    (["--lr", "inf"], "--lr must be positive and finite, got inf"),
    (["--validation-fraction", "1.5"], r"--validation-fraction must lie in [0, 1), got 1.5"),
    (["--seeds", "0,-1"], "--seeds must lie in 0..4294967295, got -1"),
    (["--seeds", "4294967296"], "--seeds must lie in 0..4294967295, got 4294967296"),
    (["--seeds", "0,,1"], "expected comma-separated integers, got '0,,1'"),
    (["--data-seed", "-2"], "--data-seed must lie in 0..4294967295, got -2"),
    (["--data-dir", "/nonexistent"], "--data synthetic reads no files"),
    (["--models", "mf-ips-given"], "mf-ips-given takes the propensities Coat ships with: use it with --data coat"),
    (["--models", "mf,mf-dr-given"], "mf-dr-given takes the propensities Coat ships with: use it with --data coat"),
    (["--items", "20"], "--users 2000 --items 20: the simulator refuses them (n_items (20) must exceed"),
    (["--models", ","], "expected comma-separated model names, got ','"),
    (["--jobs", "2", "--threads", "2"], "the --jobs workers take one thread each"),
    (["--data", "coat", "--data-dir", "/nonexistent", "--users", "100", "--selection", "independent"],
     "--users, --selection set(s) the simulator, which --data coat does not use"),
])
def test_cli_refuses_options_it_would_ignore_or_misuse_before_any_work(tmp_path, capsys, arguments, message):
    """Each of these once ran (MF with --lr -1 wrote results recording it; --models , ran the default list), or
    failed after other models had been fitted and written, with a message that named no option."""
    try:
        code = main(["ratings", *arguments, "--out", str(tmp_path / "bad")])
    except SystemExit as exit:  # argparse's own refusal of an option's text
        code = exit.code
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_every_model_predicts_on_the_data_sets_rating_scale():
    """A data set rated 0..10 (the simulator's ratings doubled) sets every model's rating scale: the
    predictions stay within 0..10 and reach past 5, the top of the default scale."""
    data = load_data(RatingsRun(users=200, items=40, selection="race"))
    data = dataclasses.replace(data, train=data.train * 2, test=data.test * 2, rating_scale=(0, 10), truth=None)
    split = mcar_split(data, seed=0)
    run = RatingsRun(users=200, items=40, selection="race", iterations=30, lr=1e-2, importance_samples=20)
    for name in ("notmiwae-gaussian", "notmiwae-categorical", "mf", "pmf", "mf-ips", "mf-ips-mask", "mf-dr"):
        _, predictions = fit_and_score(build(name, run, data, seed=0, progress=False), split, uses_mcar_sample(name))
        assert predictions.min() >= 0 and predictions.max() <= 10, name
        assert predictions.max() > 5.5, (name, predictions.max())


def test_selection_reaches_the_simulator():
    data = load_data(RatingsRun(users=300, items=60, selection="independent"))
    assert data.meta["config"]["selection"] == "independent" and "selection_intercept" in data.meta["params"]
    assert load_data(RatingsRun(users=300, items=60, selection="race")).meta["config"]["selection"] == "race"
    assert RatingsRun().selection == "logistic" and (RatingsRun().users, RatingsRun().items) == (2_000, 500)
    with pytest.raises(ValueError, match="selection must be one of"):
        RatingsRun(selection="lottery")


def test_notmiwae_beats_miwae_and_mf_on_coat():
    """Real MNAR data. MCAR MSE with 300 steps at lr 3e-3 and K_pred 200, seeds 0 / 1 / 2: not-MIWAE
    1.110 / 1.124 / 1.149, MIWAE 1.354 / 1.342 / 1.364, MF 1.222 / 1.208 / 1.217 (published MF 1.202).
    At the paper's lr 1e-3, 300 steps are not enough: not-MIWAE 1.205 / 1.226 / 1.209, level with MF."""
    if not (COAT / "train.ascii").exists():
        pytest.skip(f"Coat data not found at {COAT.resolve()}")
    data = load_coat(COAT)
    split = mcar_split(data, seed=0)
    run = RatingsRun(data="coat", data_dir=str(COAT), iterations=300, lr=3e-3, importance_samples=200)
    mse = {name: fit_and_score(build(name, run, data, seed=0, progress=False), split)[0]["mse"]
           for name in ("notmiwae-gaussian", "miwae-gaussian", "mf")}
    assert mse["notmiwae-gaussian"] < mse["miwae-gaussian"] - 0.15
    assert mse["notmiwae-gaussian"] < mse["mf"] - 0.05


def small_run(out: Path, *options: str) -> int:
    """`mnar-recsys ratings` on 300 x 60 synthetic ratings, seed 0, K_pred 20, with `options` added."""
    return main(["ratings", "--users", "300", "--items", "60", "--selection", "race", "--importance-samples", "20",
                 "--seeds", "0",
                 *options, "--out", str(out), "--no-progress"])


def test_a_rerun_into_the_same_folder_leaves_no_figure_of_the_earlier_run(tmp_path):
    out = tmp_path / "run"
    assert small_run(out, "--iterations", "5", "--models", "notmiwae-gaussian") == 0
    assert (out / "training_curves.png").exists()
    (out / "notes.txt").write_text("mine")
    assert small_run(out, "--models", "mf") == 0
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "per_rating_mse.png", "predictions_histogram.png",
                                                     "results.json", "results.md"]


def test_a_rerun_that_fails_before_its_first_record_leaves_the_earlier_results(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert small_run(out, "--models", "mf") == 0
    earlier = (out / "results.json").read_text()

    def fail(*args):
        raise ValueError("the first model failed")
    monkeypatch.setattr(ratings_pipeline, "fit_one", fail)
    assert small_run(out, "--models", "mf") == 2
    assert "the first model failed" in capsys.readouterr().err
    assert (out / "results.json").read_text() == earlier and (out / "per_rating_mse.png").exists()


def test_a_run_that_stops_part_way_says_so_in_its_files(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    fit_one = ratings_pipeline.fit_one

    def fail_on_pmf(run, seed, name, progress):
        if name == "pmf":
            raise ValueError("stopped")
        return fit_one(run, seed, name, progress)
    monkeypatch.setattr(ratings_pipeline, "fit_one", fail_on_pmf)
    assert small_run(out, "--models", "mf,pmf") == 2
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] is False and results["planned_runs"] == 2 and len(results["records"]) == 1
    assert "**Incomplete**: 1 of the 2 (seed, model) runs are not in it yet" in (out / "results.md").read_text()
    monkeypatch.undo()
    assert small_run(out, "--models", "mf,pmf") == 0
    assert json.loads((out / "results.json").read_text())["complete"] is True
    assert "Incomplete" not in (out / "results.md").read_text()


def test_an_out_that_is_a_file_is_refused_before_any_work(tmp_path, capsys):
    (tmp_path / "taken").write_text("mine")
    for out in (tmp_path / "taken", "", tmp_path / "taken" / "sub" / "deeper"):
        assert main(["ratings", "--models", "mf", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {tmp_path / 'taken'} is a file, not a folder" in err and "--out is empty" in err
    assert f"--out {tmp_path / 'taken' / 'sub' / 'deeper'} lies under {tmp_path / 'taken'}, a file" in err
    assert (tmp_path / "taken").read_text() == "mine"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal of a GPU that is not there")
def test_a_gpu_that_is_not_there_is_refused_before_an_earlier_runs_files_go(tmp_path, capsys):
    out = tmp_path / "run"
    assert small_run(out, "--models", "mf") == 0
    assert small_run(out, "--models", "mf", "--device", "cuda") == 2
    assert "sees no GPU" in capsys.readouterr().err
    assert small_run(out, "--models", "mf", "--device", "cuda:1") == 2  # a numbered GPU is a name it knows
    assert "sees no GPU" in capsys.readouterr().err
    assert (out / "results.json").exists()


def test_a_device_name_no_machine_has_is_refused_naming_the_option(tmp_path, capsys):
    assert main(["ratings", "--device", "gpu", "--out", str(tmp_path / "out")]) == 2
    assert "--device must be one of ('auto', 'cpu', 'cuda') (or 'cuda:N'), got 'gpu'" in capsys.readouterr().err


def test_cli_validation_fraction_records_the_kept_iteration(tmp_path):
    """--validation-fraction holds out train users, checks their bound and records the iteration kept."""
    out = tmp_path / "run"
    code = small_run(out, "--iterations", "500", "--models", "notmiwae-gaussian,mf", "--validation-fraction", "0.2")
    assert code == 0
    records = {r["model"]: r for r in json.loads((out / "results.json").read_text())["records"]}
    checks = records["notmiwae-gaussian"]["training_curve"]["validation"]
    assert [i for i, _ in checks] == [250, 500]
    assert records["notmiwae-gaussian"]["best_iteration"] == max(checks, key=lambda check: check[1])[0]
    assert records["notmiwae-gaussian"]["config"]["run"]["validation_fraction"] == 0.2
    assert "best_iteration" not in records["mf"]


def test_the_data_seed_draws_other_synthetic_data():
    first, second = (load_data(RatingsRun(users=300, items=60, selection="race", data_seed=seed)) for seed in (0, 1))
    assert first.train.shape == second.train.shape and (first.train != second.train).nnz > 0


@pytest.mark.slow  # 25-40 s: processes started and joined
def test_ratings_runs_data_parallel_under_torchrun(tmp_path):
    """The same command under torchrun: it runs as two processes, and process 0 alone scores, prints and
    writes."""
    out = tmp_path / "ddp"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    launched = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "mnar_recsys.cli",
         "ratings", "--users", "200", "--items", "30", "--selection", "race", "--iterations", "30",
         "--importance-samples", "20",
         "--seeds", "0", "--models", "notmiwae-gaussian,mf", "--device", "cpu", "--out", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=300, env=env)
    assert launched.returncode == 0, launched.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert [r["model"] for r in results["records"]] == ["notmiwae-gaussian", "mf"]
    assert results["config"]["processes"] == 2 and results["config"]["backend"] == "gloo"
    assert launched.stdout.count("| notmiwae-gaussian | MNAR | 1 |") == 1  # one table, printed by process 0 only


@pytest.mark.slow  # 25-40 s: processes started and joined
def test_worker_processes_give_the_records_of_a_one_process_run(tmp_path, capsys):
    """--jobs 2 shares the (seed, model) runs out to spawned one-thread workers: the same records, in the
    same order, with the same numbers as one thread here."""
    options = ["--iterations", "10", "--seeds", "0,1", "--models", "notmiwae-gaussian,mf,oracle"]
    assert small_run(tmp_path / "one", *options) == 0
    assert small_run(tmp_path / "two", *options, "--jobs", "2") == 0
    one, two = (json.loads((tmp_path / name / "results.json").read_text()) for name in ("one", "two"))
    assert two["config"]["jobs"] == 2 and two["records"][0]["config"]["run"]["jobs"] == 2
    assert [(r["seed"], r["model"]) for r in two["records"]] == [(r["seed"], r["model"]) for r in one["records"]]
    assert [r["mse"] for r in two["records"]] == [r["mse"] for r in one["records"]]
    assert one["records"][0]["mse"] != one["records"][3]["mse"]  # the seeds differ, so the comparison has teeth
    assert {p.name for p in (tmp_path / "two").iterdir()} == {p.name for p in (tmp_path / "one").iterdir()}
    assert main(["ratings", "--jobs", "0", "--out", str(tmp_path / "bad")]) == 2
    assert "--jobs must be at least 1" in capsys.readouterr().err


def test_cli_unobserved_samples_is_recorded(tmp_path, capsys):
    """--unobserved-samples reaches the not-MIWAE's ModelConfig and the results config; 0 is refused."""
    out = tmp_path / "run"
    code = small_run(out, "--iterations", "20", "--models", "notmiwae-gaussian", "--unobserved-samples", "7")
    assert code == 0
    record = json.loads((out / "results.json").read_text())["records"][0]
    assert record["config"]["run"]["unobserved_samples"] == 7
    assert record["config"]["model"]["model"]["unobserved_samples"] == 7
    # the whole model as fitted, not only the variant's settings, with the seed that drew its numbers
    assert record["config"]["model"]["model"]["latent_dim"] == 30 and record["config"]["model"]["model"]["n_features"]
    assert record["config"]["model"]["train"]["seed"] == record["config"]["model"]["importance"]["seed"] == 0
    assert record["config"]["run"]["device_used"] == str(resolve_device("auto"))
    assert record["config"]["run"]["threads"] >= 1
    assert record["config"]["run"]["backend"] is None  # no process group: one process
    assert "7 unobserved items per user" in (out / "results.md").read_text()
    assert main(["ratings", "--unobserved-samples", "0", "--out", str(tmp_path)]) == 2
    assert "--unobserved-samples must be a positive integer, got 0" in capsys.readouterr().err


def test_baseline_records_keep_their_propensity_settings_and_the_constants_value(tmp_path):
    out = tmp_path / "run"
    assert small_run(out, "--models", "mf-ips,mf-ips-mask,mf-dr,constant-2,train-mean") == 0
    records = {r["model"]: r["config"] for r in json.loads((out / "results.json").read_text())["records"]}
    assert records["mf-ips"]["model"]["propensities"] == {"estimator": "naive-bayes", "min_relative": 0.1}
    mask = records["mf-ips-mask"]["model"]["propensities"]
    assert mask["estimator"] == "mask" and mask["regularization"] == 3.0 and mask["factors"] == 30
    assert records["mf-ips-mask"]["model"]["l2"] == records["mf-ips"]["model"]["l2"]  # the MF settings stay
    assert records["mf-dr"]["model"]["propensities"] == records["mf-ips"]["model"]["propensities"]
    assert records["mf-dr"]["model"]["l2"] == 0.3
    # its imputation model is the MF-IPS row's: MF's defaults, this run's seed and rating scale
    ips_settings = {key: value for key, value in records["mf-ips"]["model"].items() if key != "propensities"}
    assert records["mf-dr"]["model"]["imputation"] == ips_settings
    assert records["constant-2"]["model"] == {"value": 2.0, "rating_scale": [1.0, 5.0]}
    assert 1 < records["train-mean"]["model"]["value"] < 5
    # the simulator's default test users, resolved, and the MCAR sample's share
    assert records["mf-ips"]["run"]["test_users"] == 300 * 5_400 // 15_400
    assert records["mf-ips"]["run"]["mcar_sample_fraction"] == 0.05


@pytest.mark.parametrize("option, refusal", [("--iterations", "a positive integer"),
                                             ("--batch-size", "a positive integer"),
                                             ("--importance-samples", "a positive integer"),
                                             ("--users", "at least 1"), ("--items", "at least 1")])
def test_cli_counts_below_one_are_refused_before_any_work(tmp_path, capsys, option, refusal):
    """Named by their option, before the data is read or made (here: Coat files that are not there); the
    not-MIWAE's counts in the words of TrainConfig and ImportanceConfig, which check them."""
    code = main(["ratings", "--data", "coat", "--data-dir", str(tmp_path / "none"), option, "0",
                 "--out", str(tmp_path / "bad")])
    assert code == 2 and f"{option} must be {refusal}, got 0" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("value", ["0", "2001"])
def test_cli_test_users_must_be_some_of_the_users(tmp_path, capsys, value):
    """0 would leave no MCAR ratings to score; more than --users cannot be drawn."""
    assert main(["ratings", "--users", "2000", "--test-users", value, "--out", str(tmp_path / "bad")]) == 2
    assert f"--test-users must lie in 1..2000 (--users), got {value}" in capsys.readouterr().err


def _write_yahoo_format(directory: Path, data) -> Path:
    """Write `data`'s train and test into a new folder `directory` in the published Yahoo! R3 format:
    user<TAB>song<TAB>rating, 1-based ids, CRLF line ends."""
    directory.mkdir()
    for name, matrix in ((YAHOO_TRAIN, data.train), (YAHOO_TEST, data.test)):
        coo = matrix.tocoo()
        lines = (f"{u + 1}\t{i + 1}\t{int(r)}\r\n" for u, i, r in zip(coo.row, coo.col, coo.data))
        (directory / name).write_bytes("".join(lines).encode())
    return directory


def test_cli_runs_the_comparison_on_yahoo_files(tmp_path, capsys):
    """`mnar-recsys ratings --data yahoo --data-dir DIR` on files in the real format (simulated ratings) is all
    it takes: every model is scored on the same MCAR entries, those outside MF-IPS's 5% sample."""
    data = load_data(RatingsRun(users=200, items=40, selection="race", test_users=80))
    files = _write_yahoo_format(tmp_path / "yahoo", data)
    out = tmp_path / "run"
    with pytest.warns(ChecksumWarning):
        code = main(["ratings", "--data", "yahoo", "--data-dir", str(files), "--models", "notmiwae-gaussian,mf,mf-ips",
                     "--iterations", "20", "--importance-samples", "20", "--seeds", "0", "--out", str(out),
                     "--no-progress"])
    assert code == 0
    records = json.loads((out / "results.json").read_text())["records"]
    assert [r["model"] for r in records] == ["notmiwae-gaussian", "mf", "mf-ips"]
    expected = data.test.nnz - mcar_split(data, seed=0).mcar_sample.nnz
    assert {r["n_test"] for r in records} == {expected}
    assert all(r["config"]["run"]["data"] == "yahoo" for r in records)
    assert "| mf-ips | MNAR + 5% MCAR | 1 |" in capsys.readouterr().out


def test_tune_baselines_chooses_each_seeds_hyper_parameters_on_its_train_ratings(tmp_path):
    """--tune-baselines fits each tunable baseline with the grid point its held-out train ratings chose, and
    records the choice, every grid point's score and the time; the untunable constant keeps none."""
    from baselines.registry import GRIDS, tune_baseline

    out = tmp_path / "tuned"
    assert small_run(out, "--models", "mf,mf-ips,constant-2", "--tune-baselines", "--seeds", "0,1") == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["tune_baselines"] is True
    assert "chosen for each seed on 10% of its train ratings held out" in (out / "results.md").read_text()
    records = {(r["model"], r["seed"]): r for r in results["records"]}
    assert "tuning" not in records["constant-2", 0]
    data = load_data(RatingsRun(users=300, items=60, selection="race", seeds=(0,)))
    for seed in (0, 1):
        split = mcar_split(data, seed)
        for name in ("mf", "mf-ips"):
            tuning = records[name, seed]["tuning"]
            chosen, _ = tune_baseline(name, split.train, seed=seed, mcar_sample=split.mcar_sample)
            assert tuning["chosen"] == chosen and len(tuning["validation"]) == len(GRIDS[name])
            assert {key: records[name, seed]["config"]["model"][key] for key in chosen} == chosen
    assert small_run(tmp_path / "plain", "--models", "mf") == 0
    plain = json.loads((tmp_path / "plain" / "results.json").read_text())["records"][0]
    assert "tuning" not in plain and plain["config"]["model"]["l2"] == 0.2
    # the tuned fit is not the default one: the flag changed what was scored
    assert plain["mse"] != records["mf", 0]["mse"]


def test_tune_baselines_without_a_tunable_model_is_refused(tmp_path, capsys):
    assert main(["ratings", "--models", "constant-2,oracle", "--tune-baselines", "--out", str(tmp_path)]) == 2
    from baselines.registry import GRIDS

    assert f"--tune-baselines tunes {', '.join(GRIDS)}: add one of them to --models" in capsys.readouterr().err
    assert {"mf", "pmf", "autorec", "mf-ips", "mf-dr-jl", "cpt-v-mcar", "mf-mnar"} <= set(GRIDS)


@pytest.mark.slow
def test_the_papers_table_is_one_command_on_yahoo_files(tmp_path, capsys):
    """`mnar-recsys ratings --data yahoo --data-dir DIR --models paper` runs every row of the paper's Yahoo! R3
    table the package has, on files in the real format, and prints each row's published number beside ours."""
    data = load_data(RatingsRun(users=300, items=60, selection="race", test_users=120))
    files = _write_yahoo_format(tmp_path / "yahoo", data)
    out = tmp_path / "run"
    with pytest.warns(ChecksumWarning):
        code = main(["ratings", "--data", "yahoo", "--data-dir", str(files), "--models", "paper", "--iterations", "20",
                     "--importance-samples", "20", "--out", str(out), "--no-progress"])
    assert code == 0
    records = json.loads((out / "results.json").read_text())["records"]
    paper = ratings_config.model_set("paper", "yahoo")
    assert [r["model"] for r in records] == list(paper) and len(paper) == 16
    printed = capsys.readouterr().out
    for name in paper:
        assert f"| {ratings_config.published(name):.3f} |" in next(line for line in printed.splitlines()
                                                                     if line.startswith(f"| {name} |"))
