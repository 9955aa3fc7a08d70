"""`mnar-recsys uci-table`: runs made apart merge into one table, and files that cannot be merged are refused."""

import json

import numpy as np
import pytest

from mnar_recsys.cli import main
from mnar_recsys.pipelines.uci_table import _row

QUICK = ["--dataset", "breast", "--iterations", "5", "--importance-samples", "10", "--runs", "1"]


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """Four `uci` runs on Breast, as one would make them on separate cores: seeds 0 and 1 of the mean
    and the agnostic not-MIWAE, seed 0 of the agnostic one imputing from the drawn x_m, and seed 2 of
    both keeping the best of two fits."""
    monkeypatch.delenv("MNAR_RECSYS_UCI_DIR", raising=False)  # Breast then comes from scikit-learn
    for seed in (0, 1):
        assert main(["uci", *QUICK, "--models", "mean", "notmiwae-agnostic", "--seed", str(seed),
                     "--out", str(tmp_path / f"seed{seed}"), "--no-progress"]) == 0
    assert main(["uci", *QUICK, "--models", "notmiwae-agnostic", "--seed", "0", "--sampled-imputation", "draws",
                 "--out", str(tmp_path / "draws"), "--no-progress"]) == 0
    assert main(["uci", *QUICK, "--models", "mean", "notmiwae-agnostic", "--seed", "2", "--n-init", "2",
                 "--out", str(tmp_path / "best"), "--no-progress"]) == 0
    return tmp_path


def rmse(path, model):
    return [r["rmse"] for r in json.loads(path.read_text())["records"] if r["model"] == model]


def test_runs_merge_into_one_table(runs, capsys):
    out = runs / "table"
    assert main(["uci-table", str(runs / "seed0"), str(runs / "seed1" / "results.json"), str(runs / "draws"),
                 str(runs / "best"), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.md", "rmse.png"]
    merged = json.loads((out / "results.json").read_text())
    assert len(merged["sources"]) == 4 and merged["protocol"]["iterations"] == 5 and merged["complete"] is True
    # a best-of-two fit is not one run of the protocol, so it gets a row of its own; the mean has no fits
    # to choose from and pools with its other seeds
    assert [(r["model"], r["seed"]) for r in merged["records"]] == [
        ("notmiwae-agnostic", 0), ("notmiwae-agnostic", 1), ("notmiwae-agnostic (best of 2)", 2),
        ("notmiwae-agnostic (drawn x_m)", 0), ("mean", 0), ("mean", 1), ("mean", 2)]
    assert all(r["source"].endswith("results.json") for r in merged["records"])
    agnostic = rmse(runs / "seed0" / "results.json", "notmiwae-agnostic") \
        + rmse(runs / "seed1" / "results.json", "notmiwae-agnostic")
    mean, se = np.mean(agnostic), np.std(agnostic, ddof=1) / np.sqrt(2)
    table = (out / "results.md").read_text()
    # the two seeds pooled, counts shown since the drawn-x_m row holds one run; the paper's 1.10 alongside
    assert f"| notmiwae-agnostic | {mean:.3f} ± {se:.3f}, n=2 |" in table
    assert f"| notmiwae-agnostic (drawn x_m) | {rmse(runs / 'draws' / 'results.json', 'notmiwae-agnostic')[0]:.3f}, " \
           "n=1 |" in table
    assert "| notmiwae-agnostic (drawn x_m) | 1.10 |" in table
    best = rmse(runs / "best" / "results.json", "notmiwae-agnostic")[0]
    assert f"| notmiwae-agnostic (best of 2) | {best:.3f}, n=1 |" in table
    assert "merged 7 runs from 4 files" in capsys.readouterr().out
    assert "Incomplete" not in table


def test_a_stopped_run_is_named_in_the_table(runs):
    """A `uci` run stopped early leaves "complete": false in its results.json; the table says which source it was."""
    path = runs / "seed1" / "results.json"
    payload = json.loads(path.read_text())
    path.write_text(json.dumps({**payload, "complete": False}))
    assert main(["uci-table", str(runs / "seed0"), str(path), "--out", str(runs / "t")]) == 0
    table = (runs / "t" / "results.md").read_text()
    assert table.startswith(f"**Incomplete**: {path} stopped before every run was written")


def test_a_table_merged_into_the_folder_it_reads_is_not_read_again(runs, capsys):
    """The second merge would otherwise find the first's results.json beside the runs and refuse its records
    as repeats; a merged table passed on its own is refused by name."""
    for _ in range(2):
        assert main(["uci-table", str(runs / "seed0"), str(runs / "seed1"), "--out", str(runs / "seed1" / "t")]) == 0
    assert "merged 4 runs from 2 files" in capsys.readouterr().out
    assert main(["uci-table", str(runs / "seed1" / "t" / "results.json"), "--out", str(runs / "t2")]) == 2
    assert "a table merged by `mnar-recsys uci-table`, not a `uci` run's results" in capsys.readouterr().err
    # a run's own folder is no place for the table: its results would be overwritten
    before = (runs / "seed0" / "results.json").read_text()
    assert main(["uci-table", str(runs), "--out", str(runs / "seed0")]) == 2
    assert f"--out {runs / 'seed0'} holds a `uci` run's results.json" in capsys.readouterr().err
    assert (runs / "seed0" / "results.json").read_text() == before


def test_files_that_cannot_be_merged_are_refused(runs, tmp_path, capsys):
    seed0 = runs / "seed0" / "results.json"
    copy = tmp_path / "copy" / "results.json"
    copy.parent.mkdir()
    copy.write_text(seed0.read_text())
    assert main(["uci-table", str(seed0), str(copy), "--out", str(tmp_path / "t1")]) == 2
    error = capsys.readouterr().err
    assert "breast, mean, seed 0 is in both" in error and str(seed0) in error and str(copy) in error

    longer = json.loads(seed0.read_text())
    longer["protocol"]["iterations"] = 100_000
    copy.write_text(json.dumps(longer))
    assert main(["uci-table", str(runs / "seed1"), str(copy), "--out", str(tmp_path / "t2")]) == 2
    assert f"{copy} has iterations = 100000 but" in capsys.readouterr().err

    longer["protocol"]["iterations"] = 5
    longer["records"][0]["dataset"] = "iris"
    copy.write_text(json.dumps(longer))
    assert main(["uci-table", str(copy), "--out", str(tmp_path / "t3")]) == 2
    assert f"{copy}: record 0 is on 'iris', not one of banknote" in capsys.readouterr().err
    del longer["records"][1]["rmse"]
    copy.write_text(json.dumps(longer))
    assert main(["uci-table", str(copy), "--out", str(tmp_path / "t3")]) == 2
    assert f"{copy}: record 0 is on 'iris'" in capsys.readouterr().err  # the first fault named first
    longer["records"][0]["dataset"] = "breast"
    copy.write_text(json.dumps(longer))
    assert main(["uci-table", str(copy), "--out", str(tmp_path / "t3")]) == 2
    assert f"{copy}: record 1 lacks rmse" in capsys.readouterr().err

    longer["records"][1]["rmse"], longer["records"][1]["seed"] = 1.0, [0]
    copy.write_text(json.dumps(longer))
    assert main(["uci-table", str(copy), "--out", str(tmp_path / "t3")]) == 2
    assert f"{copy}: record 1 has seed [0], expected an integer" in capsys.readouterr().err
    longer["records"] = []
    copy.write_text(json.dumps(longer))
    assert main(["uci-table", str(copy), "--out", str(tmp_path / "t3")]) == 2
    assert f"no records in {copy}: nothing to tabulate" in capsys.readouterr().err
    copy.write_bytes(b"\xff\xfe")
    assert main(["uci-table", str(copy), "--out", str(tmp_path / "t3")]) == 2
    assert f"{copy}: not a results.json written by `mnar-recsys uci` (not JSON: " in capsys.readouterr().err

    copy.write_text(json.dumps({"records": []}))
    assert main(["uci-table", str(copy), "--out", str(tmp_path / "t3")]) == 2
    assert (f"{copy}: not a results.json written by `mnar-recsys uci` (expected an object with a 'protocol' "
            "object and a 'records' list)") in capsys.readouterr().err
    copy.write_text("{")
    assert main(["uci-table", str(copy), "--out", str(tmp_path / "t3")]) == 2
    assert f"{copy}: not a results.json written by `mnar-recsys uci` (not JSON: " in capsys.readouterr().err

    assert main(["uci-table", str(tmp_path / "nowhere"), "--out", str(tmp_path / "t4")]) == 2
    assert "nowhere: no such file or folder" in capsys.readouterr().err
    assert not any((tmp_path / name).exists() for name in ("t1", "t2", "t3", "t4"))  # nothing half-written


def test_a_variant_merges_beside_its_data_set_and_unknown_sets_are_refused(tmp_path, capsys):
    def results(path, dataset, seed):
        record = {"dataset": dataset, "model": "mean", "seed": seed, "rmse": 1.7, "mask_accuracy": None}
        path.mkdir()
        (path / "results.json").write_text(json.dumps({"protocol": {"iterations": 5}, "records": [record]}))
        return str(path)

    files = [results(tmp_path / "a", "breast", 0), results(tmp_path / "b", "yeast-no-erl", 0),
             results(tmp_path / "c", "yeast", 0)]
    assert main(["uci-table", *files, "--out", str(tmp_path / "t")]) == 0
    merged = json.loads((tmp_path / "t" / "results.json").read_text())
    assert [r["dataset"] for r in merged["records"]] == ["yeast", "yeast-no-erl", "breast"]
    assert main(["uci-table", results(tmp_path / "d", "yeast-7", 0), "--out", str(tmp_path / "u")]) == 2
    assert "record 0 is on 'yeast-7', not one of banknote, concrete, red, white, yeast, yeast-no-erl, breast" \
        in capsys.readouterr().err


def test_the_miwae_imputing_alike_either_way_gets_no_drawn_row():
    """The MIWAE's missing factor reads 'sampled' as the agnostic model's does, but with no missing model it
    imputes the same under --sampled-imputation draws: its runs pool with the others rather than get a row."""
    draws = {"sampled_imputation": "draws"}
    miwae = {"model": "miwae", "config": {"model": {"missing": "mcar", "missing_factor": "sampled"}}}
    agnostic = {"model": "notmiwae-agnostic", "config": {"model": {"missing": "agnostic", "missing_factor": "sampled"}}}
    assert _row(miwae, draws) == "miwae"
    assert _row(agnostic, draws) == "notmiwae-agnostic (drawn x_m)"
    assert _row(agnostic, {"sampled_imputation": "decoder-mean"}) == "notmiwae-agnostic"
