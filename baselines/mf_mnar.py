"""MF-MNAR (Hernández-Lobato, Houlsby & Ghahramani, ICML 2014): ordinal MF of ratings tied to a logistic mask MF.

Ratings: a_ij = u_i·v_j + b_i + c_j, P(r=l | a) = Phi(t_l - a) - Phi(t_{l-1} - a), t_0 = -inf, t_L = +inf,
t_l = t_1 + sum_{m<l} softplus(delta_m). Mask: P(o=1 | r=l) = sigmoid(eta_ij + omega_l), eta_ij = g_i·h_j + e_i + f_j.
A missing rating is summed out over the L levels exactly (in log space); the loss is

    -sum_O [log P(r|a) + log sigmoid(eta + omega_r)] - sum_{o=0} logsumexp_l [log P(l|a) + log sigmoid(-eta - omega_l)]
    + l2 (|U|^2 + |V|^2 + |b|^2 + |c|^2 + |e|^2 + |f|^2) + l2_mask (|G|^2 + |H|^2).

An o=0 cell is predicted by the mean of q(l) ∝ P(l|a) (1 - sigmoid(eta + omega_l)), clipped to rating_scale.
The o=0 sum runs over all cells in row chunks, or over fresh uniform cells each step weighted (users x items) / sample.
MAP by Adam, not the paper's EP: point estimates reach every cell by autograd with no factor graph to build.
Choices where the paper is silent or out of reach (the spec's "implementable MAP", in its spirit):
- thresholds shared by users: b_i shifts each user's scale; per-user gaps need the paper's hierarchical prior;
- L2 for the priors, heavier on g, h so the mask MF cannot absorb the missingness; omega (L values) unpenalised;
- omega starts increasing in the rating (users mostly rate what they like), e and f at centred logits of observed
  fractions, the thresholds at the probit quantiles of the observed levels.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from mnar_recsys.checks import check_positive_finite, check_positive_integer
from mnar_recsys.checks.ratings import check_fitted, check_on_scale, check_pairs, check_ratings

# the grid `baselines.registry.tune_baseline` searches on held-out train ratings
MF_MNAR_GRID: tuple[dict[str, float], ...] = tuple({"rank": k, "l2": l2} for k in (5, 10, 20)
                                                   for l2 in (1.0, 3.0, 10.0, 30.0))


@dataclass
class MFMNARConfig:
    """Hyper-parameters of MF-MNAR.

    rank and l2 were chosen over ``MF_MNAR_GRID`` by a 10% validation split of the Coat *train* ratings
    (``baselines.selection.select_config``), never the MCAR test; the other fields were not tuned. A weak l2
    lets the rating MF explain the mask (unobserved cells rated low, omega steep). On another data set choose
    again (``baselines.registry.tune_baseline``).
    """

    #: latent dimension of the rating factors u_i, v_j.
    rank: int = 10
    #: latent dimension of the mask factors g_i, h_j.
    mask_rank: int = 5
    #: L2 weight on u, v, b, c, e, f (the loss is a sum over cells, so this is a prior precision / 2).
    l2: float = 10.0
    #: L2 weight on the mask factors g, h; large, so that they cannot absorb the missingness.
    l2_mask: float = 30.0
    #: Adam steps, each over the observed ratings and the unobserved term (all of it or a sample).
    n_iters: int = 400
    #: Adam's initial step size, cosine-decayed to 0 over n_iters.
    lr: float = 0.05
    #: cells drawn uniformly (with replacement) per step for the o=0 sum; None, or a number of at least users x items,
    #: sums every cell instead.
    unobserved_sample: int | None = 1_000_000
    #: observed ratings drawn uniformly (with replacement) per step, each counted ratings / batch times; None, or a
    #: number of at least the ratings, uses them all.
    observed_batch: int | None = None
    #: user x item cells per row chunk of the full o=0 sum (bounds its memory).
    chunk_cells: int = 1 << 19
    #: omega_l starts at slope * (l - mean level) plus the logit of the density.
    omega_init_slope: float = 0.5
    #: standard deviation of the Gaussian initialisation of the factors.
    init_std: float = 0.1
    #: False holds omega equal across levels (the MAR model: the mask then factorises out of the rating model's loss
    #: and is left at its start).
    mnar: bool = True
    #: the levels are the integers from low to high; predictions are clipped to it.
    rating_scale: tuple[float, float] = (1.0, 5.0)
    #: seeds the initialisation and the unobserved-cell draws.
    seed: int = 0


_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class _LogNdtr(torch.autograd.Function):
    """log Phi(x) as torch.special.log_ndtr gives it (to float32 precision) in a fraction of its time: one erfc,
    and the asymptotic series below x = -10; the gradient phi(x) / Phi(x) is one exp of the saved value."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        tail = 0.5 * torch.erfc(x.abs() * 0.5 ** 0.5)  # Phi(-|x|), underflows only beyond the series' cut
        y = torch.where(x < 0, torch.log(tail), torch.log1p(-tail))
        far = x < -10.0
        if far.any():
            t = x[far]
            w = 1.0 / (t * t)
            series = 1.0 + w * (-1.0 + w * (3.0 + w * (-15.0 + w * (105.0 - 945.0 * w))))
            y[far] = -0.5 * t * t - torch.log(-t) - _HALF_LOG_2PI + torch.log(series)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        x, y = ctx.saved_tensors
        return grad * torch.exp(-0.5 * x * x - _HALF_LOG_2PI - y)


def log_ndtr(x: torch.Tensor) -> torch.Tensor:
    """log of the standard normal cdf, differentiable (see ``_LogNdtr``)."""
    return _LogNdtr.apply(x)


def log_level_probs(a: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """log P(r = l | a) for every level, shape a.shape + (L,), from the L-1 increasing ``thresholds``.

    A middle level's Phi(hi) - Phi(lo) is taken in whichever tail keeps both arguments' sum <= 0 (reflecting
    to S(-lo) - S(-hi) otherwise), so neither cdf is near 1 and the difference keeps its precision.
    """
    x = thresholds - a.unsqueeze(-1)
    lo, hi = x[..., :-1], x[..., 1:]
    flip = lo + hi > 0
    upper = torch.where(flip, -lo, hi)
    lower = torch.where(flip, -hi, lo)
    log_upper = log_ndtr(upper)
    middle = log_upper + _log1mexp(log_ndtr(lower) - log_upper)
    first = log_ndtr(x[..., :1])
    last = log_ndtr(-x[..., -1:])
    return torch.cat([first, middle, last], dim=-1)


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, accurate at both ends; each branch sees only inputs where it is finite."""
    x = x.clamp(max=-1e-7)  # a degenerate gap; keeps the log finite
    cut = -math.log(2.0)
    near = torch.log(-torch.expm1(x.clamp(min=cut)))
    far = torch.log1p(-torch.exp(x.clamp(max=cut)))
    return torch.where(x > cut, near, far)


@dataclass
class MFMNARParameters:
    """The fitted point estimates (float64 copies; rows follow users, items, levels)."""

    user_factors: np.ndarray  # u, (users, rank)
    item_factors: np.ndarray  # v, (items, rank)
    user_bias: np.ndarray  # b
    item_bias: np.ndarray  # c
    thresholds: np.ndarray  # t_1 < ... < t_{L-1}
    mask_user_factors: np.ndarray  # g, (users, mask_rank)
    mask_item_factors: np.ndarray  # h
    mask_user_bias: np.ndarray  # e
    mask_item_bias: np.ndarray  # f
    omega: np.ndarray  # (L,), one value repeated for the MAR model


class _Tensors:
    """The trainable tensors and the per-cell quantities built from them."""

    def __init__(self, p: dict[str, torch.Tensor]) -> None:
        self.p = p

    def thresholds(self) -> torch.Tensor:
        gaps = F.softplus(self.p["delta"])
        return self.p["t1"] + torch.cat([gaps.new_zeros(1), torch.cumsum(gaps, 0)])

    def at_cells(self, rows: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, eta) at the listed cells."""
        p = self.p
        a = (p["u"][rows] * p["v"][cols]).sum(-1) + p["b"][rows] + p["c"][cols]
        eta = (p["g"][rows] * p["h"][cols]).sum(-1) + p["e"][rows] + p["f"][cols]
        return a, eta

    def at_rows(self, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, eta) for every item of a block of users, shape (rows, items)."""
        p = self.p
        a = p["u"][rows] @ p["v"].T + p["b"][rows, None] + p["c"]
        eta = p["g"][rows] @ p["h"].T + p["e"][rows, None] + p["f"]
        return a, eta

    def unobserved_joint(self, a: torch.Tensor, eta: torch.Tensor) -> torch.Tensor:
        """log P(r=l, o=0 | a, eta) per cell and level."""
        return log_level_probs(a, self.thresholds()) + F.logsigmoid(-(eta.unsqueeze(-1) + self.p["omega"]))

    def unobserved_log_lik(self, a: torch.Tensor, eta: torch.Tensor) -> torch.Tensor:
        """log P(o=0 | a, eta) = log sum_l P(l|a) P(o=0|l) per cell."""
        return torch.logsumexp(self.unobserved_joint(a, eta), dim=-1)

    def penalty(self, l2: float, l2_mask: float) -> torch.Tensor:
        p = self.p
        rating = sum(p[k].square().sum() for k in ("u", "v", "b", "c", "e", "f"))
        return l2 * rating + l2_mask * (p["g"].square().sum() + p["h"].square().sum())


class _CellSet:
    """Membership of flat cell indices in a set, as one bit per cell (an eighth of a byte mask's memory)."""

    def __init__(self, cells: torch.Tensor, n_cells: int) -> None:
        bits = np.zeros((n_cells + 7) // 8, dtype=np.uint8)
        cells = cells.numpy()
        np.bitwise_or.at(bits, cells >> 3, (1 << (cells & 7)).astype(np.uint8))
        self.bits = torch.from_numpy(bits)

    def __call__(self, cells: torch.Tensor) -> torch.Tensor:
        return ((self.bits[cells >> 3] >> (cells & 7).to(torch.uint8)) & 1).bool()


class MFMNAR:
    """MF-MNAR recommender (Recommender protocol), MAP-fitted; predicts the o=0 posterior mean."""

    name = "mf-mnar"

    def __init__(self, config: MFMNARConfig | None = None, **overrides: object) -> None:
        """Build from an ``MFMNARConfig`` or keyword overrides of its fields."""
        base = config or MFMNARConfig()
        self.config = MFMNARConfig(**{**base.__dict__, **overrides})
        self.params: MFMNARParameters | None = None

    @property
    def levels(self) -> np.ndarray:
        """The rating values 1..L (rating_scale's integers)."""
        low, high = self.config.rating_scale
        return np.arange(int(low), int(high) + 1, dtype=np.float64)

    def fit(self, train: sp.csr_matrix) -> MFMNAR:
        """MAP fit to ``train`` (users x items CSR of integer ratings on rating_scale; unstored = unobserved)."""
        cfg = self._checked_config()
        train = self._checked_ratings(train)
        n_cells = train.shape[0] * train.shape[1]
        generator = torch.Generator().manual_seed(cfg.seed)
        obs = self._observed(train)
        tensors = _Tensors(self._initial(train, generator))
        params = [t for k, t in tensors.p.items() if cfg.mnar or k not in ("omega", "g", "h", "e", "f")]
        for t in params:
            t.requires_grad_()
        optimiser = torch.optim.Adam(params, lr=cfg.lr)
        # sampled steps settle only as the step size shrinks; the full-batch fit keeps the same schedule
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, cfg.n_iters)
        sample_unobserved = cfg.unobserved_sample is not None and cfg.unobserved_sample < n_cells
        observed_batch = cfg.observed_batch if (cfg.observed_batch or train.nnz) < train.nnz else None
        is_observed = _CellSet(obs[0] * train.shape[1] + obs[1], n_cells)
        for _ in range(cfg.n_iters):
            optimiser.zero_grad()
            if observed_batch is None:
                observed = self._observed_log_lik(tensors, obs)
            else:
                pick = torch.randint(train.nnz, (observed_batch,), generator=generator)
                observed = self._observed_log_lik(tensors, tuple(t[pick] for t in obs)) * (train.nnz / observed_batch)
            loss = tensors.penalty(cfg.l2, cfg.l2_mask) - observed
            if cfg.mnar and sample_unobserved:
                loss = loss - self._sampled_unobserved(tensors, is_observed, train.shape, generator)
            loss.backward()
            if cfg.mnar and not sample_unobserved:
                for rows, mask in self._row_chunks(train):
                    (-self._chunk_unobserved(tensors, rows, mask)).backward()
            optimiser.step()
            schedule.step()
        self.params = self._export(tensors)
        return self

    def objective(self, train: sp.csr_matrix) -> float:
        """The exact loss (module docstring) of the fitted parameters on ``train``, every o=0 cell summed."""
        check_fitted(self, "params")
        cfg = self.config
        train = self._checked_ratings(train)
        if train.shape != self.params.user_bias.shape + self.params.item_bias.shape:
            raise ValueError(f"train shape {train.shape} differs from the fitted "
                             f"{self.params.user_bias.shape + self.params.item_bias.shape}")
        tensors = self._tensors()
        with torch.no_grad():
            total = -self._observed_log_lik(tensors, self._observed(train)).double()
            total += tensors.penalty(cfg.l2, cfg.l2_mask).double()
            for rows, mask in self._row_chunks(train):
                total -= self._chunk_unobserved(tensors, rows, mask).double()
        return float(total)

    def posterior(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """q(l) for each (users[k], items[k]) pair as an unobserved cell, shape (pairs, L)."""
        tensors, a, eta = self._at_cells(users, items)
        with torch.no_grad():
            return torch.softmax(tensors.unobserved_joint(a, eta), dim=-1).double().numpy()

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """sum_l l q(l) for the (users[k], items[k]) pairs, taken as unobserved cells, clipped to rating_scale."""
        return np.clip(self.posterior(users, items) @ self.levels, *self.config.rating_scale)

    def expected_rating(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """E[r | a] = sum_l l P(l|a), the rating model's mean ignoring that the cell is unobserved, clipped."""
        tensors, a, _ = self._at_cells(users, items)
        with torch.no_grad():
            probs = log_level_probs(a, tensors.thresholds()).exp().double().numpy()
        return np.clip(probs @ self.levels, *self.config.rating_scale)

    def _at_cells(self, users: np.ndarray, items: np.ndarray):
        """The fitted tensors and the rating and mask models' linear predictors at the checked (user, item) pairs."""
        check_fitted(self, "params")
        u, i = check_pairs(users, items, (len(self.params.user_bias), len(self.params.item_bias)))
        tensors = self._tensors()
        with torch.no_grad():
            a, eta = tensors.at_cells(torch.from_numpy(u), torch.from_numpy(i))
        return tensors, a, eta

    def _checked_config(self) -> MFMNARConfig:
        cfg = self.config
        for name in ("rank", "mask_rank", "n_iters", "chunk_cells"):
            check_positive_integer(f"MFMNARConfig.{name}", getattr(cfg, name))
        for name in ("unobserved_sample", "observed_batch"):
            if getattr(cfg, name) is not None:
                check_positive_integer(f"MFMNARConfig.{name}", getattr(cfg, name))
        for name in ("l2", "l2_mask", "lr", "init_std"):
            check_positive_finite(f"MFMNARConfig.{name}", getattr(cfg, name))
        slope = cfg.omega_init_slope
        if isinstance(slope, bool) or not isinstance(slope, numbers.Real) or not math.isfinite(slope):
            raise ValueError(f"MFMNARConfig.omega_init_slope must be a finite number, got {slope!r}")
        if not isinstance(cfg.mnar, bool):
            raise ValueError(f"MFMNARConfig.mnar must be True or False, got {cfg.mnar!r}")
        scale = cfg.rating_scale
        if (scale is None or len(scale) != 2 or not all(float(s).is_integer() for s in scale)
                or scale[1] - scale[0] < 1):
            raise ValueError(f"MFMNARConfig.rating_scale must be (low, high) integers with low < high (the levels "
                             f"are the integers between them), got {scale!r}")
        return cfg

    def _checked_ratings(self, train: sp.csr_matrix) -> sp.csr_matrix:
        train = check_ratings(train)
        check_on_scale(train, self.config.rating_scale)
        fractional = np.flatnonzero(train.data != np.round(train.data))
        if fractional.size:
            first = fractional[0]
            raise ValueError(f"train holds {fractional.size} non-integer ratings, the first {train.data[first]:g}: "
                             "MF-MNAR models ordinal levels (round or bin them first)")
        return train

    def _observed(self, train: sp.csr_matrix) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rows, cols, level index) of the stored ratings, in CSR order."""
        rows = np.repeat(np.arange(train.shape[0]), np.diff(train.indptr))
        level = (train.data - self.config.rating_scale[0]).astype(np.int64)
        return torch.from_numpy(rows), torch.from_numpy(train.indices.astype(np.int64)), torch.from_numpy(level)

    def _initial(self, train: sp.csr_matrix, generator: torch.Generator) -> dict[str, torch.Tensor]:
        cfg = self.config
        n_users, n_items = train.shape
        n_levels = len(self.levels)

        def normal(*shape: int) -> torch.Tensor:
            return cfg.init_std * torch.randn(*shape, generator=generator)

        def centred_logit(count: np.ndarray, size: int) -> torch.Tensor:
            frac = (count + 0.5) / (size + 1.0)  # keeps rows without ratings finite
            logit = np.log(frac) - np.log1p(-frac)
            return torch.from_numpy(logit - logit.mean()).float()

        # thresholds at the probit quantiles of the observed level shares, so P(l|a=0) starts at those shares
        shares = np.bincount((train.data - cfg.rating_scale[0]).astype(np.int64), minlength=n_levels) + 1.0
        cuts = torch.special.ndtri(torch.from_numpy(np.cumsum(shares)[:-1] / shares.sum())).float()
        density = train.nnz / (n_users * n_items)
        slope = cfg.omega_init_slope if cfg.mnar else 0.0
        omega = math.log(density / (1 - density)) + slope * (torch.arange(n_levels) - (n_levels - 1) / 2)
        return {
            "u": normal(n_users, cfg.rank), "v": normal(n_items, cfg.rank),
            "b": torch.zeros(n_users), "c": torch.zeros(n_items),
            "t1": cuts[:1].clone(), "delta": torch.log(torch.expm1(torch.diff(cuts).clamp(min=1e-3))),
            "g": normal(n_users, cfg.mask_rank), "h": normal(n_items, cfg.mask_rank),
            "e": centred_logit(np.diff(train.indptr), n_items),
            "f": centred_logit(np.bincount(train.indices, minlength=n_items), n_users),
            "omega": omega.float(),
        }

    def _observed_log_lik(self, tensors: _Tensors, obs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        rows, cols, level = obs
        a, eta = tensors.at_cells(rows, cols)
        log_rating = log_level_probs(a, tensors.thresholds()).gather(-1, level[:, None]).squeeze(-1)
        return (log_rating + F.logsigmoid(eta + tensors.p["omega"][level])).sum()

    def _sampled_unobserved(self, tensors: _Tensors, is_observed: _CellSet, shape: tuple[int, int],
                            generator: torch.Generator) -> torch.Tensor:
        """Unbiased estimate of the o=0 log-likelihood: uniform cells, observed ones dropped, each counted
        (users x items) / sample times."""
        n_cells = shape[0] * shape[1]
        cells = torch.randint(n_cells, (self.config.unobserved_sample,), generator=generator)
        cells = cells[~is_observed(cells)]
        a, eta = tensors.at_cells(cells // shape[1], cells % shape[1])
        return tensors.unobserved_log_lik(a, eta).sum() * (n_cells / self.config.unobserved_sample)

    def _row_chunks(self, train: sp.csr_matrix) -> Iterator[tuple[slice, torch.Tensor]]:
        """(row slice, dense 0/1 observed mask of those rows) over blocks of about chunk_cells cells."""
        step = max(1, self.config.chunk_cells // train.shape[1])
        for start in range(0, train.shape[0], step):
            rows = slice(start, min(start + step, train.shape[0]))
            yield rows, torch.from_numpy(train[rows].toarray() != 0)

    def _chunk_unobserved(self, tensors: _Tensors, rows: slice, observed: torch.Tensor) -> torch.Tensor:
        a, eta = tensors.at_rows(rows)
        return tensors.unobserved_log_lik(a, eta).masked_fill(observed, 0.0).sum()

    def _export(self, tensors: _Tensors) -> MFMNARParameters:
        p = {k: t.detach() for k, t in tensors.p.items()}

        def as_np(t: torch.Tensor) -> np.ndarray:
            return t.double().numpy().copy()

        return MFMNARParameters(
            user_factors=as_np(p["u"]), item_factors=as_np(p["v"]), user_bias=as_np(p["b"]),
            item_bias=as_np(p["c"]), thresholds=as_np(_Tensors(p).thresholds()),
            mask_user_factors=as_np(p["g"]), mask_item_factors=as_np(p["h"]), mask_user_bias=as_np(p["e"]),
            mask_item_bias=as_np(p["f"]), omega=as_np(p["omega"]),
        )

    def _tensors(self) -> _Tensors:
        """The fitted parameters as float32 tensors, thresholds reparametrised back to (t1, delta)."""
        q = self.params
        t = torch.from_numpy(q.thresholds).float()
        gaps = torch.diff(t)
        return _Tensors({
            "u": torch.from_numpy(q.user_factors).float(), "v": torch.from_numpy(q.item_factors).float(),
            "b": torch.from_numpy(q.user_bias).float(), "c": torch.from_numpy(q.item_bias).float(),
            "t1": t[:1], "delta": gaps + torch.log(-torch.expm1(-gaps)),  # softplus^-1
            "g": torch.from_numpy(q.mask_user_factors).float(), "h": torch.from_numpy(q.mask_item_factors).float(),
            "e": torch.from_numpy(q.mask_user_bias).float(), "f": torch.from_numpy(q.mask_item_bias).float(),
            "omega": torch.from_numpy(q.omega).float(),
        })
