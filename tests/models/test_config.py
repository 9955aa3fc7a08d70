"""ModelConfig refuses a squash range the Gaussian decoder cannot use, as it is made rather than in training."""

import pytest

from mnar_recsys.models.config import ModelConfig


@pytest.mark.parametrize("squash", [(5, 1), (3, 3), (float("nan"), 5), (1, float("inf")), ("1", 5), (1,), (True, 5)])
def test_a_squash_that_is_no_range_is_refused(squash):
    with pytest.raises(ValueError, match=r"squash must be None or two finite numbers lo < hi"):
        ModelConfig(n_features=3, squash=squash)


@pytest.mark.parametrize("squash, kept", [(None, None), ((0.0, 1.0), (0.0, 1.0)), ([1, 5], (1, 5))])
def test_a_squash_range_or_none_is_kept(squash, kept):
    assert ModelConfig(n_features=3, squash=squash).squash == kept
