"""Encoders q(z | x_o): each maps a `RowBatch` to the mean and log-variance of a Gaussian.

Every encoder sees the observed entries only: the MLP through zero-imputed rows, the set encoder
through a sum over the observed (item, value) pairs, the conv encoder through zero-imputed images.
"""

from __future__ import annotations

import torch
from torch import nn

from mnar_recsys.data.rows import RowBatch
from mnar_recsys.models.activations import Tanh
from mnar_recsys.models.gather import sum_by_row, take

# Keep q's variance in a range where exp() neither underflows nor explodes early in training.
LOGVAR_MIN, LOGVAR_MAX = -12.0, 8.0


def mlp(sizes: list[int], activation: type[nn.Module]) -> nn.Sequential:
    """Dense layers with `activation` between them (none after the last)."""
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


class GaussianHead(nn.Module):
    """Linear map to (mean, clamped log-variance) of q(z|x_o)."""

    def __init__(self, n_in: int, latent_dim: int):
        super().__init__()
        self.linear = nn.Linear(n_in, 2 * latent_dim)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, logvar = self.linear(h).chunk(2, dim=-1)
        return mean, logvar.clamp(LOGVAR_MIN, LOGVAR_MAX)


class MLPEncoder(nn.Module):
    """The paper's UCI encoder: zero-imputed row through dense tanh layers."""

    def __init__(self, n_features: int, latent_dim: int, hidden: tuple[int, ...] = (128, 128),
                 activation: type[nn.Module] = Tanh):
        super().__init__()
        self.body = nn.Sequential(mlp([n_features, *hidden], activation), activation()) if hidden else nn.Identity()
        self.head = GaussianHead(hidden[-1] if hidden else n_features, latent_dim)

    def forward(self, batch: RowBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head(self.body(batch.values))


class SetEncoder(nn.Module):
    """Permutation-invariant PointNet / partial-VAE encoder over the observed (item, value) pairs.

    h_ij = relu(W [e_j, x_ij] + c) summed over observed j, then a linear head. W [e_j, x] splits into
    W_e e_j + w_x x, so W_e e_j is computed once per item and gathered per observed entry: the cost is
    O(items * C + nnz * C) and no (batch x items x embedding) tensor is ever formed.
    """

    def __init__(self, n_features: int, latent_dim: int, embedding_dim: int = 20, code_dim: int = 50,
                 activation: type[nn.Module] = nn.ReLU):
        super().__init__()
        self.embedding = nn.Parameter(torch.randn(n_features, embedding_dim) * 0.1)
        self.shared = nn.Linear(embedding_dim + 1, code_dim)
        self.activation = activation()
        self.head = GaussianHead(code_dim, latent_dim)

    def forward(self, batch: RowBatch) -> tuple[torch.Tensor, torch.Tensor]:
        weight_e, weight_x = self.shared.weight[:, :-1], self.shared.weight[:, -1]
        item_code = self.embedding @ weight_e.T + self.shared.bias
        per_entry = self.activation(take(item_code, batch.obs_col) + batch.obs_value[:, None] * weight_x)
        code = sum_by_row(per_entry, batch.obs_row, batch.n_rows)
        return self.head(code)


class ConvEncoder(nn.Module):
    """The paper's SVHN encoder: zero-imputed square gray images through strided convolutions."""

    def __init__(self, n_features: int, latent_dim: int, channels: tuple[int, ...] = (64, 128, 256)):
        super().__init__()
        self.side = int(round(n_features ** 0.5))
        if self.side ** 2 != n_features:
            raise ValueError(f"the conv encoder needs square images, got {n_features} features")
        layers: list[nn.Module] = []
        n_in = 1
        for n_out in channels:
            layers += [nn.Conv2d(n_in, n_out, 4, stride=2, padding=1), nn.ReLU()]
            n_in = n_out
        self.body = nn.Sequential(*layers, nn.Flatten())
        reduced = self.side // 2 ** len(channels)
        self.head = GaussianHead(n_in * reduced * reduced, latent_dim)

    def forward(self, batch: RowBatch) -> tuple[torch.Tensor, torch.Tensor]:
        images = batch.values.view(-1, 1, self.side, self.side)
        return self.head(self.body(images))
