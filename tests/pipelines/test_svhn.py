"""The SVHN clipping pipeline on the digits stand-in, and its input errors."""

import json

import numpy as np
import pytest
import torch
from scipy.io import savemat

from mnar_recsys.cli import main
from mnar_recsys.data.svhn import digits_stand_in
from mnar_recsys.pipelines.svhn import SVHNConfig, check_images, run_clipping


def test_true_clipping_model_imputes_bright_pixels(tmp_path):
    # The stand-in every 4th pixel (8x8, the digits' own resolution) and narrow convolutions keep this
    # fast; measured RMSE 0.10 (not-MIWAE) vs 0.38 (MIWAE), constant ones 0.17.
    images = digits_stand_in(190, seed=0)[:, ::4, ::4]
    config = SVHNConfig(iterations=400, refit_iterations=20, batch_size=32, lr=1e-2, importance_samples=50,
                        ll_samples=50, conv_channels="8,16,32")
    payload = run_clipping(images[:150], images[150:], config, tmp_path, "digits-stand-in")
    results = payload["results"]
    assert results["notmiwae"]["rmse"] < results["miwae"]["rmse"] - 0.1
    # the not-MIWAE imputes clipped pixels above the clipping point; the MIWAE, trained on what it saw, does not
    assert results["notmiwae"]["fraction_imputed_above_clip"] > 0.5
    assert results["miwae"]["fraction_imputed_above_clip"] < 0.1
    assert all(np.isfinite(results[m]["test_log_likelihood"]) for m in ("notmiwae", "miwae"))
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["provenance"]["commit"] is not None and saved["config"]["lr"] == 0.01 and saved["complete"] is True
    assert saved["threads"] == torch.get_num_threads() and saved["device_used"] in ("cpu", "cuda:0")
    assert {p.name for p in tmp_path.iterdir()} >= {"results.json", "results.md", "histograms.png", "images.png"}
    assert "not-MIWAE" in (tmp_path / "results.md").read_text()


def test_cli_shows_progress_bars_unless_told_not_to(tmp_path, capsys):
    arguments = ["svhn", "--iterations", "2", "--refit-iterations", "1", "--importance-samples", "2",
                 "--ll-samples", "2", "--n-train", "40", "--n-test", "8", "--conv-channels", "2,2,2"]
    assert main([*arguments, "--out", str(tmp_path / "bars")]) == 0
    err = capsys.readouterr().err
    assert all(bar in err for bar in ("training", "imputing", "log-likelihood"))
    assert main([*arguments, "--no-progress", "--out", str(tmp_path / "quiet")]) == 0
    err = capsys.readouterr().err
    assert not any(bar in err for bar in ("training", "imputing", "log-likelihood"))


def test_bad_inputs(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"shape \(N, side, side\).*got \(3, 28, 28\)"):
        check_images(np.zeros((3, 28, 28)), "training")
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        check_images(np.full((3, 8, 8), 2.0), "training")
    savemat(tmp_path / "train_32x32.mat", {"y": np.zeros((3, 1))})
    assert main(["svhn", "--data-dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "no variable 'X'" in capsys.readouterr().err
    assert main(["svhn", "--data", "svhn", "--out", str(tmp_path / "out")]) == 2
    assert "needs --data-dir" in capsys.readouterr().err
    # refused as the config is made, before the (missing) files are looked for
    assert main(["svhn", "--data-dir", str(tmp_path / "none"), "--conv-channels", "8,x", "--out",
                 str(tmp_path / "out")]) == 2
    assert "--conv-channels must be comma-separated integers" in capsys.readouterr().err
    assert main(["svhn", "--n-train", "5000", "--n-test", "16", "--out", str(tmp_path / "out")]) == 2
    assert "1,797 images: --n-train 5000 and --n-test 16 ask for 5016" in capsys.readouterr().err
    assert main(["svhn", "--n-test", "1797", "--out", str(tmp_path / "out")]) == 2
    assert "--n-test 1797 leaves none of the digits stand-in's 1,797 images for training" in capsys.readouterr().err
    # refused as the config is made, before the (missing) files are looked for
    assert main(["svhn", "--data-dir", str(tmp_path / "none"), "--ll-samples", "0",
                 "--out", str(tmp_path / "out")]) == 2
    assert "--ll-samples must be at least 1, got 0" in capsys.readouterr().err
    assert main(["svhn", "--n-test", "-1", "--out", str(tmp_path / "out")]) == 2
    assert "--n-test must be at least 0, got -1" in capsys.readouterr().err
    assert main(["svhn", "--device", "gpu", "--out", str(tmp_path / "out")]) == 2
    assert "--device must be one of ('auto', 'cpu', 'cuda') (or 'cuda:N'), got 'gpu'" in capsys.readouterr().err
    assert main(["svhn", "--seed", "-1", "--out", str(tmp_path / "out")]) == 2
    assert "--seed must lie in 0..18446744073709551615, got -1" in capsys.readouterr().err
    assert main(["svhn", "--lr", "nan", "--out", str(tmp_path / "out")]) == 2
    assert "--lr must be positive and finite, got nan" in capsys.readouterr().err
    # refused before training, which at the defaults takes hours, rather than when the results are written
    (tmp_path / "taken").write_text("mine")
    assert main(["svhn", "--out", str(tmp_path / "taken")]) == 2
    assert f"--out {tmp_path / 'taken'} is a file, not a folder" in capsys.readouterr().err


def test_cli_runs_on_mat_files_in_the_real_format(tmp_path, capsys):
    """`mnar-recsys svhn --data-dir DIR` on train_32x32.mat / test_32x32.mat written as the published files are
    (X: 32 x 32 x 3 x N uint8, y: N x 1): the run reads them as gray scale, writes its four files and
    records the source and the image counts."""
    rng = np.random.default_rng(0)
    for name, n in (("train_32x32.mat", 12), ("test_32x32.mat", 6)):
        savemat(tmp_path / name, {"X": rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8),
                                  "y": rng.integers(1, 11, (n, 1))})
    out = tmp_path / "out"
    assert main(["svhn", "--data-dir", str(tmp_path), "--iterations", "2", "--refit-iterations", "1",
                 "--importance-samples", "2", "--ll-samples", "2", "--batch-size", "4", "--conv-channels", "2,2,2",
                 "--no-progress", "--out", str(out)]) == 0
    payload = json.loads((out / "results.json").read_text())
    assert (payload["n_train"], payload["n_test"]) == (12, 6) and "svhn" in payload["source"].lower()
    assert 0 < payload["missing_rate"] < 1
    assert {p.name for p in out.iterdir()} == {"results.json", "results.md", "histograms.png", "images.png"}
    assert "SVHN clipping" in capsys.readouterr().out
