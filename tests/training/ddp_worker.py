"""Run by the distributed tests under torchrun (as a script, never imported by pytest).

Trains a small set-encoder not-MIWAE on fixed random ratings and, on rank 0, saves the trained
parameters and history. `--bad-rank R` gives rank R rows of the wrong width, so that one rank fails
before training while its peers are fine; `--on-disk DIR` trains from an on-disk CSR folder.
"""

import argparse
import json

import numpy as np
import scipy.sparse as sp
import torch

from mnar_recsys.data.ondisk import open_csr
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.training import distributed
from mnar_recsys.training.trainer import TrainConfig, fit


def ratings(n_rows: int, n_items: int) -> sp.csr_matrix:
    rng = np.random.default_rng(0)
    mask = rng.random((n_rows, n_items)) < 0.3
    mask[:, 0] = True
    return sp.csr_matrix(np.where(mask, rng.integers(1, 6, (n_rows, n_items)), 0).astype(np.float32))


def train(rows: int, items: int, shards: int | None, out: str | None = None, bad_rank: int | None = None,
          validation_fraction: float = 0.25, device: str = "cpu", on_disk: str | None = None) -> dict:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(ModelConfig(n_features=items, latent_dim=4, embedding_dim=5, code_dim=8))
    data = open_csr(on_disk) if on_disk else ratings(rows, items + (1 if distributed.rank() == bad_rank else 0))
    config = TrainConfig(iterations=6, batch_size=12, n_samples=3, lr=1e-2, seed=3, device=device, progress=False,
                         validation_fraction=validation_fraction, validation_every=2, shards=shards)
    history = fit(model, data, config)
    result = {"state": {k: v.cpu().tolist() for k, v in model.state_dict().items()},
              "validation": history.validation, "best_iteration": history.best_iteration, "bound": history.bound}
    if out and distributed.is_main_process():
        with open(out, "w") as handle:
            json.dump(result, handle)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--items", type=int, default=7)
    parser.add_argument("--shards", type=int, default=None)
    parser.add_argument("--bad-rank", type=int, default=None)
    parser.add_argument("--validation-fraction", type=float, default=0.25)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--on-disk", help="train from this on-disk CSR folder instead")
    parser.add_argument("--out")
    args = parser.parse_args()
    distributed.initialise("cpu", args.backend)
    try:
        train(args.rows, args.items, args.shards, args.out, args.bad_rank, args.validation_fraction,
              on_disk=args.on_disk)
    finally:
        distributed.shutdown()
