import numpy as np
import pytest
import scipy.sparse as sp

from baselines.constant import ConstantPredictor, TrainMean

TRAIN = sp.csr_matrix(np.array([[1.0, 0.0, 4.0], [0.0, 5.0, 4.0]]))
USERS, ITEMS = np.array([0, 1, 1]), np.array([1, 0, 2])


def test_constant_value_and_name():
    model = ConstantPredictor(2.0).fit(TRAIN)
    assert model.name == "constant-2"
    np.testing.assert_array_equal(model.predict(USERS, ITEMS), [2.0, 2.0, 2.0])


def test_train_mean():
    np.testing.assert_allclose(TrainMean().fit(TRAIN).predict(USERS, ITEMS), 3.5)


def test_clipped_to_scale():
    assert ConstantPredictor(9.0).fit(TRAIN).predict(USERS, ITEMS).max() == 5.0
    assert ConstantPredictor(9.0, rating_scale=None).fit(TRAIN).predict(USERS, ITEMS).max() == 9.0


def test_ratings_off_the_clipping_scale_are_refused():
    """train-mean of 1..10 ratings under the default 1..5 had predicted 5 everywhere."""
    wide = sp.csr_matrix(np.array([[1.0, 0.0, 9.0], [0.0, 6.0, 8.0]]))
    for model in (TrainMean(), ConstantPredictor(2.0)):
        with pytest.raises(ValueError, match=r"3 ratings outside rating_scale \(1\.0, 5\.0\), the first 9 at"):
            model.fit(wide)
    assert TrainMean(rating_scale=(1.0, 10.0)).fit(wide).predict(USERS, ITEMS)[0] == 6.0


def test_refuses_out_of_range_and_unfitted():
    with pytest.raises(ValueError, match="not fitted"):
        TrainMean().predict(USERS, ITEMS)
    with pytest.raises(ValueError, match="user index out of range"):
        TrainMean().fit(TRAIN).predict(np.array([2]), np.array([0]))
