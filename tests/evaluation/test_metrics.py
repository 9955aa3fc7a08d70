import numpy as np
import pytest

from mnar_recsys.evaluation.metrics import imputation_rmse, mae, mse, ndcg_at_k, per_rating_errors, rmse


def test_pointwise_errors_hand_computed():
    y, p = np.array([1.0, 2.0, 5.0, 4.0]), np.array([2.0, 2.0, 3.0, 4.5])
    # errors 1, 0, -2, 0.5
    assert mse(y, p) == pytest.approx((1 + 0 + 4 + 0.25) / 4)
    assert mae(y, p) == pytest.approx((1 + 0 + 2 + 0.5) / 4)
    assert rmse(y, p) == pytest.approx(np.sqrt(5.25 / 4))


@pytest.mark.parametrize("fn", [mse, mae, rmse])
def test_pointwise_errors_reject_bad_shapes(fn):
    with pytest.raises(ValueError, match="shape"):
        fn(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="empty"):
        fn(np.array([]), np.array([]))


def test_per_rating_errors_hand_computed():
    y = np.array([1, 1, 3, 5])
    p = np.array([2.0, 3.0, 3.0, 4.0])
    out = per_rating_errors(y, p)
    assert list(out) == [1, 3, 5]
    assert out[1] == {"mse": pytest.approx(2.5), "mae": pytest.approx(1.5), "count": 2}
    assert out[3] == {"mse": 0.0, "mae": 0.0, "count": 1}
    assert out[5]["mse"] == pytest.approx(1.0) and out[5]["count"] == 1
    # errors of both signs within one rating do not cancel
    assert per_rating_errors(np.array([3, 3, 4]), np.array([2.0, 4.0, 4.0]))[3]["mae"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="integer"):
        per_rating_errors(np.array([1.5]), np.array([1.0]))


def test_ndcg_hand_computed():
    # user 0: predictions rank items (true 1, 2, 3); ideal is (3, 2, 1). user 1: perfect. user 2: one item, skipped.
    users = np.array([0, 0, 0, 1, 1, 2])
    y = np.array([3, 1, 2, 5, 1, 4], dtype=float)
    p = np.array([0.1, 0.3, 0.2, 0.9, 0.1, 0.0])
    d = 1 / np.log2(np.arange(2, 5))
    dcg0 = 1 * d[0] + 3 * d[1] + 7 * d[2]
    idcg0 = 7 * d[0] + 3 * d[1] + 1 * d[2]
    assert ndcg_at_k(users, y, p, k=5) == pytest.approx((dcg0 / idcg0 + 1.0) / 2)
    lin0 = (1 * d[0] + 2 * d[1] + 3 * d[2]) / (3 * d[0] + 2 * d[1] + 1 * d[2])
    assert ndcg_at_k(users, y, p, k=5, gain="linear") == pytest.approx((lin0 + 1.0) / 2)
    # k=1: user 0 puts gain 1 first where 7 was possible.
    assert ndcg_at_k(users, y, p, k=1) == pytest.approx((1 / 7 + 1.0) / 2)


def test_ndcg_with_ties_is_scikit_learns_and_ignores_the_input_order():
    """Rounded predictions tie often; a tie is scored by its mean gain, not broken by item order."""
    from sklearn.metrics import ndcg_score

    rng = np.random.default_rng(0)
    y = rng.integers(1, 6, (40, 10)).astype(float)
    p = np.round(y + rng.normal(0, 1.5, y.shape))  # about three predictions per distinct value
    users = np.repeat(np.arange(40), 10)
    ours = ndcg_at_k(users, y.ravel(), p.ravel(), k=5, gain="linear")
    assert ours == pytest.approx(np.mean([ndcg_score(y[[u]], p[[u]], k=5) for u in range(40)]), rel=1e-12)
    reverse = np.arange(users.size)[::-1]
    assert ndcg_at_k(users[reverse], y.ravel()[reverse], p.ravel()[reverse], k=5) == pytest.approx(
        ndcg_at_k(users, y.ravel(), p.ravel(), k=5), rel=1e-12)
    # a constant predictor ranks nothing: every position carries the mean gain
    constant = ndcg_at_k(users, y.ravel(), np.zeros(users.size), k=5, gain="linear")
    assert constant == pytest.approx(np.mean([ndcg_score(y[[u]], np.zeros((1, 10)), k=5) for u in range(40)]))


def test_ndcg_edge_cases():
    assert np.isnan(ndcg_at_k(np.array([0, 1]), np.array([3.0, 4.0]), np.array([1.0, 2.0])))
    with pytest.raises(ValueError, match="users shape"):
        ndcg_at_k(np.array([0]), np.array([1.0, 2.0]), np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="k must"):
        ndcg_at_k(np.array([0, 0]), np.array([1.0, 2.0]), np.array([1.0, 2.0]), k=0)


def test_imputation_rmse_scores_only_missing_entries():
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    imp = np.array([[9.0, 2.5], [3.0, 2.0]])
    mask = np.array([[1, 0], [1, 0]])
    assert imputation_rmse(x, imp, mask) == pytest.approx(np.sqrt((0.25 + 4.0) / 2))
    with pytest.raises(ValueError, match="shapes differ"):
        imputation_rmse(x, imp, mask[:1])
    with pytest.raises(ValueError, match="no missing"):
        imputation_rmse(x, imp, np.ones_like(mask))
