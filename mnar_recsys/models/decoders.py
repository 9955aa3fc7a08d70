"""Observation models p(x | z), fully factorised over features.

A decoder maps z of shape (..., d) to a tuple of parameter tensors whose feature axis is the first
axis after z's batch axes (shape (..., p) or (..., p, C)); `forward_entries` gives the same
parameters at chosen (row, feature) entries only, for catalogues too large for a (B, K, p) tensor.
The same decoder then scores values (`log_prob`), draws reparameterised samples (`rsample`, used
for x_m inside the bound), gives the conditional mean and CDF (imputation), and, where it can,
quadrature nodes over x_j (`quadrature`, used to integrate x_m out of a per-feature missing model).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mnar_recsys.models.activations import Tanh
from mnar_recsys.models.encoders import mlp
from mnar_recsys.models.gather import take
from mnar_recsys.models.integrated.base import gauss_hermite

Params = tuple[torch.Tensor, ...]


def squashed(loc: torch.Tensor, squash: tuple[float, float] | None) -> torch.Tensor:
    """A mean head's output mapped into (lo, hi) by lo + (hi - lo) * sigmoid; unchanged for None."""
    if squash is None:
        return loc
    lo, hi = squash
    return lo + (hi - lo) * torch.sigmoid(loc)


def sd_from_raw(raw: torch.Tensor, min_variance: float) -> torch.Tensor:
    """A Gaussian sd from its raw parameter or head output: sqrt(softplus(raw) + min_variance)."""
    return torch.sqrt(F.softplus(raw) + min_variance)


def gaussian_log_prob(loc: torch.Tensor, scale: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """log N(x | loc, scale²), elementwise."""
    return -0.5 * ((x - loc) / scale) ** 2 - torch.log(scale) - 0.5 * math.log(2 * math.pi)


def _trunk(latent_dim: int, hidden: tuple[int, ...], activation: type[nn.Module]) -> tuple[nn.Module, int]:
    if not hidden:
        return nn.Identity(), latent_dim
    return nn.Sequential(mlp([latent_dim, *hidden], activation), activation()), hidden[-1]


def _positions_in_rows(rows: torch.Tensor, n_rows: int) -> tuple[torch.Tensor, int]:
    """A distinct slot 0..L-1 for each entry within its row (rows in any order), and L, the longest row."""
    order = torch.argsort(rows, stable=True)
    counts = torch.bincount(rows, minlength=n_rows)
    starts = torch.cumsum(counts, 0) - counts
    slots = torch.empty_like(rows)
    slots[order] = torch.arange(rows.numel(), device=rows.device) - starts[rows[order]]
    return slots, int(counts.max()) if rows.numel() else 0


def linear_at_entries(head: nn.Linear, h: torch.Tensor, rows: torch.Tensor, units: torch.Tensor) -> torch.Tensor:
    """head(h)[rows[n], :, units[n, u]] -> (n, K, U) without computing the other output units.

    h is (B, K, width). Gathering h per entry would form an (n, K, width) tensor, which is slow and
    large; instead each row's weight vectors are packed into a padded (B, L * U, width) block and one
    batched matmul per row computes exactly the needed units, O(B · L · U · width) memory. Packing and
    unpacking go through one flat (row, slot) index, so both are plain row copies.
    """
    n_rows, n_units, width = h.shape[0], units.shape[1], h.shape[-1]
    slots, longest = _positions_in_rows(rows, n_rows)
    flat = rows * longest + slots
    packed = h.new_zeros(n_rows * longest, n_units, width).index_copy(0, flat, take(head.weight, units))
    out = torch.bmm(packed.view(n_rows, longest * n_units, width), h.transpose(1, 2))  # (B, L * U, K)
    picked = out.view(n_rows * longest, n_units, h.shape[1]).index_select(0, flat)  # (n, U, K)
    return picked.transpose(1, 2) + take(head.bias, units)[:, None, :]


class ObservationModel(nn.Module):
    """Common interface; subclasses implement the distribution-specific parts.

    Discrete models also hold a buffer `support`, their sorted levels. `integrable` models have
    `quadrature` nodes, over which x_m can be integrated out of a per-feature missing model; their `family`
    picks a faster kernel where one is registered (`models.integrated`). A 'gaussian' decoder's parameters are
    (loc, scale), with `shared_scale` and `quadrature_points`; a 'categorical' one's are level logits.
    """

    integrable: bool = False
    #: the distribution's name, which keys the integrated factor's kernels and the tilted posterior
    family: str | None = None

    def forward_entries(self, z: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> Params:
        """The parameters at entries (rows[n], cols[n]) for z of shape (B, K, d): each tensor (n, K, ...).

        This default gathers from the full forward pass, correct for any decoder; decoders with a
        dense linear head override it to compute only the needed head units.
        """
        return self.at_entries(self(z), rows, cols)

    def at_entries(self, params: Params, rows: torch.Tensor, cols: torch.Tensor) -> Params:
        """The forward pass's parameters (B, K, p, ...) at entries (rows[n], cols[n]): each (n, K, ...)."""
        return tuple(t[rows, :, cols] for t in params)

    def log_prob(self, params: Params, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def rsample(self, params: Params) -> torch.Tensor:
        raise NotImplementedError

    def sample(self, params: Params) -> torch.Tensor:
        """A draw for multiple imputation (not relaxed)."""
        with torch.no_grad():
            return self.rsample(params)

    def mean(self, params: Params) -> torch.Tensor:
        raise NotImplementedError

    def cdf(self, params: Params, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no CDF: the conditional median is not available")

    def scale(self, params: Params) -> torch.Tensor:
        """A scale per entry, which brackets the conditional median's search (decoders with a CDF)."""
        raise NotImplementedError(f"{type(self).__name__} has no scale to bracket the conditional median with")

    @property
    def hidden_width(self) -> int:
        """The widest hidden layer of the decoder's dense `trunk`, or of a custom mean net that says it (0
        otherwise): computed for each sample, it sizes the blocks of an importance pass as the outputs do, and
        outgrows them where features are few or a conv net's maps are many."""
        trunk = getattr(self, "trunk", None)
        if trunk is None:  # no dense trunk: a custom mean net (the conv decoder's) may give its own widest map
            return getattr(getattr(self, "mean_net", None), "hidden_width", 0)
        return max((m.out_features for m in trunk.modules() if isinstance(m, nn.Linear)), default=0)

    @property
    def has_cdf(self) -> bool:
        """Whether the decoder gives its CDF, which the conditional median needs."""
        return type(self).cdf is not ObservationModel.cdf

    def quadrature(self, params: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """Nodes and log-weights, each (..., p, H), with E[f(x_j)] ≈ Σ_h exp(logw_h) f(node_h)."""
        raise NotImplementedError(f"{type(self).__name__} cannot integrate x_m out; use missing_factor='sampled'")

    def check_values(self, values: np.ndarray) -> None:
        """Raise ValueError when observed values lie outside the model's support."""


class GaussianDecoder(ObservationModel):
    """Gaussian p(x_j | z) with an optionally squashed mean.

    squash=(lo, hi) maps the mean through lo + (hi - lo) * sigmoid (ratings on 1..5, pixels in [0, 1]).
    variance: 'shared' (one per feature, shared across rows), 'per_row' (a second head),
    'isotropic' (one for all features, the PPCA-like decoder). The variance never goes below
    `min_variance`. `mean_net`, when given, replaces the dense trunk and mean head (e.g. a conv net).
    """

    family = "gaussian"
    integrable = True

    def __init__(self, latent_dim: int, n_features: int, hidden: tuple[int, ...] = (128, 128),
                 activation: type[nn.Module] = Tanh, squash: tuple[float, float] | None = None,
                 variance: str = "shared", min_variance: float = 1e-3, quadrature_points: int = 8,
                 mean_net: nn.Module | None = None):
        super().__init__()
        if variance not in ("shared", "per_row", "isotropic"):
            raise ValueError(f"variance must be 'shared', 'per_row' or 'isotropic', got {variance!r}")
        if variance == "per_row" and mean_net is not None:
            raise ValueError("variance='per_row' needs the dense trunk, not a custom mean_net")
        self.squash = squash
        self.quadrature_points = quadrature_points
        self.variance = variance
        self.min_variance = min_variance
        if mean_net is None:
            self.trunk, width = _trunk(latent_dim, hidden, activation)
            self.mean_head = nn.Linear(width, n_features)
            self.mean_net = nn.Sequential(self.trunk, self.mean_head)
        else:
            self.mean_head = None
            self.mean_net = mean_net
        # softplus(0.5413) = 1: start every variance near 1
        if variance == "per_row":
            self.var_head = nn.Linear(width, n_features)
            nn.init.constant_(self.var_head.bias, 0.5413)
        else:
            self.raw_var = nn.Parameter(torch.full((n_features if variance == "shared" else 1,), 0.5413))
        nodes, weights = gauss_hermite(quadrature_points)
        self.register_buffer("gh_nodes", torch.tensor(nodes), persistent=False)
        self.register_buffer("gh_logw", torch.tensor(weights).log(), persistent=False)

    def forward(self, z: torch.Tensor) -> Params:
        if self.variance != "per_row":
            # shared variances are computed once per feature and broadcast, not once per (row, sample)
            loc = self.squash_mean(self.mean_net(z))
            return loc, self.shared_scale().expand_as(loc)
        h = self.trunk(z)  # once for both heads
        return self.squash_mean(self.mean_head(h)), self.scale_of(self.var_head(h))

    def forward_entries(self, z: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> Params:
        if self.mean_head is None:
            return super().forward_entries(z, rows, cols)
        h = self.trunk(z)
        loc = self.squash_mean(linear_at_entries(self.mean_head, h, rows, cols[:, None])[..., 0])
        if self.variance == "per_row":
            scale = self.scale_of(linear_at_entries(self.var_head, h, rows, cols[:, None])[..., 0])
        else:
            scale = self.shared_scale(cols)[..., None]
        return loc, scale.expand_as(loc)

    def at_entries(self, params: Params, rows: torch.Tensor, cols: torch.Tensor) -> Params:
        scale = self.shared_scale(cols)
        if scale is None:
            return super().at_entries(params, rows, cols)
        loc = params[0][rows, :, cols]
        return loc, scale[:, None].expand_as(loc)

    def shared_scale(self, features: torch.Tensor | None = None) -> torch.Tensor | None:
        """The sd of the given features (default all) when it does not depend on z, else None (per-row).

        Taken from the parameter rather than out of the broadcast forward output: the backward pass of
        an index into that (B, K, p) view would fill a (B, K, p) gradient to reach a (p,) parameter.
        """
        if self.variance == "per_row":
            return None
        return self.scale_of(self.raw_var if features is None or self.variance == "isotropic"
                           else take(self.raw_var, features))

    def squash_mean(self, loc: torch.Tensor) -> torch.Tensor:
        """The mean head's output mapped into `squash` (unchanged without one)."""
        return squashed(loc, self.squash)

    def scale_of(self, raw: torch.Tensor) -> torch.Tensor:
        """The sd from the variance's raw parameter or head output, floored at `min_variance`."""
        return sd_from_raw(raw, self.min_variance)

    def log_prob(self, params: Params, x: torch.Tensor) -> torch.Tensor:
        return gaussian_log_prob(*params, x)

    def rsample(self, params: Params) -> torch.Tensor:
        loc, scale = params
        return loc + scale * torch.randn_like(loc)

    def mean(self, params: Params) -> torch.Tensor:
        return params[0]

    def cdf(self, params: Params, x: torch.Tensor) -> torch.Tensor:
        loc, scale = params
        return 0.5 * (1 + torch.erf((x - loc) / (scale * math.sqrt(2.0))))

    def scale(self, params: Params) -> torch.Tensor:
        return params[1]

    def quadrature(self, params: Params) -> tuple[torch.Tensor, torch.Tensor]:
        loc, scale = params
        nodes = loc[..., None] + scale[..., None] * self.gh_nodes
        return nodes, self.gh_logw.expand_as(nodes)

    def check_values(self, values: np.ndarray) -> None:
        if self.squash is None:
            return
        lo, hi = self.squash
        bad = np.flatnonzero((values < lo) | (values > hi))
        if bad.size:
            raise ValueError(f"the decoder's mean is squashed to [{lo}, {hi}] but {bad.size} observed values lie "
                             f"outside it (e.g. {values[bad[0]]})")


def linear_gaussian_decoder(latent_dim: int, n_features: int, min_variance: float = 1e-4,
                            quadrature_points: int = 8) -> GaussianDecoder:
    """The PPCA-like decoder: x = W z + b + noise with one variance shared by all features."""
    return GaussianDecoder(latent_dim, n_features, hidden=(), variance="isotropic", min_variance=min_variance,
                           quadrature_points=quadrature_points)


class CategoricalDecoder(ObservationModel):
    """Categorical p(x_j | z) over ordered levels lo..hi, with Gumbel-Softmax reparameterised samples.

    A relaxed one-hot y at `temperature` is turned into a value on the level scale, Σ_c level_c y_c,
    which is what the missing model sees.
    """

    family = "categorical"
    integrable = True

    def __init__(self, latent_dim: int, n_features: int, levels: tuple[int, int] = (1, 5),
                 hidden: tuple[int, ...] = (), activation: type[nn.Module] = Tanh, temperature: float = 0.5):
        super().__init__()
        lo, hi = levels
        if hi <= lo:
            raise ValueError(f"levels must satisfy lo < hi, got {levels}")
        self.lo, self.n_levels, self.n_features = lo, hi - lo + 1, n_features
        self.temperature = temperature
        self.trunk, width = _trunk(latent_dim, hidden, activation)
        self.logit_head = nn.Linear(width, n_features * self.n_levels)
        self.register_buffer("support", torch.arange(lo, hi + 1, dtype=torch.float32), persistent=False)

    def forward(self, z: torch.Tensor) -> Params:
        # computed level-major, (..., C, p) in memory, and handed out as a (..., p, C) view: each level's
        # logits lie contiguous, as the missing term's compiled level loop reads them. The head's units stay
        # feature-major (j * C + c; `forward_entries`, checkpoints); permuting a (C p x width) weight is cheap
        weight = self.logit_head.weight.unflatten(0, (self.n_features, self.n_levels)).transpose(0, 1).flatten(0, 1)
        bias = self.logit_head.bias.view(self.n_features, self.n_levels).T.flatten()
        logits = F.linear(self.trunk(z), weight, bias)
        return (logits.unflatten(-1, (self.n_levels, self.n_features)).transpose(-1, -2),)

    def forward_entries(self, z: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> Params:
        # feature j's logits are head units j * C .. j * C + C - 1
        units = cols[:, None] * self.n_levels + torch.arange(self.n_levels, device=cols.device)
        return (linear_at_entries(self.logit_head, self.trunk(z), rows, units),)

    def _index(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.lo).round().long().clamp(0, self.n_levels - 1)

    def log_prob(self, params: Params, x: torch.Tensor) -> torch.Tensor:
        logits = params[0]
        # picking the level before normalising: log_softmax over a short last axis is slow on CPUs
        picked = logits.gather(-1, self._index(x).expand(logits.shape[:-1])[..., None])[..., 0]
        return picked - torch.logsumexp(logits, dim=-1)

    def rsample(self, params: Params) -> torch.Tensor:
        y = F.gumbel_softmax(params[0], tau=self.temperature, dim=-1)
        return y @ self.support

    def sample(self, params: Params) -> torch.Tensor:
        with torch.no_grad():
            probs = F.softmax(params[0], dim=-1)
            draws = torch.multinomial(probs.reshape(-1, self.n_levels), 1).reshape(probs.shape[:-1])
            return self.support[draws]

    def mean(self, params: Params) -> torch.Tensor:
        return F.softmax(params[0], dim=-1) @ self.support

    def cdf(self, params: Params, x: torch.Tensor) -> torch.Tensor:
        probs = F.softmax(params[0], dim=-1)
        return (probs * (self.support <= x[..., None])).sum(-1)

    def quadrature(self, params: Params) -> tuple[torch.Tensor, torch.Tensor]:
        log_pi = F.log_softmax(params[0], dim=-1)
        return self.support.expand_as(log_pi), log_pi

    def check_values(self, values: np.ndarray) -> None:
        bad = np.flatnonzero((values != np.round(values)) | (values < self.lo)
                             | (values > self.lo + self.n_levels - 1))
        if bad.size:
            raise ValueError(f"the categorical decoder takes integer levels {self.lo}..{self.lo + self.n_levels - 1}"
                             f" but {bad.size} observed values are not among them (e.g. {values[bad[0]]})")


class BernoulliDecoder(ObservationModel):
    """Bernoulli p(x_j | z) on {0, 1}; samples are binary-concrete relaxations at `temperature`."""

    family = "bernoulli"
    integrable = True

    def __init__(self, latent_dim: int, n_features: int, hidden: tuple[int, ...] = (128, 128),
                 activation: type[nn.Module] = Tanh, temperature: float = 0.5):
        super().__init__()
        self.temperature = temperature
        self.trunk, width = _trunk(latent_dim, hidden, activation)
        self.logit_head = nn.Linear(width, n_features)
        self.register_buffer("support", torch.tensor([0.0, 1.0]), persistent=False)

    def forward(self, z: torch.Tensor) -> Params:
        return (self.logit_head(self.trunk(z)),)

    def forward_entries(self, z: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> Params:
        return (linear_at_entries(self.logit_head, self.trunk(z), rows, cols[:, None])[..., 0],)

    def log_prob(self, params: Params, x: torch.Tensor) -> torch.Tensor:
        logits = params[0]
        return x * F.logsigmoid(logits) + (1 - x) * F.logsigmoid(-logits)

    def rsample(self, params: Params) -> torch.Tensor:
        u = torch.rand_like(params[0]).clamp(1e-6, 1 - 1e-6)
        return torch.sigmoid((params[0] + torch.log(u) - torch.log1p(-u)) / self.temperature)

    def sample(self, params: Params) -> torch.Tensor:
        with torch.no_grad():
            return torch.bernoulli(torch.sigmoid(params[0]))

    def mean(self, params: Params) -> torch.Tensor:
        return torch.sigmoid(params[0])

    def cdf(self, params: Params, x: torch.Tensor) -> torch.Tensor:
        p_zero = torch.sigmoid(-params[0])
        return torch.where(x < 0, torch.zeros_like(p_zero), torch.where(x < 1, p_zero, torch.ones_like(p_zero)))

    def quadrature(self, params: Params) -> tuple[torch.Tensor, torch.Tensor]:
        logits = params[0]
        log_w = torch.stack([F.logsigmoid(-logits), F.logsigmoid(logits)], dim=-1)
        return self.support.expand_as(log_w), log_w

    def check_values(self, values: np.ndarray) -> None:
        bad = np.flatnonzero((values != 0) & (values != 1))
        if bad.size:
            raise ValueError(f"the Bernoulli decoder takes 0/1 values but {bad.size} observed values are not "
                             f"(e.g. {values[bad[0]]})")


class StudentTDecoder(ObservationModel):
    """Student-t p(x_j | z) with per-row location and scale and a per-feature degrees of freedom (> 1)."""

    family = "student-t"

    def __init__(self, latent_dim: int, n_features: int, hidden: tuple[int, ...] = (128, 128),
                 activation: type[nn.Module] = Tanh, min_scale: float = 1e-2):
        super().__init__()
        self.min_scale = min_scale
        self.trunk, width = _trunk(latent_dim, hidden, activation)
        self.head = nn.Linear(width, 2 * n_features)
        self.raw_df = nn.Parameter(torch.full((n_features,), 2.0))

    def forward(self, z: torch.Tensor) -> Params:
        loc, raw_scale = self.head(self.trunk(z)).chunk(2, dim=-1)
        return self._params(loc, raw_scale, self.raw_df)

    def forward_entries(self, z: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> Params:
        # the head's first p units are the locations, the next p the raw scales
        units = torch.stack([cols, cols + self.raw_df.shape[0]], dim=1)
        loc, raw_scale = linear_at_entries(self.head, self.trunk(z), rows, units).unbind(-1)
        return self._params(loc, raw_scale, take(self.raw_df, cols)[:, None])

    def _params(self, loc: torch.Tensor, raw_scale: torch.Tensor, raw_df: torch.Tensor) -> Params:
        return loc, F.softplus(raw_scale) + self.min_scale, (1.0 + F.softplus(raw_df)).expand_as(loc)

    def _dist(self, params: Params) -> torch.distributions.StudentT:
        loc, scale, df = params
        return torch.distributions.StudentT(df, loc, scale)

    def log_prob(self, params: Params, x: torch.Tensor) -> torch.Tensor:
        return self._dist(params).log_prob(x)

    def rsample(self, params: Params) -> torch.Tensor:
        return self._dist(params).rsample()

    def mean(self, params: Params) -> torch.Tensor:
        return params[0]


class ConvMeanNet(nn.Module):
    """The paper's SVHN decoder body: z -> transposed convolutions -> a square image of mean logits."""

    def __init__(self, latent_dim: int, n_features: int, channels: tuple[int, ...] = (256, 128, 64)):
        super().__init__()
        self.side = int(round(n_features ** 0.5))
        self.start = self.side // 2 ** len(channels)
        if self.side ** 2 != n_features or self.start * 2 ** len(channels) != self.side:
            raise ValueError(f"the conv decoder needs square images with side divisible by "
                             f"{2 ** len(channels)}, got {n_features} features")
        self.channels = channels
        self.project = nn.Linear(latent_dim, channels[0] * self.start ** 2)
        layers: list[nn.Module] = []
        for n_in, n_out in zip(channels, (*channels[1:], 1)):
            layers += [nn.ReLU(), nn.ConvTranspose2d(n_in, n_out, 4, stride=2, padding=1)]
        self.body = nn.Sequential(*layers)

    @property
    def hidden_width(self) -> int:
        """Values of its widest feature map per sample, 16 times the pixels with the paper's channels: it sizes
        an importance pass's blocks (`ObservationModel.hidden_width`)."""
        return max(c * (self.start * 2 ** i) ** 2 for i, c in enumerate(self.channels))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        lead = z.shape[:-1]
        h = self.project(z.reshape(-1, z.shape[-1])).view(-1, self.channels[0], self.start, self.start)
        return self.body(h).reshape(*lead, self.side ** 2)
