import numpy as np
import pytest

from baselines.registry import BASELINES, GRIDS, SPECS, make_baseline


def test_names_cover_the_brief():
    assert set(BASELINES) == {"mf", "pmf", "autorec", "gaussian-vae", "mf-ips", "mf-ips-mask", "mf-ips-given", "mf-dr",
                              "mf-dr-mask", "mf-dr-given", "mf-dr-jl", "mf-dr-jl-mask", "nfm-dr-jl", "nfm-dr-jl-mask",
                              "mf-mnar", "mixture", "cpt-v", "cpt-v-mcar", "logit-vd", "logit-vd-mcar", "constant-2",
                              "train-mean"}


def test_the_specs_say_what_the_pipelines_need():
    """Fitting and scoring, tuning and the results table read these traits; each must match the model built."""
    for name, spec in SPECS.items():
        assert bool(spec.grid) == (name in GRIDS)
        assert spec.uses_mcar_sample == (name in {"mf-ips", "mf-dr", "mf-dr-jl", "nfm-dr-jl", "cpt-v-mcar",
                                                  "logit-vd-mcar"}), name
        assert spec.given_propensities == name.endswith("-given"), name
        assert spec.reference == (not spec.seeded) == (name in {"constant-2", "train-mean"}), name
    assert {name: spec.published for name, spec in SPECS.items() if spec.published} == {
        "mf": 1.891, "pmf": 1.709, "autorec": 1.438, "mf-ips": 0.989, "cpt-v": 1.115, "cpt-v-mcar": 1.115,
        "logit-vd": 1.301, "logit-vd-mcar": 1.301, "mf-dr-jl": 0.966, "nfm-dr-jl": 0.957,
        "mf-mnar": 2.199, "gaussian-vae": 1.381}


def test_unknown_name_and_bad_hyper_parameters():
    with pytest.raises(ValueError, match="unknown baseline"):
        make_baseline("svd++")
    with pytest.raises(TypeError):
        make_baseline("mf", dims=3)


def _held_out(train, seed):
    from baselines.selection import validation_split

    fit, held = validation_split(train, fraction=0.1, seed=seed)
    return fit, held.tocoo()


def test_tuning_scores_mf_by_its_held_out_mse_and_keeps_the_best(mnar_data):
    from baselines.registry import GRIDS, tune_baseline

    chosen, scores = tune_baseline("mf", mnar_data.train, seed=3)
    fit, held = _held_out(mnar_data.train, seed=3)
    assert [grid for grid, _ in scores] == list(GRIDS["mf"])
    for grid, score in scores[::5]:
        predicted = make_baseline("mf", seed=3, **grid).fit(fit).predict(held.row, held.col)
        assert score == pytest.approx(np.mean((predicted - held.data) ** 2), rel=1e-12)
    assert chosen == min(scores, key=lambda s: s[1])[0]
    assert len({round(score, 6) for _, score in scores}) > 10  # the grid's points differ: the choice has teeth


def test_tuning_mf_ips_weighs_the_held_out_errors_by_inverse_naive_bayes_propensities(mnar_data):
    """The held-out ratings are MNAR (high ratings over-represented), so MF-IPS is scored by the IPS estimate
    of the error over all cells: the squared errors weighted by 1 / P(O | rating), self-normalised."""
    from baselines.propensities import naive_bayes_propensities
    from baselines.registry import tune_baseline

    sample = mnar_data.mcar_test(0.05, seed=0)
    chosen, scores = tune_baseline("mf-ips", mnar_data.train, seed=0, mcar_sample=sample)
    fit, held = _held_out(mnar_data.train, seed=0)
    weights = 1 / naive_bayes_propensities(mnar_data.train, sample)(held.data)
    assert weights.max() > 5 * weights.min()  # low ratings weigh more, so the weighting changes the score
    for grid, score in scores[::4]:
        predicted = make_baseline("mf-ips", seed=0, **grid).fit(fit, mcar_sample=sample).predict(held.row, held.col)
        errors = (predicted - held.data) ** 2
        assert score == pytest.approx(np.sum(weights * errors) / np.sum(weights), rel=1e-12)
        assert score != pytest.approx(np.mean(errors), rel=1e-3)
    assert chosen == min(scores, key=lambda s: s[1])[0]


def test_tuning_mf_ips_mask_weighs_by_the_mask_models_propensities_of_the_held_out_cells(mnar_data):
    from baselines.propensities import MaskPropensityConfig, mask_propensities
    from baselines.registry import tune_baseline

    _, scores = tune_baseline("mf-ips-mask", mnar_data.train, seed=2)
    fit, held = _held_out(mnar_data.train, seed=2)
    train = mnar_data.train
    propensities = train.copy()
    propensities.data = mask_propensities(train, MaskPropensityConfig(seed=2))  # the whole train mask
    weights = 1 / np.asarray(propensities[held.row, held.col]).ravel()
    grid, score = scores[0]
    predicted = make_baseline("mf-ips-mask", seed=2, **grid).fit(fit).predict(held.row, held.col)
    assert score == pytest.approx(np.average((predicted - held.data) ** 2, weights=weights), rel=1e-12)


def test_tuning_mf_ips_given_weighs_by_the_given_propensities_of_the_held_out_cells(mnar_data):
    from baselines.registry import tune_baseline

    _, scores = tune_baseline("mf-ips-given", mnar_data.train, seed=2, propensities=mnar_data.propensity)
    fit, held = _held_out(mnar_data.train, seed=2)
    weights = 1 / mnar_data.propensity[held.row, held.col]
    for grid, score in scores[::7]:
        predicted = make_baseline("mf-ips-given", seed=2, propensities=mnar_data.propensity, **grid).fit(fit) \
            .predict(held.row, held.col)
        assert score == pytest.approx(np.average((predicted - held.data) ** 2, weights=weights), rel=1e-12)


def test_tuning_pmf_searches_its_own_grid_by_held_out_mse(mnar_data):
    from baselines.registry import GRIDS, tune_baseline

    chosen, scores = tune_baseline("pmf", mnar_data.train, seed=1)
    fit, held = _held_out(mnar_data.train, seed=1)
    assert [grid for grid, _ in scores] == list(GRIDS["pmf"]) and set(chosen) == {"n_factors", "lambda_u", "lambda_v"}
    grid, score = scores[7]
    predicted = make_baseline("pmf", seed=1, **grid).fit(fit).predict(held.row, held.col)
    assert score == pytest.approx(np.mean((predicted - held.data) ** 2), rel=1e-12)
    assert chosen == min(scores, key=lambda s: s[1])[0]


def test_tuning_weighs_by_the_propensities_of_the_model_it_builds(mnar_data):
    """Keywords that change the propensities (here their clip) change the weights too, not only the models."""
    from baselines.propensities import naive_bayes_propensities
    from baselines.registry import tune_baseline

    sample = mnar_data.mcar_test(0.05, seed=0)
    _, scores = tune_baseline("mf-ips", mnar_data.train, seed=0, mcar_sample=sample, min_relative=1.0)
    fit, held = _held_out(mnar_data.train, seed=0)
    weights = 1 / naive_bayes_propensities(mnar_data.train, sample, min_relative=1.0)(held.data)
    assert not np.allclose(weights, 1 / naive_bayes_propensities(mnar_data.train, sample)(held.data))
    grid, score = scores[0]
    model = make_baseline("mf-ips", seed=0, min_relative=1.0, **grid).fit(fit, mcar_sample=sample)
    assert score == pytest.approx(np.average((model.predict(held.row, held.col) - held.data) ** 2, weights=weights),
                                  rel=1e-12)


def test_mf_ips_mask_fits_the_same_from_a_kept_mask_model(mnar_data, monkeypatch):
    """A second fit to the same ratings takes the kept mask model and gives the same model bit for bit."""
    import baselines.propensities as propensities

    fresh = make_baseline("mf-ips-mask", seed=4).fit(mnar_data.train)
    monkeypatch.setattr(propensities, "_fit_mask_propensities", lambda *args: pytest.fail("fitted again"))
    kept = make_baseline("mf-ips-mask", seed=4).fit(mnar_data.train)
    assert np.array_equal(fresh.train_propensities, kept.train_propensities)
    u, i, _ = mnar_data.all_cells()
    assert np.array_equal(fresh.predict(u, i), kept.predict(u, i))


def test_tuning_refuses_what_it_cannot_tune(mnar_data):
    from baselines.registry import tune_baseline
    from baselines.selection import select_config

    with pytest.raises(ValueError, match="unknown baseline 'svd\\+\\+'"):
        tune_baseline("svd++", mnar_data.train)
    with pytest.raises(ValueError, match="'constant-2' has no hyper-parameters to tune; tunable: mf, pmf"):
        tune_baseline("constant-2", mnar_data.train)
    with pytest.raises(ValueError, match="tuning mf-ips needs the MCAR sample"):
        tune_baseline("mf-ips", mnar_data.train)
    one = mnar_data.train[:1].tocsr()
    one.data[1:], one.data[:1] = 0, one.data[:1]
    one.eliminate_zeros()
    with pytest.raises(ValueError, match="holds out some train ratings and fits the rest: train has 1, it needs "
                                         "at least 2"):
        tune_baseline("mf", one)
    with pytest.raises(ValueError, match="train has 1, it needs at least 2"):
        tune_baseline("mf-ips-mask", one)  # its mask model's split comes first
    with pytest.raises(ValueError, match="one finite positive weight per held-out rating"):
        select_config(lambda **kw: make_baseline("mf", **kw), mnar_data.train, [{}], weigh=lambda held: held.data[1:])
