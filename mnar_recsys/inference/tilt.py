"""One missing entry's posterior given a sample z_k and its mask bit,
p(x_j | z_k, s_j) ∝ p(x_j | z_k) Pr(s_j | x_j, z_k).

With x_m integrated out of a per-feature missing model, the importance weights take Pr(s_j | z_k) exactly and
each imputation is taken under this tilted decoder: its mean on the decoder's quadrature nodes (the nodes the
bound integrates on), its CDF for the conditional median, and draws for multiple imputation. Other models
(x_m sampled, or a missing model that couples the features) use the decoder untilted here.

Discrete decoders sum their levels exactly. A Gaussian decoder's CDF and draws integrate on the probability
scale u = Φ((x - c) / scale), with Gauss-Legendre panels graded geometrically towards the point where the
selection logit changes sign (a steep missing process is a near step in u there), c the tilt's mode for an affine
logit (the tilted density is then log-concave and no wider than the decoder's Gaussian) and the decoder's mean
otherwise, unless the mode lies more than 3 scales out. Any other integrable decoder is tilted on its own
quadrature nodes, a discrete approximation. docs/inference.md has the cases that chose this scheme.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from mnar_recsys.models.decoders import Params
from mnar_recsys.models.notmiwae import NotMIWAE

_LEGENDRE = list(zip(*(a.tolist() for a in np.polynomial.legendre.leggauss(8))))  # (node, weight), 8 a panel
_PANEL_RATIO, _PANELS_PER_SIDE = 1 / 8, 8  # each panel an eighth of the one before, towards the split
_U_EDGE = 1e-9  # the probability scale stops this far from 0 and 1, where erfinv is infinite
_BISECTIONS = 50  # halvings of an interval of u in float64: beyond its resolution
_MODE_BISECTIONS = 40  # halvings of the interval that holds an affine tilt's mode
# other logits: the mode is sought within _MODE_RANGE scales of the decoder's mean, the slope's sign read from
# x ± _MODE_STEP scales, in _SEARCH_BISECTIONS halvings (to 1e-4 scales: the scale needs no finer centre, and
# each halving evaluates the missing model twice), and the scale moves to it only from _RECENTRE scales out,
# where the decoder-centred scale, which ends 6 scales out, would lose mass (a level-wise logit can make two
# modes near the mean)
_MODE_RANGE, _MODE_STEP, _SEARCH_BISECTIONS, _RECENTRE = 40.0, 1e-3, 20, 3.0


def selection_logits(model: NotMIWAE, x: torch.Tensor, cols: torch.Tensor,
                     offset: torch.Tensor | None) -> torch.Tensor:
    """The per-feature selection logits at values x (B, K, T, ...) of target columns cols (B, T), with
    offset (B, K) the row offsets a(z_k) (None without a row offset)."""
    nodes = (None,) * (x.dim() - 3)  # x's axes past (B, K, T), e.g. quadrature nodes
    logits = model.missing_model.feature_logits(x, cols[:, None, :][(..., *nodes)])
    return logits if offset is None else logits + offset[(..., None, *nodes)]


def tilt_applies(model: NotMIWAE) -> bool:
    """Whether imputations use the tilted decoder (x_m integrated out of a per-feature missing model)."""
    return model.missing_factor == "integrated" and model.missing_model.per_feature and not model.missing_model.is_mcar


def conditional_mean(model: NotMIWAE, params: Params, cols: torch.Tensor, observed: torch.Tensor,
                     offset: torch.Tensor | None) -> torch.Tensor:
    """E[x_j | z_k, s_j] for target entries, (B, K, T): the tilted decoder's mean on its quadrature nodes, or
    the decoder mean where the tilt does not apply."""
    if not tilt_applies(model):
        return model.decoder.mean(params)
    nodes, log_w = model.decoder.quadrature(params)
    sign = (2 * observed - 1)[:, None, :, None]
    log_tilt = log_w + F.logsigmoid(sign * selection_logits(model, nodes, cols, offset))
    # the softmax over the nodes written out: on a CPU, F.softmax along an axis of 8 took 5 times as long
    tilt = (log_tilt - log_tilt.amax(-1, keepdim=True)).exp_()
    return (tilt * nodes).sum(-1) / tilt.sum(-1)


class Posterior:
    """p(x_j | z_k, s_j) of the target entries: params (B, K, T, ...), cols and observed (B, T), offset (B, K)
    or None. `cdf(x)` at x broadcasting against (B, K, T); `sample()` one draw per entry."""

    def __init__(self, model: NotMIWAE, params: Params, cols: torch.Tensor, observed: torch.Tensor,
                 offset: torch.Tensor | None):
        self.model, self.decoder, self.params, self.dtype = model, model.decoder, params, params[0].dtype
        self.cols, self.offset = cols, offset
        self.tilted = tilt_applies(model)
        self.sign = (2 * observed - 1)[:, None, :]
        # a discrete decoder's nodes are its levels, exactly; other continuous decoders than the Gaussian are
        # tilted on their quadrature nodes
        self.on_nodes = self.decoder.family != "gaussian"
        if not self.tilted:
            return
        if self.on_nodes:
            nodes, log_w = self.decoder.quadrature(params)
            self.nodes = nodes
            mass = log_w.exp() * torch.sigmoid(self._signed_logits(nodes, nodes=True))
            self.node_probs = mass / mass.sum(-1, keepdim=True)
            return
        # float64: the split and the panels resolve u near 0 and 1, beyond float32's spacing there
        loc, scale = params[0].double(), self.decoder.scale(params).double()
        self.loc, self.scale = loc, scale
        # an affine logit's tilt is log-concave: its scale is centred at the one mode. Any other keeps the
        # decoder's, on which the integrand is Pr(s | x) itself, bounded whatever the tilt's shape (a level-wise
        # logit that is not monotone can make two modes, and a scale centred at one resolves the other badly),
        # unless the mode lies far out
        if model.missing_model.logit_form == "affine":
            self.centre = self._affine_mode()
        else:
            mode = self._searched_mode()
            self.centre = torch.where((mode - loc).abs() > _RECENTRE * scale, mode, loc)
        # log N(x; loc) - log N(x; centre) = shift (x - centre) + a constant; the integrand is divided by its
        # value at a moved centre, and is Pr(s | x) itself on the decoder's scale (a sigmoid alone, the cheaper
        # path the median's bisection takes, where no entry's scale has moved)
        moved = self.centre != loc
        self.shift = None
        if moved.any():
            self.shift = (loc - self.centre) / scale ** 2
            self.log_peak = torch.where(moved, F.logsigmoid(self._signed_logits(self.centre).double()), 0.0)
        lo, hi = torch.full_like(loc, _U_EDGE), torch.full_like(loc, 1 - _U_EDGE)
        split = self._logit_sign_change(lo, hi)
        # panel edges from lo up to the split and from the split up to hi, each side graded towards the split
        steps = _PANEL_RATIO ** torch.arange(_PANELS_PER_SIDE, dtype=loc.dtype, device=loc.device)
        below = split[..., None] - (split - lo)[..., None] * steps
        above = split[..., None] + (hi - split)[..., None] * steps.flip(0)
        self.edges = torch.cat([below, split[..., None], above], dim=-1)  # (B, K, T, 2 * panels + 1)
        panels = [self._integral(a, b) for a, b in zip(self.edges[..., :-1].unbind(-1), self.edges[..., 1:].unbind(-1))]
        self.cumulative = torch.cumsum(torch.stack([torch.zeros_like(lo), *panels], dim=-1), dim=-1)
        self.total = self.cumulative[..., -1]

    def _signed_logits(self, x: torch.Tensor, nodes: bool = False) -> torch.Tensor:
        """The logits of Pr(s_j | x_j, z_k) at values x (B, K, T), or (B, K, T, H) with nodes."""
        sign = self.sign[..., None] if nodes else self.sign
        # the missing model computes in its own precision; x's float64 matters only for u near 0 and 1
        return sign * selection_logits(self.model, x.to(self.dtype), self.cols, self.offset)

    def _affine_mode(self) -> torch.Tensor:
        """The mode of N(loc, scale²) tilted by σ(a x + b): where the log density's slope
        -(x - loc) / scale² + a σ(-(a x + b)), falling in x, is 0, which lies between loc and loc + a scale²."""
        intercept = self._signed_logits(torch.zeros_like(self.loc)).double()
        slope = self._signed_logits(torch.ones_like(self.loc)).double() - intercept
        ends = (self.loc, self.loc + slope * self.scale ** 2)
        lo, hi = torch.minimum(*ends), torch.maximum(*ends)
        for _ in range(_MODE_BISECTIONS):
            mid = 0.5 * (lo + hi)
            rising = slope * torch.sigmoid(-(slope * mid + intercept)) > (mid - self.loc) / self.scale ** 2
            lo, hi = torch.where(rising, mid, lo), torch.where(rising, hi, mid)
        return 0.5 * (lo + hi)

    def _searched_mode(self) -> torch.Tensor:
        """A mode of the tilted density for any logit, by bisection on the sign of its slope."""
        def log_tilted(x: torch.Tensor) -> torch.Tensor:
            return -0.5 * ((x - self.loc) / self.scale) ** 2 + F.logsigmoid(self._signed_logits(x).double())

        lo, hi = self.loc - _MODE_RANGE * self.scale, self.loc + _MODE_RANGE * self.scale
        step = _MODE_STEP * self.scale
        for _ in range(_SEARCH_BISECTIONS):
            mid = 0.5 * (lo + hi)
            rising = log_tilted(mid + step) > log_tilted(mid - step)
            lo, hi = torch.where(rising, mid, lo), torch.where(rising, hi, mid)
        return 0.5 * (lo + hi)

    def _density(self, u: torch.Tensor) -> torch.Tensor:
        """The integrand at probability u: the tilted density over the scale's Gaussian, Pr(s | x) on the decoder's
        own scale, and on a scale centred at the tilt's mode that ratio divided by its value there."""
        x = self._value(u)
        logits = self._signed_logits(x)  # the integrand, at most 1 near its mode, in the logits' precision
        if self.shift is None:
            return torch.sigmoid(logits).to(x.dtype)
        exponent = (self.shift * (x - self.centre) - self.log_peak).to(self.dtype)
        return (exponent + F.logsigmoid(logits)).exp().to(x.dtype)

    def _value(self, u: torch.Tensor) -> torch.Tensor:
        return self.centre + self.scale * math.sqrt(2.0) * torch.erfinv(2 * u - 1)

    def _probability(self, x: torch.Tensor) -> torch.Tensor:
        """x on the probability scale."""
        return 0.5 * (1 + torch.erf((x - self.centre) / (self.scale * math.sqrt(2.0))))

    def _logit_sign_change(self, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """Where on the probability scale the tilt crosses 1/2 (the middle where it does not cross)."""
        def up(u: torch.Tensor) -> torch.Tensor:
            return self._signed_logits(self._value(u)) > 0

        at_lo = up(lo)
        crosses = at_lo != up(hi)
        for _ in range(_BISECTIONS):
            mid = 0.5 * (lo + hi)
            same = up(mid) == at_lo
            lo, hi = torch.where(same, mid, lo), torch.where(same, hi, mid)
        return torch.where(crosses, 0.5 * (lo + hi), torch.full_like(lo, 0.5))

    def _integral(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """∫_a^b of the integrand du by Gauss-Legendre, elementwise over (B, K, T)."""
        total = torch.zeros_like(a)
        for node, weight in _LEGENDRE:
            total += weight * self._density(a + (b - a) * (1 + node) / 2)
        return total * (b - a) / 2

    def _panel_start(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The lower edge of panel `index` and the mass below it."""
        index = index[..., None]
        return self.edges.gather(-1, index)[..., 0], self.cumulative.gather(-1, index)[..., 0]

    def _mass_below(self, u: torch.Tensor) -> torch.Tensor:
        """The tilted mass below probability u, normalised: the whole panels below u and u's part of its own."""
        index = (u[..., None] >= self.edges[..., 1:-1]).sum(-1)
        start, before = self._panel_start(index)
        return (before + self._integral(start, u)) / self.total

    def centres(self) -> torch.Tensor:
        """Each entry's centre, (B, K, T): that of a tilted Gaussian's probability scale (its mode, or the
        decoder mean where the scale stays there), else the decoder mean."""
        if self.tilted and not self.on_nodes:
            return self.centre.to(self.dtype)
        return self.decoder.mean(self.params)

    def bracket(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per entry (B, K, T), an interval holding all of its posterior's mass that matters for a median: the
        nodes' range where the tilt lies on nodes, else the centre ± 8 decoder scales (a tilted component is no
        wider than its decoder)."""
        if self.tilted and self.on_nodes:
            return self.nodes.amin(-1), self.nodes.amax(-1)
        centres, spread = self.centres(), 8 * self.decoder.scale(self.params)
        return centres - spread, centres + spread

    def cdf(self, x: torch.Tensor) -> torch.Tensor:
        """The CDF of each entry's posterior at x, (B, K, T)."""
        if not self.tilted:
            return self.decoder.cdf(self.params, x)
        if self.on_nodes:
            return (self.node_probs * (self.nodes <= x[..., None])).sum(-1)
        return self._mass_below(self._probability(x.double()).clamp(_U_EDGE, 1 - _U_EDGE)).to(x.dtype)

    def sample(self) -> torch.Tensor:
        """One draw per entry, (B, K, T): by inverting the tilted CDF (exact for discrete decoders)."""
        if not self.tilted:
            return self.decoder.sample(self.params)
        if self.on_nodes:
            flat = self.node_probs.reshape(-1, self.node_probs.shape[-1])
            picks = torch.multinomial(flat, 1).reshape(self.node_probs.shape[:-1])
            return self.nodes.gather(-1, picks[..., None])[..., 0]
        target = torch.rand_like(self.loc) * self.total
        index = (target[..., None] >= self.cumulative[..., 1:-1]).sum(-1)  # the panel holding the target mass
        lo, before = self._panel_start(index)
        hi = self.edges.gather(-1, index[..., None] + 1)[..., 0]
        start = lo
        for _ in range(_BISECTIONS):
            mid = 0.5 * (lo + hi)
            below = before + self._integral(start, mid) < target
            lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
        return self._value(0.5 * (lo + hi)).to(self.dtype)


def mixture_median(model: NotMIWAE, alpha: torch.Tensor, params: Params, cols: torch.Tensor,
                   observed: torch.Tensor, offset: torch.Tensor | None, iterations: int = 40) -> torch.Tensor:
    """Solve Σ_k α_k F(x | z_k, s) = 0.5 for each target: alpha (B, K), params (B, K, T, ...), offset (B, K)
    or None -> (B, T)."""
    decoder = model.decoder
    posterior = Posterior(model, params, cols, observed, offset)

    def mixture_cdf(x: torch.Tensor) -> torch.Tensor:
        return (alpha[:, :, None] * posterior.cdf(x[:, None, :])).sum(1)

    support = getattr(decoder, "support", None)
    if support is not None:
        cdf = torch.stack([mixture_cdf(torch.full(cols.shape, float(level), device=cols.device))
                           for level in support], dim=-1)
        return support[(cdf < 0.5 - 1e-6).sum(-1).clamp(max=len(support) - 1)]
    # bracket: the union of the components' brackets, over those with weight
    lo, hi = (end.masked_fill(alpha[:, :, None] <= 0, float("nan")) for end in posterior.bracket())
    lo = torch.nan_to_num(lo, nan=float("inf")).amin(1)
    hi = torch.nan_to_num(hi, nan=float("-inf")).amax(1)
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        below = mixture_cdf(mid) < 0.5
        lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
    return 0.5 * (lo + hi)
