import numpy as np
import pytest

from baselines.registry import BASELINES, make_baseline


def test_names_cover_the_brief():
    assert set(BASELINES) == {"mf", "pmf", "mf-ips", "mf-ips-mask", "constant-2", "train-mean"}


@pytest.mark.parametrize("name", BASELINES)
def test_every_baseline_fits_and_predicts_through_the_registry(name, mnar_data):
    kwargs = {"mcar_sample": mnar_data.mcar_test(0.02, seed=0)} if name == "mf-ips" else {}
    if name in ("mf", "pmf", "mf-ips", "mf-ips-mask"):
        kwargs["seed"] = 1
    model = make_baseline(name, **kwargs)
    assert model.name == name
    u, i, _ = mnar_data.all_cells()
    pred = model.fit(mnar_data.train).predict(u[:50], i[:50])
    assert pred.shape == (50,) and np.isfinite(pred).all()
    assert pred.min() >= 1.0 and pred.max() <= 5.0


def test_unknown_name_and_bad_hyper_parameters():
    with pytest.raises(ValueError, match="unknown baseline"):
        make_baseline("svd++")
    with pytest.raises(TypeError):
        make_baseline("mf", dims=3)
