"""The MCAR scoring split: MF-IPS's 5% propensity sample is left out of what every model is scored on."""

import numpy as np
import pytest

from mnar_recsys.evaluation.protocol import fit_and_score, mcar_split
from mnar_recsys.pipelines.ratings import RatingsRun, load_data


def test_scored_entries_are_the_test_entries_outside_the_mcar_sample():
    data = load_data(RatingsRun(users=300, items=60, selection="race"))
    split = mcar_split(data, seed=3)
    test = data.test.tocoo()
    sample = split.mcar_sample.tocoo()
    all_test = set(zip(test.row.tolist(), test.col.tolist()))
    sampled = set(zip(sample.row.tolist(), sample.col.tolist()))
    scored = list(zip(split.users.tolist(), split.items.tolist()))
    assert sampled and sampled <= all_test
    assert len(scored) == len(set(scored)) == data.test.nnz - sample.nnz
    assert set(scored) == all_test - sampled
    np.testing.assert_array_equal(split.ratings, np.asarray(data.test[split.users, split.items]).ravel())
    assert abs(sample.nnz / data.test.nnz - 0.05) < 0.01
    other = mcar_split(data, seed=4).mcar_sample.tocoo()
    assert set(zip(other.row.tolist(), other.col.tolist())) != sampled  # each seed draws its own sample


class _Diverged:
    """A recommender whose predictions went NaN for one entry."""

    name = "mf"

    def fit(self, train):
        return self

    def predict(self, users, items):
        predictions = np.full(len(users), 3.0)
        predictions[1] = np.nan
        return predictions


def test_a_model_that_predicts_nan_is_refused_not_scored():
    """NDCG ranks NaN among the numbers and had recorded a score for it (0.564, with MSE null)."""
    split = mcar_split(load_data(RatingsRun(users=300, items=60, selection="race")), seed=3)
    with pytest.raises(ValueError, match=rf"mf \(seed 3\) predicted 1 of {split.n_test} scored entries as NaN"):
        fit_and_score(_Diverged(), split)
