"""The MCAR scoring split: MF-IPS's 5% propensity sample is left out of what every model is scored on."""

import numpy as np

from mnar_recsys.evaluation.protocol import mcar_split
from mnar_recsys.pipelines.ratings import RatingsRun, load_data


def test_scored_entries_are_the_test_entries_outside_the_mcar_sample():
    data = load_data(RatingsRun(users=300, items=60))
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
