import numpy as np
import pytest
import scipy.sparse as sp

from baselines.ips import IPSMatrixFactorization
from baselines.mf import MatrixFactorization
from mnar_recsys.data.splits import split_mcar_sample
from mnar_recsys.evaluation.metrics import mse


def test_true_propensities_undo_selection_bias(mnar_data):
    u, i, y = mnar_data.all_cells()
    naive = MatrixFactorization().fit(mnar_data.train).predict(u, i)
    ips = (MatrixFactorization().fit(mnar_data.train, sample_weight=1 / mnar_data.true_propensities_of_train())
           .predict(u, i))
    # Self-selection of high ratings makes naive MF over-predict; IPS removes most of that.
    assert naive.mean() > y.mean() + 0.5
    assert abs(ips.mean() - y.mean()) < 0.5 * (naive.mean() - y.mean())
    assert mse(y, ips) < 0.75 * mse(y, naive)


def test_mf_ips_naive_bayes_beats_mf(mnar_data):
    u, i, y = mnar_data.all_cells()
    sample = mnar_data.mcar_test(0.02, seed=0)
    naive = mse(y, MatrixFactorization().fit(mnar_data.train).predict(u, i))
    by_ctor = IPSMatrixFactorization("naive-bayes", mcar_sample=sample).fit(mnar_data.train)
    by_fit = IPSMatrixFactorization("naive-bayes").fit(mnar_data.train, mcar_sample=sample)
    np.testing.assert_array_equal(by_ctor.predict(u, i), by_fit.predict(u, i))
    assert by_ctor.name == "mf-ips"
    assert mse(y, by_ctor.predict(u, i)) < 0.75 * naive


def test_mf_ips_mask_runs_without_mcar_data(mnar_data):
    u, i, y = mnar_data.all_cells()
    model = IPSMatrixFactorization("mask").fit(mnar_data.train)
    assert model.name == "mf-ips-mask"
    assert model.train_propensities.shape == (mnar_data.train.nnz,)
    # the weights matter: unit weights (plain MF) scored 0.996, the mask's 0.66
    assert mse(y, model.predict(u, i)) < 0.8 * mse(y, MatrixFactorization().fit(mnar_data.train).predict(u, i))


def test_mf_ips_given_trains_with_the_given_matrix(mnar_data):
    """The true propensities given as a matrix weigh each rating as they do given per rating, and undo the bias."""
    u, i, y = mnar_data.all_cells()
    given = IPSMatrixFactorization("given", propensities=mnar_data.propensity).fit(mnar_data.train)
    assert given.name == "mf-ips-given"
    np.testing.assert_array_equal(given.train_propensities, mnar_data.true_propensities_of_train())
    per_rating = MatrixFactorization().fit(mnar_data.train, sample_weight=1 / mnar_data.true_propensities_of_train())
    np.testing.assert_allclose(given.predict(u, i), per_rating.predict(u, i))
    assert mse(y, given.predict(u, i)) < 0.75 * mse(y, MatrixFactorization().fit(mnar_data.train).predict(u, i))
    with pytest.raises(ValueError, match=r"propensities shape \(2, 2\) != train shape"):
        IPSMatrixFactorization("given", propensities=np.full((2, 2), 0.5)).fit(mnar_data.train)
    with pytest.raises(ValueError, match=r"propensities must lie in \(0, 1\], got values in \[0.0, 0.5\]"):
        IPSMatrixFactorization("given", propensities=np.array([[0.0, 0.5]]))
    with pytest.raises(ValueError, match="pass propensities with the 'given' variant, and only with it"):
        IPSMatrixFactorization("given")


def test_ips_argument_errors(mnar_data):
    with pytest.raises(ValueError, match="needs an MCAR sample"):
        IPSMatrixFactorization("naive-bayes").fit(mnar_data.train)
    with pytest.raises(ValueError, match="uses no MCAR data"):
        IPSMatrixFactorization("mask", mcar_sample=mnar_data.train)
    with pytest.raises(ValueError, match="propensity must be"):
        IPSMatrixFactorization("oracle")
    with pytest.raises(ValueError, match="mcar_sample shape"):
        IPSMatrixFactorization("naive-bayes").fit(mnar_data.train, mcar_sample=sp.csr_matrix(np.ones((2, 2))))
    # refused before the mask model is fitted to ratings that the clipping would cap
    wide = mnar_data.train.copy()
    wide.data = wide.data * 2
    for propensity in ("mask", "naive-bayes"):
        with pytest.raises(ValueError, match=r"ratings outside rating_scale \(1\.0, 5\.0\)"):
            IPSMatrixFactorization(propensity).fit(wide)


def test_split_mcar_sample_partitions_the_test():
    test = sp.random(50, 40, density=0.3, format="csr", random_state=0)
    test.data = np.ceil(test.data * 5)
    sample, rest = split_mcar_sample(test, fraction=0.05, seed=1)
    assert sample.nnz == round(0.05 * test.nnz) and sample.nnz + rest.nnz == test.nnz
    assert (sample + rest != test).nnz == 0
    assert sample.multiply(rest).nnz == 0
    again, _ = split_mcar_sample(test, fraction=0.05, seed=1)
    assert (again != sample).nnz == 0
    with pytest.raises(ValueError, match="fraction"):
        split_mcar_sample(test, fraction=1.0)


def test_a_clip_given_twice_must_agree():
    """The mask model clips by its config's min_relative; a different one beside it was silently ignored."""
    from baselines.propensities import MaskPropensityConfig

    with pytest.raises(ValueError, match="min_relative 0.5 and mask_config.min_relative 0.1 differ"):
        IPSMatrixFactorization("mask", min_relative=0.5, mask_config=MaskPropensityConfig())
    agreed = IPSMatrixFactorization("mask", min_relative=0.5, mask_config=MaskPropensityConfig(min_relative=0.5))
    assert agreed.mask_config.min_relative == 0.5


def test_mf_ips_warns_when_the_mcar_sample_is_tiny(mnar_data):
    """8 MCAR ratings for 5 levels give shares of 0, 1/8, 2/8, ...: propensities from them are guesses."""
    import warnings

    from baselines.propensities import SmallMCARSampleWarning

    full = mnar_data.mcar_test(0.05, seed=0)
    coo = full.tocoo()
    keep = np.random.default_rng(0).choice(coo.nnz, 8, replace=False)
    tiny = sp.csr_matrix((coo.data[keep], (coo.row[keep], coo.col[keep])), shape=full.shape)
    with pytest.warns(SmallMCARSampleWarning, match=r"the MCAR sample holds 8 ratings for 5 rating levels, fewer "
                                                    r"than 10 a level on average"):
        IPSMatrixFactorization("naive-bayes", mcar_sample=tiny).fit(mnar_data.train)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallMCARSampleWarning)
        IPSMatrixFactorization("naive-bayes", mcar_sample=full).fit(mnar_data.train)  # its share of 5%: quiet
