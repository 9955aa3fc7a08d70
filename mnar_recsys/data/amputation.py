"""Missingness mechanisms for dense data (amputation), pure NumPy and seeded.

Every mechanism returns a mask of the data's shape with 1 = observed, 0 = missing (uint8); use
``apply_mask`` to turn it into a NaN-marked array. The logistic mechanisms follow the protocols of
Muzellec et al. (ICML 2020): random weights scaled so each logit has unit spread, and intercepts found
by bisection so that the expected missing rate equals ``p``.
"""

from __future__ import annotations

import numpy as np


def _check_data(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"expected a 2-d array (rows x features), got shape {X.shape}")
    if not np.isfinite(X).all():
        raise ValueError("X contains NaN or infinite values: amputation needs the complete data")
    return X


def _check_p(p: float, name: str = "p") -> float:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {p}")
    return float(p)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # tanh form: no overflow for large |z|


def _fit_intercepts(logits: np.ndarray, p: float) -> np.ndarray:
    """Per column c, the intercept b_c with mean(sigmoid(logits[:, c] + b_c)) = p (bisection)."""
    span = np.abs(logits).max(initial=0.0) + 40.0  # sigmoid(±40) is 0/1 to double precision
    lo = np.full(logits.shape[1], -span)
    hi = np.full(logits.shape[1], span)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        too_high = _sigmoid(logits + mid).mean(axis=0) > p
        hi = np.where(too_high, mid, hi)
        lo = np.where(too_high, lo, mid)
    return 0.5 * (lo + hi)


def _scaled_weights(inputs: np.ndarray, n_out: int, rng: np.random.Generator) -> np.ndarray:
    """Gaussian weights (inputs -> n_out logits), each column scaled so its logit has sd 1 on the data."""
    W = rng.standard_normal((inputs.shape[1], n_out))
    sd = (inputs @ W).std(axis=0)
    return W / np.where(sd > 0, sd, 1.0)  # a constant input gives a constant logit: leave it unscaled


def _draw_missing(prob_missing: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return rng.random(prob_missing.shape) < prob_missing


def standardize(X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scale each feature to mean 0, sd 1 (population sd); returns (Xs, mean, sd).

    A constant feature keeps sd = 1 so it maps to zeros instead of dividing by zero; a feature whose sd
    overflows is refused (it would map to zeros too).
    """
    X = _check_data(X)
    mean, sd = X.mean(axis=0), X.std(axis=0)
    overflowed = np.flatnonzero(~np.isfinite(sd))
    if overflowed.size:
        raise ValueError(f"features {overflowed.tolist()} are too large to standardise: their sd overflows float64")
    sd = np.where(sd > 0, sd, 1.0)
    return (X - mean) / sd, mean, sd


def apply_mask(X: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Copy of X as float64 with NaN where ``mask`` is 0 (mask 1 = observed)."""
    X = np.asarray(X, dtype=np.float64)
    mask = np.asarray(mask)
    if mask.shape != X.shape:
        raise ValueError(f"mask shape {mask.shape} does not match X shape {X.shape}")
    return np.where(mask.astype(bool), X, np.nan)


def paper_self_masking(X: np.ndarray, offset: float = 0.0) -> np.ndarray:
    """The not-MIWAE paper's UCI protocol (deterministic self-masking MNAR).

    Conditions on each entry's own value only: in the first D//2 features, x_ij goes missing when
    x_ij > mean_j + offset * sd_j (mean and population sd of feature j over X); the other features stay
    observed. The paper applies it to standardised data with offset 0 (its appendix also uses 0.25 ...
    1.0).
    """
    X = _check_data(X)
    if not np.isfinite(offset):  # NaN would compare False everywhere and mask the whole first half
        raise ValueError(f"offset must be a finite number of sd, got {offset}")
    if X.shape[1] < 2:
        raise ValueError(f"the protocol masks the first half of the features: it needs at least 2, got {X.shape[1]}")
    mask = np.ones(X.shape, dtype=np.uint8)
    half = X.shape[1] // 2
    cutoff = X[:, :half].mean(axis=0) + offset * X[:, :half].std(axis=0)
    mask[:, :half] = X[:, :half] <= cutoff
    return mask


def mcar(X: np.ndarray, p: float, seed: int | np.random.Generator | None = None) -> np.ndarray:
    """Missing completely at random: each entry goes missing independently with probability ``p``.

    Conditions on nothing (neither observed nor missing values).
    """
    X = _check_data(X)
    p = _check_p(p)
    rng = np.random.default_rng(seed)
    return (~_draw_missing(np.full(X.shape, p), rng)).astype(np.uint8)


def mar_logistic(
    X: np.ndarray, p: float, seed: int | np.random.Generator | None = None, p_obs: float = 0.3
) -> np.ndarray:
    """Missing at random through a logistic model.

    A random subset of min(max(1, int(p_obs * D)), D - 1) features is always observed; every other feature j goes
    missing independently with probability sigmoid(x_obs @ w_j + b_j), which conditions only on the
    always-observed features of the same row (hence MAR). w_j is random, b_j is set so that the
    expected missing rate of each non-observed feature is ``p``.
    """
    X = _check_data(X)
    p = _check_p(p)
    _check_p(p_obs, "p_obs")
    rng = np.random.default_rng(seed)
    d = X.shape[1]
    if d < 2:
        raise ValueError("mar_logistic needs at least 2 features (one always observed)")
    d_obs = min(max(int(p_obs * d), 1), d - 1)
    order = rng.permutation(d)
    obs, amputed = order[:d_obs], order[d_obs:]
    logits = X[:, obs] @ _scaled_weights(X[:, obs], amputed.size, rng)
    prob = _sigmoid(logits + _fit_intercepts(logits, p))
    mask = np.ones(X.shape, dtype=np.uint8)
    mask[:, amputed] = ~_draw_missing(prob, rng)
    return mask


def mnar_logistic(
    X: np.ndarray, p: float, seed: int | np.random.Generator | None = None, p_params: float = 0.3
) -> np.ndarray:
    """Missing not at random through a logistic model on inputs that are themselves masked.

    A random subset of min(max(1, int(p_params * D)), D - 1) features are the inputs of the model: every other
    feature j goes missing with probability sigmoid(x_in @ w_j + b_j) (b_j set for an expected rate
    ``p``); the input features are then masked completely at random with probability ``p``. The
    missingness therefore conditions on values (the inputs) that may themselves be missing: MNAR.
    """
    X = _check_data(X)
    p = _check_p(p)
    _check_p(p_params, "p_params")
    rng = np.random.default_rng(seed)
    n, d = X.shape
    if d < 2:
        raise ValueError("mnar_logistic needs at least 2 features (one input)")
    d_in = min(max(int(p_params * d), 1), d - 1)
    order = rng.permutation(d)
    inputs, amputed = order[:d_in], order[d_in:]
    logits = X[:, inputs] @ _scaled_weights(X[:, inputs], amputed.size, rng)
    prob = _sigmoid(logits + _fit_intercepts(logits, p))
    mask = np.ones(X.shape, dtype=np.uint8)
    mask[:, amputed] = ~_draw_missing(prob, rng)
    mask[:, inputs] = ~_draw_missing(np.full((n, d_in), p), rng)
    return mask


def self_masking_logistic(X: np.ndarray, p: float, seed: int | np.random.Generator | None = None) -> np.ndarray:
    """Self-masking MNAR: each entry's missingness depends on its own value only.

    x_ij goes missing with probability sigmoid(w_j * x_ij + b_j), with w_j random (scaled by 1/sd_j)
    and b_j set so that the expected missing rate of every feature is ``p``.
    """
    X = _check_data(X)
    p = _check_p(p)
    rng = np.random.default_rng(seed)
    sd = X.std(axis=0)
    w = rng.standard_normal(X.shape[1]) / np.where(sd > 0, sd, 1.0)
    logits = X * w
    prob = _sigmoid(logits + _fit_intercepts(logits, p))
    return (~_draw_missing(prob, rng)).astype(np.uint8)
