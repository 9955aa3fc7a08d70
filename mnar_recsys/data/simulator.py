"""Synthetic MNAR ratings with known full truth, calibrated to look like Yahoo! R3 in aggregate.

Generative model (all draws from one seeded ``np.random.default_rng``):

1. Latent score of user u for item i: ``s_ui = f_ui + e_ui`` with ``f_ui = a_u + b_i + <P_u, Q_i>``
   (Gaussian user/item biases and a Gaussian rank-``rank`` interaction) and noise
   ``e_ui ~ N(0, noise_var)``.
2. Rating ``r_ui = 1 + #{k : s_ui > t_k}``, with thresholds ``t_k`` at the quantiles of the scores
   given by the cumulative ``mcar_shares``, so a uniformly random cell has those rating shares.
3. Self-selection (train, MNAR), one of three mechanisms (``selection``):
   - ``"race"`` (default): user u rates ``n_u`` items (``n_u`` = ``min_ratings_per_user`` plus a
     log-normal count whose median and mean are solved from the config), drawn without replacement
     with weight ``popularity_i * propensity[r_ui]``; the per-rating propensity is solved so that the
     train rating shares match ``train_shares``. A user's items compete for a fixed budget, so whether
     a cell is rated depends on the user's other ratings too. While few of a user's items are taken,
     this is close to a per-cell logistic draw with a per-user intercept (the log of the user's budget
     over the total weight of the user's items), which a missing model with a row offset can express.
   - ``"independent"``: every cell is rated independently with
     ``logit Pr(rated) = intercept + log popularity_i + log propensity[r_ui]``, the intercept and the
     propensity solved so that the expected number of ratings is ``sum_u n_u`` and the expected train
     shares are ``train_shares``. This is the not-MIWAE's own missing model (an item bias plus a logit
     per rating level), so it tells model error from mis-specification; users then rate a
     binomial-like number of items, which may be below ``min_ratings_per_user``.
   - ``"logistic"``: every cell is rated independently with ``logit Pr(rated) = intercept +
     activity_sd * z_u + log popularity_i + log propensity[r_ui]``, where the standard-normal activity
     ``z_u`` correlates (``activity_bias_correlation``) with the user's rating bias. Users are drawn in
     blocks and those with fewer than ``min_ratings_per_user`` ratings dropped, as Yahoo! R3 dropped
     them, until ``n_users`` are kept. The intercept, activity sd and propensities are solved so that
     the kept users' median and mean counts and train shares hit the targets, and the thresholds so
     that the kept users' cells have the MCAR shares (dropping favours users with high ratings).
4. MCAR test: each of the first ``n_test_users`` users gets ``test_items_per_user`` items drawn
   uniformly without replacement, independently of the train selection (a cell may be in both).

The oracle ``E[r_ui | f_ui] = 1 + sum_k Phi((f_ui - t_k) / sqrt(noise_var))`` minimises the expected
squared error of any prediction that knows the generating model but not the realised rating.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import least_squares
from scipy.special import expit, gammaln, ndtr

from .ratings import RatingsData
from .triples import to_csr

_APPROX_ROUNDS = 500  # most fixed-point steps solving the approximate propensities
_REALISED_ROUNDS = 3  # corrections of the approximation by the shares the race realises
_BLOCK_ROWS = 1024  # rows per block of temporaries
_ORACLE_GRID = 4096  # interpolation cells for the oracle's E[rating | signal]
_INDEPENDENT_ROUNDS = 2_000  # most damped fixed-point steps solving the independent selection's logits
_MAX_SELECTION_LOGIT = 30.0  # bound on those logits, so that out-of-reach targets cannot overflow them
_SOLVE_USERS = 4_096  # users of the first block, on which the logistic selection is first solved roughly
_POPULARITY_BINS = 48  # bins of log popularity in that solve's per-user tables
_THRESHOLD_ROUNDS = 1  # re-placements of the thresholds at the kept users' cells, each with a re-solve
_QUANTILE_BINS = 1 << 14  # histogram cells of those quantiles
_SOLVE_KEPT = 2_048  # users likely to be kept that the final solve needs
_RELEVANT_KEEP = 1e-4  # users kept with a smaller chance under the rough solve are left out of the final one
_SOLVE_MAX_USERS = 8_192  # at most this many users in the final solve
_MAX_BLOCK_USERS = 65_536  # users drawn at once: bounds the memory of a pool that mostly gets dropped
_LOGISTIC_DENSITY = 20  # the logistic selection needs n_items >= this x the mean ratings per user
_MIN_KEEP_RATE = 0.01  # below this share of users kept, the pool to draw would be huge
SELECTIONS = ("race", "independent", "logistic")


@dataclass
class SimulatorConfig:
    """Parameters of ``simulate_ratings``; the defaults mimic Yahoo! R3 (15,400 users x 1,000 songs)."""

    #: number of users (rows).
    n_users: int = 15_400
    #: number of items (columns).
    n_items: int = 1_000
    #: the first this many users get an MCAR test set.
    n_test_users: int = 5_400
    #: random items rated by each test user.
    test_items_per_user: int = 10
    #: rank of the user-item interaction.
    rank: int = 5
    #: variance of the user bias in the latent score.
    user_bias_var: float = 0.30
    #: variance of the item bias in the latent score.
    item_bias_var: float = 0.15
    #: variance of the low-rank interaction term in the latent score.
    interaction_var: float = 0.25
    #: variance of the per-cell noise (the part of a rating even the oracle cannot predict).
    noise_var: float = 0.30
    #: rating shares 1..K of a uniformly random cell (sets the ordinal thresholds).
    mcar_shares: tuple[float, ...] = (0.526, 0.242, 0.144, 0.062, 0.026)
    #: target rating shares 1..K of the self-selected train ratings (sets the propensities).
    train_shares: tuple[float, ...] = (0.314, 0.127, 0.158, 0.156, 0.246)
    #: with ``selection="race"`` every user rates at least this many items in train; with "logistic" users who rate
    #: fewer are dropped; with "independent" it enters only the expected number of ratings, and a user may rate fewer.
    min_ratings_per_user: int = 10
    #: median train ratings per user.
    median_ratings_per_user: float = 15.0
    #: mean train ratings per user (with the median, fixes the log-normal tail).
    mean_ratings_per_user: float = 20.2
    #: log-scale spread of item popularity (heavier tail -> more skewed item counts).
    popularity_sigma: float = 1.5
    #: popularity added to every item, so that no item is (almost) never rated.
    popularity_floor: float = 0.25
    #: "race" (a fixed number of ratings per user, drawn without replacement), "independent" (a logistic draw per cell)
    #: or "logistic" (a logistic draw per cell with a per-user activity, light users dropped); see the module
    #: docstring.
    selection: str = "race"
    #: with ``selection="logistic"``, the correlation of a user's activity (the per-user shift of the selection logits)
    #: with the user's rating bias: users who like more of the catalogue rate more of it.
    activity_bias_correlation: float = 0.6
    #: seed of the random generator; equal configs give equal data.
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("n_users", "n_items", "rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("user_bias_var", "item_bias_var", "interaction_var", "popularity_sigma", "popularity_floor"):
            if not getattr(self, name) >= 0:  # NaN fails too
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.noise_var > 0:  # the oracle divides by its square root
            raise ValueError(f"noise_var must be > 0, got {self.noise_var}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        if not -1 < self.activity_bias_correlation < 1:
            raise ValueError(f"activity_bias_correlation must lie in (-1, 1), got {self.activity_bias_correlation}")
        if len(self.mcar_shares) != len(self.train_shares):
            raise ValueError("mcar_shares and train_shares must have one share per rating level")
        for name in ("mcar_shares", "train_shares"):
            shares = np.asarray(getattr(self, name))
            if np.any(shares <= 0) or abs(shares.sum() - 1) > 0.01:
                raise ValueError(f"{name} must be positive and sum to 1 (up to rounding), got {getattr(self, name)}")
        if not self.min_ratings_per_user >= 0:
            raise ValueError(f"min_ratings_per_user must be >= 0, got {self.min_ratings_per_user}")
        if not self.min_ratings_per_user < self.median_ratings_per_user < self.mean_ratings_per_user:
            raise ValueError("need min_ratings_per_user < median_ratings_per_user < mean_ratings_per_user, got "
                             f"{self.min_ratings_per_user}, {self.median_ratings_per_user}, "
                             f"{self.mean_ratings_per_user}")
        if self.mean_ratings_per_user >= self.n_items:
            raise ValueError(f"n_items ({self.n_items}) must exceed mean_ratings_per_user "
                             f"({self.mean_ratings_per_user})")
        if self.selection == "logistic" and self.n_items < _LOGISTIC_DENSITY * self.mean_ratings_per_user:
            raise ValueError(f"selection='logistic' needs n_items >= {_LOGISTIC_DENSITY} x mean_ratings_per_user "
                             f"({_LOGISTIC_DENSITY * self.mean_ratings_per_user:g}), got {self.n_items}: denser, "
                             "the train shares are out of reach and most simulated users are dropped")
        if not 0 <= self.n_test_users <= self.n_users:
            raise ValueError(f"n_test_users must lie in 0..n_users ({self.n_users}), got {self.n_test_users}")
        if not 0 < self.test_items_per_user <= self.n_items:
            raise ValueError(f"test_items_per_user must lie in 1..n_items ({self.n_items}), got "
                             f"{self.test_items_per_user}")


def simulate_ratings(config: SimulatorConfig | None = None) -> RatingsData:
    """Draw a ratings data set with known truth from ``config`` (default: Yahoo! R3-like).

    Returns ``RatingsData`` named "synthetic" with the self-selected train ratings, the MCAR test
    ratings, ``truth`` (dense int8 ratings of every cell) and in ``meta``: ``"oracle"`` (dense
    E[rating | user, item] under the true model), ``"params"`` (the drawn and solved generating
    parameters) and ``"config"`` (the config as a dict).
    """
    config = config or SimulatorConfig()
    rng = np.random.default_rng(config.seed)
    if config.selection == "logistic":
        return _simulate_with_logistic_selection(config, rng)
    n_users, n_items = config.n_users, config.n_items

    user_bias = rng.normal(0.0, np.sqrt(config.user_bias_var), n_users)
    item_bias = rng.normal(0.0, np.sqrt(config.item_bias_var), n_items)
    factor_sd = _factor_sd(config)
    user_factors = rng.normal(0.0, factor_sd, (n_users, config.rank))
    item_factors = rng.normal(0.0, factor_sd, (n_items, config.rank))
    # Dense user x item arrays are float32 and temporaries are made per block of rows: at the
    # default size, allocating a fresh full-size array costs more than computing it.
    signal = _signal(user_bias, user_factors, item_bias, item_factors)

    noise_sd = float(np.sqrt(config.noise_var))
    score = rng.standard_normal(signal.shape, dtype=np.float32)
    score *= noise_sd
    score += signal
    thresholds = _thresholds(score, _normalised(config.mcar_shares), rng)
    truth = _cut(score, thresholds)
    oracle = _expected_rating(signal, thresholds, noise_sd)

    _check_levels(truth, config)
    n_rated = _ratings_per_user(config, rng)
    if n_rated.sum() == 0:
        raise ValueError("every simulated user drew 0 ratings: raise median_ratings_per_user and "
                         "mean_ratings_per_user, or simulate more users")
    popularity = config.popularity_floor + np.exp(config.popularity_sigma * rng.standard_normal(n_items))
    train_shares = _normalised(config.train_shares)
    selection = {}
    if config.selection == "race":
        race = rng.standard_exponential(dtype=np.float32, out=score)  # reuse: the score is no longer needed
        propensity, train_mask = _select(truth, n_rated, popularity, race, train_shares)
        del race
    else:
        uniform = rng.random(dtype=np.float32, out=score)  # reuse: the score is no longer needed
        propensity, intercept, train_mask = _select_independently(truth, int(n_rated.sum()), popularity, uniform,
                                                                  train_shares)
        selection["selection_intercept"] = intercept
        del uniform
    del score, signal
    params = {"user_bias": user_bias, "item_bias": item_bias, "user_factors": user_factors,
              "item_factors": item_factors, "noise_sd": noise_sd, "thresholds": thresholds,
              "ratings_per_user": n_rated, "popularity": popularity, "propensity": propensity, **selection}
    return _assemble(config, rng, truth, train_mask, oracle, params)


def _assemble(config: SimulatorConfig, rng: np.random.Generator, truth: np.ndarray, train_mask: np.ndarray,
              oracle: np.ndarray, params: dict) -> RatingsData:
    """The data set: the train cells of ``train_mask``, freshly drawn MCAR test cells, truth and meta."""
    test_rows, test_cols = _mcar_cells(config, rng)
    rows, cols = np.nonzero(train_mask)
    shape = truth.shape
    return RatingsData(
        name="synthetic",
        train=to_csr(rows, cols, truth[rows, cols], shape),
        test=to_csr(test_rows, test_cols, truth[test_rows, test_cols], shape),
        rating_scale=(1, len(config.mcar_shares)),
        user_ids=np.arange(shape[0]),
        item_ids=np.arange(shape[1]),
        truth=truth,
        meta={"oracle": oracle, "config": asdict(config), "params": params},
    )


def _factor_sd(config: SimulatorConfig) -> float:
    return (config.interaction_var / config.rank) ** 0.25  # var(<P_u, Q_i>) = rank * sd**4


def _signal(user_bias: np.ndarray, user_factors: np.ndarray, item_bias: np.ndarray,
            item_factors: np.ndarray) -> np.ndarray:
    signal = (user_factors @ item_factors.T).astype(np.float32)
    signal += user_bias[:, None].astype(np.float32)
    signal += item_bias[None, :].astype(np.float32)
    return signal


def _cut(score: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Ratings 1 + #{k : score > t_k} as int8."""
    truth = np.ones(score.shape, dtype=np.int8)
    for t in thresholds:
        truth += score > t
    return truth


def _check_levels(truth: np.ndarray, config: SimulatorConfig) -> None:
    absent = [level for level in range(1, len(config.mcar_shares) + 1) if not (truth == level).any()]
    if absent:  # no propensity can select a level that no cell holds
        raise ValueError(f"no simulated cell has rating {', '.join(map(str, absent))}: {truth.shape[0]} x "
                         f"{truth.shape[1]} cells are too few for the rating shares; simulate more users or items")


def _normalised(shares: ArrayLike) -> np.ndarray:
    return np.asarray(shares, dtype=np.float64) / np.sum(shares)


def _thresholds(score: np.ndarray, mcar_shares: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Score quantiles at the cumulative MCAR shares, from a large sample of cells (a full sort is slow)."""
    flat = score.ravel()
    sample = flat[rng.integers(0, flat.size, min(flat.size, 2_000_000))]
    return np.quantile(sample, np.cumsum(mcar_shares)[:-1])


def _expected_rating(signal: np.ndarray, thresholds: np.ndarray, noise_sd: float) -> np.ndarray:
    """E[rating | signal] = 1 + sum_k Phi((signal - t_k) / noise_sd), as a float32 matrix.

    The map is smooth in the signal, so it is tabulated on a fine grid and interpolated linearly
    (error below 1e-5), far cheaper than evaluating the normal CDF per cell and threshold.
    """
    lo, hi = float(signal.min()), float(signal.max())
    step = max(hi - lo, 1e-6) / _ORACLE_GRID
    grid = lo + step * np.arange(_ORACLE_GRID + 2)
    values = 1.0 + ndtr((grid[:, None] - thresholds[None, :]) / noise_sd).sum(axis=1)
    slopes = np.diff(values)
    oracle = np.empty(signal.shape, dtype=np.float32)
    for rows in _row_blocks(signal.shape[0]):
        position = (signal[rows] - lo) / step
        cell = position.astype(np.intp)
        oracle[rows] = values[cell] + (position - cell) * slopes[cell]
    return oracle


def _row_blocks(n_rows: int) -> list[slice]:
    return [slice(start, start + _BLOCK_ROWS) for start in range(0, n_rows, _BLOCK_ROWS)]


def _ratings_per_user(config: SimulatorConfig, rng: np.random.Generator) -> np.ndarray:
    """min + a rounded log-normal whose median and mean are solved from the config's targets."""
    excess_median = config.median_ratings_per_user - config.min_ratings_per_user
    excess_mean = config.mean_ratings_per_user - config.min_ratings_per_user
    sigma = np.sqrt(2.0 * np.log(excess_mean / excess_median))  # log-normal: mean / median = exp(sigma^2 / 2)
    excess = np.rint(excess_median * np.exp(sigma * rng.standard_normal(config.n_users))).astype(np.int64)
    return np.minimum(config.min_ratings_per_user + excess, config.n_items)


def _select(
    truth: np.ndarray, n_rated: np.ndarray, popularity: np.ndarray, race: np.ndarray, train_shares: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Solve the per-rating propensities and draw each user's rated items; returns (propensity, mask).

    User u takes the ``n_rated[u]`` items with the smallest ``race / (popularity * propensity[r])``:
    an exponential race, i.e. successive sampling without replacement proportional to that weight.
    The propensities come from a with-replacement approximation of the expected train shares; its
    target is then corrected a few times by the shares the race actually produces, keeping the best.
    """
    n_levels = len(train_shares)
    mass = np.empty((len(n_rated), n_levels))  # popularity mass of each rating level per user
    for rows in _row_blocks(len(n_rated)):
        block = truth[rows]
        codes = block.astype(np.intp) + (n_levels + 1) * np.arange(block.shape[0])[:, None]  # (row, rating) bins
        weights = np.broadcast_to(popularity, block.shape).ravel()
        counts = np.bincount(codes.ravel(), weights, (n_levels + 1) * block.shape[0])
        mass[rows] = counts.reshape(-1, n_levels + 1)[:, 1:]
    target, best_error, best = train_shares, np.inf, None
    for _ in range(1 + _REALISED_ROUNDS):
        propensity = _approximate_propensity(mass, n_rated, target)
        mask = _race_winners(race, truth, popularity, propensity, n_rated)
        realised = np.bincount(truth[mask], minlength=n_levels + 1)[1:] / mask.sum()
        error = np.abs(realised - train_shares).max()
        if error < best_error:
            best_error, best = error, (propensity, mask)
        # Bounded steps: with dense selection (few items per user) the targets can be out of reach.
        target = _normalised(target * np.clip(train_shares / np.maximum(realised, 1e-12), 0.5, 2.0))
    return best


def _approximate_propensity(mass: np.ndarray, n_rated: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Propensities whose expected train shares match ``target`` if users drew items with replacement."""
    propensity = target.copy()
    for _ in range(_APPROX_ROUNDS):
        chosen = mass * propensity
        expected = _normalised((n_rated[:, None] * chosen / chosen.sum(axis=1, keepdims=True)).sum(axis=0))
        if np.allclose(expected, target, rtol=1e-6, atol=0.0):
            break
        propensity = _normalised(np.maximum(propensity * target / expected, 1e-12))  # floor: keys stay finite
    return propensity


def _select_independently(
    truth: np.ndarray, n_total: int, popularity: np.ndarray, uniform: np.ndarray, train_shares: np.ndarray
) -> tuple[np.ndarray, float, np.ndarray]:
    """Solve (propensity, intercept) and draw each cell with Pr = sigmoid(intercept + log(pop_i * propensity_r)).

    The expectations only need the count of each (item, rating) pair, so the damped fixed point runs on
    an items x levels table rather than on the dense matrix; ``uniform`` holds one U(0, 1) per cell.
    Returns the propensity normalised to sum 1, the matching intercept and the mask.
    """
    n_levels = len(train_shares)
    counts = np.stack([np.count_nonzero(truth == level, axis=0) for level in range(1, n_levels + 1)], axis=1)
    log_popularity = np.log(popularity)[:, None]
    log_propensity, intercept = np.zeros(n_levels), 0.0
    for _ in range(_INDEPENDENT_ROUNDS):
        mass = (counts * expit(intercept + log_popularity + log_propensity)).sum(axis=0)
        share_step, total_step = np.log(train_shares / (mass / mass.sum())), np.log(n_total / mass.sum())
        if max(np.abs(share_step).max(), abs(total_step)) < 1e-6:
            break
        # clipped: with dense selection (few items per user) the targets can be out of reach, and the
        # logits then run off to the bound, where the reachable shares closest to the targets are
        log_propensity = np.clip(log_propensity + 0.5 * share_step, -_MAX_SELECTION_LOGIT, _MAX_SELECTION_LOGIT)
        intercept = float(np.clip(intercept + 0.5 * total_step, -_MAX_SELECTION_LOGIT, _MAX_SELECTION_LOGIT))
    shift = np.log(np.exp(log_propensity).sum())  # normalise the propensity, keeping the logits
    propensity, intercept = np.exp(log_propensity - shift), intercept + shift
    by_rating = np.concatenate([[np.nan], np.log(propensity)]).astype(np.float32)
    item_logit = (intercept + np.log(popularity)).astype(np.float32)
    mask = np.empty(truth.shape, dtype=bool)
    for rows in _row_blocks(truth.shape[0]):
        mask[rows] = uniform[rows] < expit(item_logit + by_rating[truth[rows]])
    return propensity, float(intercept), mask


def _race_winners(
    race: np.ndarray, truth: np.ndarray, popularity: np.ndarray, propensity: np.ndarray, n_rated: np.ndarray
) -> np.ndarray:
    """Boolean mask of the ``n_rated[u]`` smallest keys ``race / (popularity * propensity[r])`` per row u."""
    by_rating = np.concatenate([[np.nan], propensity]).astype(np.float32)  # indexed by rating 1..K
    item_weight = popularity.astype(np.float32)
    mask = np.empty(race.shape, dtype=bool)
    for rows in _row_blocks(race.shape[0]):
        keys = race[rows] / (by_rating[truth[rows]] * item_weight)
        counts = n_rated[rows]
        cut = np.sort(keys, axis=1)[np.arange(keys.shape[0]), np.maximum(counts - 1, 0)]
        mask[rows] = (keys <= cut[:, None]) & (counts > 0)[:, None]  # index -1 would take the largest key
    return mask


def _simulate_with_logistic_selection(config: SimulatorConfig, rng: np.random.Generator) -> RatingsData:
    """Users drawn in blocks, each cell rated by its own logistic draw; the first ``n_users`` users with at
    least ``min_ratings_per_user`` ratings are kept, the others dropped (as Yahoo! R3 dropped light users).

    The selection is solved on the first blocks, drawn until they hold about ``_SOLVE_KEPT`` users likely to
    be kept (a rough solve on the first block tells which), so that the solve sees enough kept users even
    when most are dropped; those blocks are then part of the data like the later ones.
    """
    item_bias = rng.normal(0.0, np.sqrt(config.item_bias_var), config.n_items)
    item_factors = rng.normal(0.0, _factor_sd(config), (config.n_items, config.rank))
    popularity = config.popularity_floor + np.exp(config.popularity_sigma * rng.standard_normal(config.n_items))
    noise_sd = float(np.sqrt(config.noise_var))
    blocks = [_draw_users(_SOLVE_USERS, config, rng, item_bias, item_factors, noise_sd)]
    solver = _LogisticSolver(popularity, config)
    solver.solve(blocks[0]["score"], blocks[0]["activity"], rounds=1)
    keep_rate = _check_keep_rate(solver.keep.mean(), config)
    likely = solver.keep.sum()
    while likely < _SOLVE_KEPT:
        wanted = int(np.ceil((_SOLVE_KEPT - likely) / keep_rate))
        blocks.append(_draw_users(min(wanted, _MAX_BLOCK_USERS), config, rng, item_bias, item_factors, noise_sd))
        likely += solver.keep_probability(blocks[-1]["score"], blocks[-1]["activity"]).sum()
    score = np.concatenate([b["score"] for b in blocks])
    activity = np.concatenate([b["activity"] for b in blocks])
    relevant = np.flatnonzero(solver.keep_probability(score, activity) > _RELEVANT_KEEP)[:_SOLVE_MAX_USERS]
    # the users left out would be kept with a negligible chance: they barely weigh on the kept users' statistics
    solver.solve(score[relevant], activity[relevant], rounds=1 + _THRESHOLD_ROUNDS)
    del score, activity  # the rough keep rate still sizes the later blocks: its error only changes their number
    kept_blocks, n_kept, n_drawn = [], 0, 0
    while True:
        block = blocks.pop(0) if blocks else None
        if block is None:
            short = config.n_users - n_kept  # a margin of a few binomial sds, so that one more block is enough
            wanted = int(np.ceil((short + 3 * np.sqrt(short) + 16) / keep_rate))
            block = _draw_users(min(wanted, _MAX_BLOCK_USERS), config, rng, item_bias, item_factors, noise_sd)
        truth = _cut(block.pop("score"), solver.thresholds)
        mask = _logistic_mask(truth, block["activity"], popularity, solver.selection, rng)
        kept = np.flatnonzero(mask.sum(axis=1) >= config.min_ratings_per_user)[:config.n_users - n_kept]
        kept_blocks.append({**{name: values[kept] for name, values in block.items()}, "truth": truth[kept],
                            "mask": mask[kept]})
        n_kept, n_drawn = n_kept + len(kept), n_drawn + len(truth)
        del truth, mask, block
        if n_kept == config.n_users:
            break
    users = {name: np.concatenate([b[name] for b in kept_blocks]) for name in kept_blocks[0]}
    del kept_blocks
    _check_levels(users["truth"], config)
    oracle = _expected_rating(users.pop("signal"), solver.thresholds, noise_sd)
    selection = solver.selection
    params = {"user_bias": users["user_bias"], "item_bias": item_bias, "user_factors": users["user_factors"],
              "item_factors": item_factors, "noise_sd": noise_sd, "thresholds": solver.thresholds,
              "popularity": popularity, "propensity": selection["propensity"],
              "selection_intercept": selection["intercept"], "activity_sd": selection["activity_sd"],
              "activity": selection["activity_sd"] * users["activity"], "users_drawn": n_drawn}
    return _assemble(config, rng, users["truth"], users["mask"], oracle, params)


def _check_keep_rate(keep_rate: float, config: SimulatorConfig) -> float:
    if keep_rate < _MIN_KEEP_RATE:
        raise ValueError(f"the logistic selection keeps {keep_rate:.2g} of the simulated users (at least "
                         f"min_ratings_per_user = {config.min_ratings_per_user} ratings each): raise "
                         "median_ratings_per_user and mean_ratings_per_user, or lower min_ratings_per_user")
    return keep_rate


def _draw_users(n: int, config: SimulatorConfig, rng: np.random.Generator, item_bias: np.ndarray,
                item_factors: np.ndarray, noise_sd: float) -> dict[str, np.ndarray]:
    """``n`` fresh users: biases, standard-normal activities, factors, noiseless signal and noisy score."""
    user_bias = rng.normal(0.0, np.sqrt(config.user_bias_var), n)
    rho = config.activity_bias_correlation
    standardised_bias = user_bias / np.sqrt(config.user_bias_var) if config.user_bias_var > 0 else 0.0
    activity = rho * standardised_bias + np.sqrt(1.0 - rho**2) * rng.standard_normal(n)  # standard normal
    user_factors = rng.normal(0.0, _factor_sd(config), (n, config.rank))
    signal = _signal(user_bias, user_factors, item_bias, item_factors)
    score = rng.standard_normal(signal.shape, dtype=np.float32)
    score *= noise_sd
    score += signal
    return {"user_bias": user_bias, "activity": activity, "user_factors": user_factors, "signal": signal,
            "score": score}


def _logistic_mask(truth: np.ndarray, activity: np.ndarray, popularity: np.ndarray, selection: dict,
                   rng: np.random.Generator) -> np.ndarray:
    """Pr(rated) = sigmoid(intercept + activity_sd * activity_u + log popularity_i + log propensity_r), per cell."""
    by_rating = np.concatenate([[np.nan], np.log(selection["propensity"])]).astype(np.float32)
    item_logit = (selection["intercept"] + np.log(popularity)).astype(np.float32)
    user_logit = (selection["activity_sd"] * activity).astype(np.float32)
    uniform = rng.random(truth.shape, dtype=np.float32)
    mask = np.empty(truth.shape, dtype=bool)
    for rows in _row_blocks(truth.shape[0]):
        mask[rows] = uniform[rows] < expit(item_logit + user_logit[rows, None] + by_rating[truth[rows]])
    return mask


class _LogisticSolver:
    """Thresholds and the logistic selection's parameters, solved on a sample of users.

    The parameters (intercept, activity sd, per-level logits) are fitted by least squares so that the users
    kept (at least ``min_ratings_per_user`` ratings) have the target median and mean count and train shares,
    each user's count taken as a binomial with its expected count and variance. The thresholds are score
    quantiles over the sample's cells, each user weighted by its chance to be kept, so that the kept
    users' cells have the MCAR shares; the two are solved in turn.
    """

    def __init__(self, popularity: np.ndarray, config: SimulatorConfig):
        self.config = config
        log_popularity = np.log(popularity)
        edges = np.linspace(log_popularity.min(), log_popularity.max(), _POPULARITY_BINS + 1)[1:-1]
        self.item_bin = np.searchsorted(edges, log_popularity)
        per_bin = np.maximum(np.bincount(self.item_bin, minlength=_POPULARITY_BINS), 1)
        self.bin_logit = np.bincount(self.item_bin, log_popularity, _POPULARITY_BINS) / per_bin
        self.theta, self.thresholds, self.keep = None, None, None

    def counts(self, score: np.ndarray, activity: np.ndarray) -> _KeptCounts:
        n_levels = len(self.config.mcar_shares)
        truth = _cut(score, self.thresholds)
        _check_levels(truth, self.config)
        codes = (np.arange(len(score))[:, None] * _POPULARITY_BINS + self.item_bin) * n_levels + truth - 1
        table = np.bincount(codes.ravel(), minlength=len(score) * _POPULARITY_BINS * n_levels).reshape(
            len(score), _POPULARITY_BINS, n_levels).astype(np.float64)
        return _KeptCounts(table, activity, self.bin_logit, self.config)

    def solve(self, score: np.ndarray, activity: np.ndarray, rounds: int) -> None:
        cumulative = np.cumsum(_normalised(self.config.mcar_shares))[:-1]
        weights = np.ones(len(score)) if self.keep is None else self.keep_probability(score, activity)
        for _ in range(rounds):
            self.thresholds = _weighted_quantiles(score, weights, cumulative)
            counts = self.counts(score, activity)
            self.theta = counts.solve(self.theta)
            weights = self.keep = counts.statistics(self.theta)["keep"]

    def keep_probability(self, score: np.ndarray, activity: np.ndarray) -> np.ndarray:
        return self.counts(score, activity).statistics(self.theta)["keep"]

    @property
    def selection(self) -> dict:
        intercept, activity_sd, level_logit = _KeptCounts.unpack(self.theta)
        shift = np.log(np.exp(level_logit).sum())  # normalise the propensity, keeping the logits
        return {"intercept": float(intercept + shift), "activity_sd": float(activity_sd),
                "propensity": np.exp(level_logit - shift)}


class _KeptCounts:
    """The kept users' count statistics as smooth functions of the logistic selection's parameters.

    ``table[u, b, r]``: user u's items in popularity bin b with rating r. Parameters ``theta`` =
    (intercept, log activity sd, logits of levels 1..K-1 relative to level K).
    """

    def __init__(self, table: np.ndarray, activity: np.ndarray, bin_logit: np.ndarray, config: SimulatorConfig):
        self.table, self.activity, self.bin_logit = table, activity, bin_logit
        self.minimum = config.min_ratings_per_user
        self.median, self.mean = config.median_ratings_per_user, config.mean_ratings_per_user
        self.train_shares = _normalised(config.train_shares)
        self.mcar_shares = _normalised(config.mcar_shares)
        self.counts = np.arange(min(int(3 * self.median) + 10, config.n_items) + 1)  # where the CDFs are evaluated
        self.log_factorials = gammaln(self.counts + 1.0)

    @staticmethod
    def unpack(theta: np.ndarray) -> tuple[float, float, np.ndarray]:
        return theta[0], float(np.exp(theta[1])), np.append(theta[2:], 0.0)

    def statistics(self, theta: np.ndarray) -> dict:
        intercept, activity_sd, level_logit = self.unpack(theta)
        logits = (intercept + activity_sd * self.activity[:, None, None] + self.bin_logit[None, :, None]
                  + level_logit[None, None, :])
        chance = expit(logits)
        by_level = np.einsum("ubr,ubr->ur", self.table, chance)  # expected counts per user and level
        expected = np.maximum(by_level.sum(axis=1), 1e-300)  # > 0: a user's cells can all be near-certain misses
        spread = np.einsum("ubr,ubr->u", self.table, chance * (1.0 - chance))  # the count's variance
        # the count as a binomial of that mean and variance (a few near-certain cells make it narrower than a
        # Poisson), in logs so that heavy users underflow to 0, not NaN
        p = np.clip(1.0 - spread / expected, 1e-9, 1.0 - 1e-9)[:, None]
        n = expected[:, None] / p
        k = self.counts[None, :]
        log_pmf = (gammaln(n + 1.0) - self.log_factorials - gammaln(np.maximum(n - k, 0.0) + 1.0)
                   + k * np.log(p) + (n - k) * np.log1p(-p))
        pmf = np.where(k <= n, np.exp(log_pmf), 0.0)
        below = np.cumsum(pmf, axis=1)  # Pr(N <= n)
        m = self.minimum
        keep = 1.0 - below[:, m - 1] if m > 0 else np.ones_like(expected)
        kept = keep.sum()
        # E[N 1{N >= m}], shared out among the levels in proportion to their expected counts
        kept_count = expected - (pmf[:, :m] * self.counts[:m]).sum(axis=1)
        kept_by_level = (by_level * (kept_count / expected)[:, None]).sum(axis=0)
        cdf = (below[:, m:] - (1.0 - keep)[:, None]).sum(axis=0) / kept  # of the kept users' counts
        return {"keep": keep, "mean": kept_by_level.sum() / kept, "shares": kept_by_level / kept_by_level.sum(),
                "median": _crossing(self.counts[m:], cdf)}

    def residuals(self, theta: np.ndarray) -> np.ndarray:
        stats = self.statistics(theta)
        # the realised median is an integer: aim the CDF's crossing of 1/2 at the middle of its step
        return np.concatenate([[(stats["mean"] - self.mean) / self.mean,
                                (stats["median"] - (self.median - 0.5)) / self.median],
                               np.log(np.maximum(stats["shares"], 1e-300) / self.train_shares)])

    def solve(self, start: np.ndarray | None) -> np.ndarray:
        if start is None:
            level_logit = np.log(self.train_shares / self.mcar_shares)
            level_logit -= level_logit[-1]
            mass = (self.table * np.exp(self.bin_logit[None, :, None] + level_logit)).sum(axis=(1, 2)).mean()
            start = np.concatenate([[np.log(self.mean / mass) - 0.5, 0.0], level_logit[:-1]])
        return least_squares(self.residuals, start, method="lm", xtol=1e-8, ftol=1e-8).x


def _crossing(grid: np.ndarray, cdf: np.ndarray) -> float:
    """Where the CDF of counts (at the integers ``grid``, zero below them) crosses 1/2, linear in between."""
    above = int(np.searchsorted(cdf, 0.5))
    if above == len(grid):
        return float(grid[-1]) + 0.5 - cdf[-1]  # beyond the grid: still increasing, for the solver
    below = cdf[above - 1] if above > 0 else 0.0
    return float(grid[above] - 1 + (0.5 - below) / (cdf[above] - below))


def _weighted_quantiles(score: np.ndarray, user_weights: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Quantiles of the cells' scores, each cell weighted by its user's weight, from a fine histogram."""
    lo, hi = float(score.min()), float(score.max())
    step = max(hi - lo, 1e-6) / _QUANTILE_BINS
    cells = np.minimum(((score - lo) / step).astype(np.intp), _QUANTILE_BINS - 1)
    mass = np.bincount(cells.ravel(), np.broadcast_to(user_weights[:, None], score.shape).ravel(), _QUANTILE_BINS)
    cumulative = np.concatenate([[0.0], np.cumsum(mass)]) / mass.sum()
    return lo + step * np.interp(levels, cumulative, np.arange(_QUANTILE_BINS + 1))


def _mcar_cells(config: SimulatorConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Uniformly random distinct items for each of the first ``n_test_users`` users."""
    k = config.test_items_per_user
    draws = rng.random((config.n_test_users, config.n_items))
    cols = np.argpartition(draws, k - 1, axis=1)[:, :k]
    return np.repeat(np.arange(config.n_test_users), k), cols.ravel()
