"""The shared rating checks name where a bad entry is."""

import numpy as np
import pytest
import scipy.sparse as sp

from mnar_recsys.checks.ratings import check_ratings


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_rating_is_refused_naming_its_user_and_item(bad):
    dense = np.array([[1.0, 0.0, 3.0], [0.0, 4.0, 0.0], [2.0, 0.0, 5.0]])
    matrix = sp.csr_matrix(dense)
    matrix.data[[2, 4]] = bad  # (user 1, item 1) and (user 2, item 2)
    with pytest.raises(ValueError, match=rf"mcar_sample contains 2 non-finite ratings, the first {bad} at \(user 1, "
                                         r"item 1\)"):
        check_ratings(matrix, "mcar_sample")
