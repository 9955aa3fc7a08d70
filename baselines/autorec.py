"""I-AutoRec (Sedhain, Menon, Sanner & Xie, WWW 2015): an autoencoder over each item's ratings by all users.

Item i's ratings form a vector r_i with one entry per user, 0 where the user did not rate it. It is
encoded as h_i = sigmoid(V r_i + c) and decoded as W h_i + b, one output per user, and the fit minimises

    sum_obs (r_ui - w_u·h_i - b_u)^2 + (l2 / 2) (|W|_F^2 + |V|_F^2)

over the observed ratings only, by full-batch L-BFGS, as in the paper (500 hidden units, sigmoid encoder,
identity decoder; the item-based form, which the paper found better than the user-based one). The
encoder reads the sparse item vectors and the decoder is computed at the observed entries only (a
sampled matrix product), so a step costs O(ratings x hidden), never O(users x items x hidden). It runs
on the CPU, as the other rating baselines do.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from mnar_recsys.checks import check_positive_finite, check_positive_integer
from mnar_recsys.checks.ratings import check_fitted, check_on_scale, check_pairs, check_ratings

# the grid AutoRecConfig's default l2 was chosen on, and which `baselines.registry.tune_baseline` searches: the
# paper searched 0.001, 0.01, 0.1, 1, 100 and 1000; on these sparse data sets everything below 10 over-fits, and the
# held-out error moves a lot between decades, so the grid is finer around 100 instead
AUTOREC_GRID: tuple[dict[str, float], ...] = tuple({"l2": l2} for l2 in (1.0, 10.0, 30.0, 50.0, 100.0, 300.0, 1000.0))


@dataclass
class AutoRecConfig:
    """Hyper-parameters of I-AutoRec.

    The default l2 was chosen by a 10% validation split of the Coat *train* ratings
    (``baselines.selection.select_config``), never the MCAR test: over ``AUTOREC_GRID`` the best was 50
    (validation MSE 1.234; 1.279 at 30, 1.302 at 100). On another data set choose again
    (``baselines.registry.tune_baseline``).

    Attributes:
        hidden: hidden units (the paper's 500).
        l2: weight of the L2 penalty on the encoder and decoder weights (see the module docstring).
        n_iters: L-BFGS iterations of the full-batch fit, at most (it stops sooner once the loss stops changing).
        history: L-BFGS memory, in (step, gradient change) pairs of the parameters' size each.
        rating_scale: predictions are clipped to this (low, high); None disables clipping.
        seed: seeds the initialisation.
    """

    hidden: int = 500
    l2: float = 50.0
    n_iters: int = 200
    history: int = 10
    rating_scale: tuple[float, float] | None = (1.0, 5.0)
    seed: int = 0


class AutoRec:
    """I-AutoRec recommender (Recommender protocol)."""

    name = "autorec"

    def __init__(self, config: AutoRecConfig | None = None, **overrides: object) -> None:
        """Build from an ``AutoRecConfig`` or keyword overrides of its fields."""
        base = config or AutoRecConfig()
        self.config = AutoRecConfig(**{**base.__dict__, **overrides})
        self.item_codes: np.ndarray | None = None  # h_i, (items, hidden)
        self.user_weights: np.ndarray | None = None  # w_u, (users, hidden)
        self.user_bias: np.ndarray | None = None  # b_u, (users,)

    def fit(self, train: sp.csr_matrix) -> "AutoRec":
        """Fit to the stored ratings of ``train`` (users x items CSR)."""
        cfg = self.config
        for name in ("hidden", "n_iters", "history"):
            check_positive_integer(f"AutoRecConfig.{name}", getattr(cfg, name))
        check_positive_finite("AutoRecConfig.l2", cfg.l2)
        train = check_ratings(train)
        check_on_scale(train, cfg.rating_scale)
        items = train.T.tocsr()  # one row per item, one column per user
        n_users = train.shape[0]
        users_of_ratings = torch.from_numpy(items.indices).long()
        with warnings.catch_warnings():  # PyTorch flags sparse CSR tensors as beta on every construction
            warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta state")
            ratings = torch.sparse_csr_tensor(torch.from_numpy(items.indptr).long(), users_of_ratings,
                                              torch.from_numpy(items.data).float(), size=items.shape,
                                              check_invariants=True)

        generator = torch.Generator().manual_seed(cfg.seed)

        def uniform(fan_in: int) -> torch.Tensor:  # nn.Linear's init, U(-1/sqrt(fan_in), 1/sqrt(fan_in))
            weights = (2 * torch.rand(n_users, cfg.hidden, generator=generator) - 1) * fan_in ** -0.5
            return weights.requires_grad_()

        encoder, decoder = uniform(n_users), uniform(cfg.hidden)
        code_bias = torch.zeros(cfg.hidden, requires_grad=True)
        # started at the train mean, so that the first steps fit the structure rather than the offset
        user_bias = torch.full((n_users,), float(train.data.mean()), requires_grad=True)
        params = [encoder, code_bias, decoder, user_bias]

        def codes() -> torch.Tensor:
            return torch.sigmoid(ratings @ encoder + code_bias)

        def decoded(item_codes: torch.Tensor) -> torch.Tensor:
            """w_u·h_i at the observed (item, user) entries only, in the ratings' stored order."""
            return torch.sparse.sampled_addmm(ratings, item_codes, decoder.T, beta=0.0).values()

        optimiser = torch.optim.LBFGS(params, lr=1.0, max_iter=cfg.n_iters, history_size=cfg.history,
                                      line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            optimiser.zero_grad()
            residual = decoded(codes()) + user_bias[users_of_ratings] - ratings.values()
            loss = residual.square().sum() + 0.5 * cfg.l2 * (encoder.square().sum() + decoder.square().sum())
            loss.backward()
            return loss

        optimiser.step(closure)
        with torch.no_grad():
            item_codes = codes()
            # The optimum in closed form where it has one, which L-BFGS may stop short of (under a large l2 the
            # float32 loss stops changing first): given the weights, an unpenalised bias is its user's mean
            # residual, and a user without ratings has only the penalty on its decoder row, so zero weights.
            residual_sum = torch.zeros(n_users).index_add_(0, users_of_ratings, ratings.values() - decoded(item_codes))
            counts = torch.bincount(users_of_ratings, minlength=n_users)
            rated = counts > 0
            user_bias[rated] = residual_sum[rated] / counts[rated]
            decoder[~rated] = 0.0
        self.item_codes = item_codes.numpy().astype(np.float64)
        self.user_weights = decoder.detach().numpy().astype(np.float64)
        self.user_bias = user_bias.detach().numpy().astype(np.float64)
        return self

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Predicted ratings for the (users[k], items[k]) pairs, clipped to ``rating_scale``. A user with no
        train rating has zero weights and its bias's start, so it is predicted the train mean; an item with
        none has the code of an empty vector."""
        check_fitted(self, "item_codes")
        u, i = check_pairs(users, items, (len(self.user_weights), len(self.item_codes)))
        pred = np.einsum("kh,kh->k", self.user_weights[u], self.item_codes[i]) + self.user_bias[u]
        if self.config.rating_scale is not None:
            pred = np.clip(pred, *self.config.rating_scale)
        return pred
