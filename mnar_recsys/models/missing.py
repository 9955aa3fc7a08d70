"""Missing models p(s | x): Bernoulli masks whose logits are a function of the completed row.

`logits(x)` gives logit Pr(s_j = 1 | x) for completed rows x of shape (..., p); `bernoulli_log_prob`
scores a mask (1 = observed) with them.
Per-feature models (`per_feature = True`) compute logit_j from x_j alone through
`feature_logits(x, features)`, elementwise with `features` giving each value's feature index; that is
what lets the model integrate x_m out feature by feature. Their `logit_form` names the logit's shape, which
picks the integrated factor's kernel (`models.integrated`): 'affine' (`feature_affine`), 'piecewise-linear'
(`LevelwiseLogistic`), or None, integrated on the decoder's own quadrature nodes (`FixedFunction`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mnar_recsys.models.activations import Tanh
from mnar_recsys.models.encoders import mlp
from mnar_recsys.models.gather import take


def _logit(p: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """logit(p) on the device of `like` (the parameter it initialises, which may already sit on a GPU)."""
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-4, 1 - 1e-4)
    return torch.tensor(np.log(p / (1 - p)), dtype=torch.float32, device=like.device)


def bernoulli_log_prob(logits: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Σ_j log Bern(s_j | sigmoid(logit_j)) over the features' axis `dim` (the last by default)."""
    return -F.binary_cross_entropy_with_logits(logits, mask.expand_as(logits), reduction="none").sum(dim)


class MissingModel(nn.Module):
    """p(s | x) as the logit of Pr(s_j = 1 | x) per feature: the bound scores masks as Bernoulli logits, so
    another link (a probit, say) gives its logit.

    A model whose logit_j depends on x_j alone sets `per_feature` and implements `feature_logits(x, features)`
    (elementwise, `features` giving each value's column); x_m can then be integrated out over the decoder's
    quadrature nodes, and its `logit_form` picks a faster kernel where one is registered (`models.integrated`):
    'affine' with `feature_affine`, for one. A model that couples features overrides `logits(x)` on completed
    rows, and x_m is sampled. `initialise` (optional) starts the parameters from the observed fractions.
    """

    per_feature: bool = False
    #: the shape of a per-feature logit, which keys the integrated factor's kernel: 'affine' when logit_j is
    #: affine in x_j and `feature_affine` gives it, 'piecewise-linear' for `LevelwiseLogistic`'s, None for others
    logit_form: str | None = None
    #: True for the MCAR model, whose factor is dropped from the bound (the MIWAE)
    is_mcar: bool = False

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of Pr(s_j = 1 | x) for completed rows x of shape (..., p)."""
        features = torch.arange(x.shape[-1], device=x.device)
        return self.feature_logits(x, features)

    def feature_logits(self, x: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        slope, intercept = self.feature_affine(features)
        return slope * x + intercept

    def feature_affine(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(slope, intercept) with logit_j = slope_j x_j + intercept_j, for the given feature indices."""
        raise NotImplementedError(f"{type(self).__name__} has no per-feature affine logit")

    def initialise(self, observed_fraction: np.ndarray, center: float) -> None:
        """Start the biases at each feature's observed fraction (at values near `center`)."""


class MCAR(MissingModel):
    """p(s | x) = p(s): the factor does not involve θ, so it is dropped and the bound is the MIWAE's."""

    is_mcar = True

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("the MCAR model has no logits: the MIWAE ignores the mask")


class SelfMasking(MissingModel):
    """logit_j = w_j (x_j - b_j): one logistic regression per feature on its own value.

    Written with a threshold b_j and started from Glorot-uniform w and b (random signs), as the paper's
    code does. Written w_j x_j + c_j and started at w = 0, it trained into a worse optimum on Concrete
    with 8 columns (RMSE 2.03 against the paper's 1.26, with the wrong sign for cement, slag and fly ash;
    1.28 in this form), though a better one on Red and Yeast (README, UCI table).
    """

    per_feature = True
    logit_form = "affine"

    def __init__(self, n_features: int):
        super().__init__()
        # TensorFlow's default for a (1, 1, p) variable: fan-in 1, fan-out p
        limit = math.sqrt(6 / (1 + n_features))
        self.weight = nn.Parameter(torch.empty(n_features).uniform_(-limit, limit))
        self.offset = nn.Parameter(torch.empty(n_features).uniform_(-limit, limit))

    def feature_affine(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        slope = take(self.weight, features)
        return slope, -slope * take(self.offset, features)


class SelfMaskingKnownSign(MissingModel):
    """logit_j = sign · softplus(w_j) · (x_j - b_j): self-masking whose direction is known.

    sign = -1 when large values go missing (the UCI protocol), +1 when large values are observed
    (users rate what they like).
    """

    per_feature = True
    logit_form = "affine"

    def __init__(self, n_features: int, sign: int):
        super().__init__()
        if sign not in (-1, 1):
            raise ValueError(f"sign must be -1 or +1, got {sign}")
        self.sign = sign
        self.raw_weight = nn.Parameter(torch.zeros(n_features))
        self.offset = nn.Parameter(torch.zeros(n_features))

    def feature_affine(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        slope = self.sign * F.softplus(take(self.raw_weight, features))
        return slope, -slope * take(self.offset, features)

    def initialise(self, observed_fraction: np.ndarray, center: float) -> None:
        with torch.no_grad():
            slope = self.sign * F.softplus(self.raw_weight)
            self.offset.copy_(center - _logit(observed_fraction, self.offset) / slope)


class ItemwiseLogistic(MissingModel):
    """logit_j = w x_j + b_j with one weight shared by all items and a bias per item (recommenders).

    With `sign` set, w = sign · softplus(v) keeps the direction of self-selection fixed.
    """

    per_feature = True
    logit_form = "affine"

    def __init__(self, n_features: int, sign: int | None = 1, initial_weight: float = 0.5):
        super().__init__()
        if sign not in (-1, 1, None):
            raise ValueError(f"sign must be -1, +1 or None, got {sign}")
        if sign is not None and initial_weight == 0:  # softplus(v) = 0 needs v = -inf, where no gradient flows
            raise ValueError("a sign-constrained weight cannot start at 0: give initial_weight a magnitude")
        self.sign = sign
        start = initial_weight if sign is None else float(np.log(np.expm1(abs(initial_weight))))
        self.raw_weight = nn.Parameter(torch.tensor(start))
        self.bias = nn.Parameter(torch.zeros(n_features))

    @property
    def weight(self) -> torch.Tensor:
        return self.raw_weight if self.sign is None else self.sign * F.softplus(self.raw_weight)

    def feature_affine(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.weight, take(self.bias, features)

    def initialise(self, observed_fraction: np.ndarray, center: float) -> None:
        with torch.no_grad():
            self.bias.copy_(_logit(observed_fraction, self.bias) - self.weight * center)


class LevelwiseLogistic(MissingModel):
    """logit_j = g(x_j) + b_j with a free logit g(level) per rating level and a bias per item.

    Self-selection need not be linear in the rating (Marlin & Zemel's CPT-v: users mostly rate what they
    love, and hated items more than middling ones), which one shared weight cannot express. Between
    levels g is interpolated linearly, so continuous decoders integrate it through their quadrature
    nodes; beyond the end levels it is constant, as a value past the scale stands for the end rating.
    A constant shift of g is absorbed by the biases, so g is centred (mean 0 over the levels).
    """

    per_feature = True
    logit_form = "piecewise-linear"

    def __init__(self, n_features: int, levels: tuple[int, int] = (1, 5), initial_weight: float = 0.5):
        super().__init__()
        lo, hi = levels
        if hi <= lo:
            raise ValueError(f"levels must satisfy lo < hi, got {levels}")
        self.lo, self.n_levels = float(lo), hi - lo + 1
        # starts linear with the item-wise model's initial slope: higher ratings more often observed
        steps = torch.arange(self.n_levels, dtype=torch.float32)
        self.raw_level_logits = nn.Parameter(initial_weight * (steps - steps.mean()))
        self.bias = nn.Parameter(torch.zeros(n_features))

    def level_logits(self) -> torch.Tensor:
        """g at the levels lo..hi, centred."""
        return self.raw_level_logits - self.raw_level_logits.mean()

    def value_logits(self, x: torch.Tensor) -> torch.Tensor:
        """g(x): linear interpolation between the levels, constant beyond the end levels."""
        g = self.level_logits()
        position = (x - self.lo).clamp(0, self.n_levels - 1)
        left = position.detach().floor().clamp(max=self.n_levels - 2).long()
        fraction = position - left
        return torch.lerp(take(g, left), take(g, left + 1), fraction.to(g.dtype))  # lerp takes one dtype

    def feature_logits(self, x: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.value_logits(x) + take(self.bias, features)

    def initialise(self, observed_fraction: np.ndarray, center: float) -> None:
        with torch.no_grad():
            at_center = self.value_logits(torch.tensor(center, device=self.bias.device))
            self.bias.copy_(_logit(observed_fraction, self.bias) - at_center)


class RowOffset(nn.Module):
    """A per-row shift a(z_i) = w · z_i of every selection logit, logit_ij = f(x_ij) + b_j + a(z_i).

    Users differ in how much they rate; a missing model of the value and the item alone reads a light
    user's many unrated items as low ratings. The shift is a function of the latent code (the set
    encoder's sum pooling sees how many items a user rated), so p(s | x, z) stays a generative model.
    It starts at zero (no shift).
    """

    def __init__(self, latent_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(latent_dim))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """a(z) for z of shape (B, K, d): (B, K)."""
        return z @ self.weight


class Agnostic(MissingModel):
    """logits = W x + b: one dense linear layer of the whole completed row."""

    def __init__(self, n_features: int):
        super().__init__()
        self.linear = nn.Linear(n_features, n_features)
        with torch.no_grad():
            self.linear.weight.mul_(0.1)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def initialise(self, observed_fraction: np.ndarray, center: float) -> None:
        with torch.no_grad():
            self.linear.bias.copy_(_logit(observed_fraction, self.linear.bias) - self.linear.weight.sum(1) * center)


class Nonlinear(MissingModel):
    """logits = MLP(x): a small tanh network of the whole completed row."""

    def __init__(self, n_features: int, hidden: tuple[int, ...] = (64,)):
        super().__init__()
        self.net = mlp([n_features, *hidden, n_features], Tanh)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def initialise(self, observed_fraction: np.ndarray, center: float) -> None:
        with torch.no_grad():
            last = self.net[-1]
            # what the network adds to the last bias at a row of centre values, which the bias then offsets
            row = torch.full((1, last.out_features), center, dtype=last.bias.dtype, device=last.bias.device)
            at_center = self.net(row)[0] - last.bias
            last.bias.copy_(_logit(observed_fraction, last.bias) - at_center)


class FixedLogistic(MissingModel):
    """A known, fixed missing process logit_j = weight · (x_j - offset), e.g. SVHN clipping (-50, 0.75)."""

    per_feature = True
    logit_form = "affine"

    def __init__(self, weight: float = -50.0, offset: float = 0.75):
        super().__init__()
        self.weight, self.offset = float(weight), float(offset)

    def feature_affine(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        slope = torch.tensor(self.weight, device=features.device)
        return slope, -slope * self.offset


class FixedFunction(MissingModel):
    """A user-supplied elementwise logit function of x_j, used as is (not saved in checkpoints)."""

    per_feature = True

    def __init__(self, function: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        if isinstance(function, nn.Module):
            raise TypeError("FixedFunction takes a plain function: a module would be registered, and its "
                            "parameters trained with the model's")
        self.function = function

    def feature_logits(self, x: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.function(x)
