"""MF-DR with its imputation model fixed at the MF-IPS fit, against Wang et al.'s joint learning (DR-JL)
with the imputed error in the pseudo-label form (r̂ - r̃)^2 that ``baselines.dr`` uses.

DR-JL refits the imputation model r̃ so that the imputed error (r̂ - r̃)^2 matches the true one (r̂ - r)^2 on
the observed ratings, sum_obs ((r̂ - r̃)^2 - (r̂ - r)^2)^2 / p plus MF's penalty, alternating with the
prediction model's fit to the DR loss. Here each imputation step runs --lbfgs-iters L-BFGS iterations from
r̃'s current parameters and then moves them --damping of the way there (1: the step's result), and each
prediction step is `DoublyRobustMF.fit_prediction`. Prints the MCAR MSE of r̂ and of r̃ every few rounds,
on the main simulator (seed 0's MCAR split) and, with --coat-dir, on Coat. After a few rounds the numbers
depend on the BLAS threads in the third decimal (the log behind the README: default threads).

    python bench/dr_joint_learning.py [--rounds 30] [--damping 1,0.3] [--coat-dir ../shared/data/coat]
"""

from __future__ import annotations

import argparse

import numpy as np
import scipy.sparse as sp
from scipy.optimize import minimize

from baselines.dr import DoublyRobustMF
from baselines.mf import MatrixFactorization
from mnar_recsys.checks.ratings import check_ratings
from mnar_recsys.data import load_coat
from mnar_recsys.evaluation.metrics import mse
from mnar_recsys.evaluation.protocol import MCARSplit, mcar_split
from mnar_recsys.pipelines.ratings import RatingsRun, load_data

PARAMETERS = ("user_factors", "item_factors", "user_bias", "item_bias")


def joint_imputation_step(imputation: MatrixFactorization, train: sp.csr_matrix, predicted: np.ndarray,
                          weight: np.ndarray, max_iter: int, damping: float) -> None:
    """One DR-JL imputation step on r̃'s factors and biases, in place (the global mean stays)."""
    rows = np.repeat(np.arange(train.shape[0]), np.diff(train.indptr))
    counts = (np.diff(train.indptr)[:, None], np.bincount(train.indices, minlength=train.shape[1])[:, None],
              np.diff(train.indptr), np.bincount(train.indices, minlength=train.shape[1]))
    shapes = [getattr(imputation, name).shape for name in PARAMETERS]
    split = np.cumsum([int(np.prod(shape)) for shape in shapes])[:-1]
    true_error = (predicted - train.data) ** 2
    l2 = imputation.config.l2

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        params = [part.reshape(shape) for part, shape in zip(np.split(theta, split), shapes)]
        for name, value in zip(PARAMETERS, params):
            setattr(imputation, name, value)
        gap = predicted - imputation.predict_unclipped(rows, train.indices)
        mismatch = gap ** 2 - true_error
        slope = sp.csr_matrix((-4.0 * weight * mismatch * gap, train.indices, train.indptr), shape=train.shape)
        grads = [slope @ params[1], slope.T @ params[0], np.asarray(slope.sum(1)).ravel(),
                 np.asarray(slope.sum(0)).ravel()]
        loss = float((weight * mismatch ** 2).sum())
        for i, (value, count) in enumerate(zip(params, counts)):
            loss += l2 * float((count * value ** 2).sum())
            grads[i] = grads[i] + 2 * l2 * count * value
        return loss, np.concatenate([g.ravel() for g in grads])

    start = np.concatenate([getattr(imputation, name).ravel() for name in PARAMETERS])
    theta = minimize(objective, start, jac=True, method="L-BFGS-B", options={"maxiter": max_iter}).x
    theta = (1 - damping) * start + damping * theta
    for name, part, shape in zip(PARAMETERS, np.split(theta, split), shapes):
        setattr(imputation, name, part.reshape(shape))


def trace(split: MCARSplit, rounds: int, damping: float, lbfgs_iters: int, every: int) -> list[str]:
    model = DoublyRobustMF("naive-bayes", seed=split.seed).fit(split.train, mcar_sample=split.mcar_sample)
    train = check_ratings(split.train)
    inverse = 1.0 / model.train_propensities
    cell_weight = inverse * (train.shape[0] * train.shape[1] / inverse.sum())
    imputation = model.imputation

    def scores(step: int) -> str:
        return (f"{step}: {mse(split.ratings, model.predict(split.users, split.items)):.4f} "
                f"(r̃ {mse(split.ratings, imputation.predict(split.users, split.items)):.4f})")

    lines = [scores(0)]
    rows = np.repeat(np.arange(train.shape[0]), np.diff(train.indptr))
    for step in range(1, rounds + 1):
        joint_imputation_step(imputation, train, model.predict_unclipped(rows, train.indices), inverse / inverse.mean(),
                              lbfgs_iters, damping)
        model.fit_prediction(train, imputation, cell_weight)
        if step % every == 0:
            lines.append(scores(step))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--damping", default="1,0.3", help="comma-separated fractions of each imputation step taken")
    parser.add_argument("--lbfgs-iters", type=int, default=20)
    parser.add_argument("--every", type=int, default=5, help="print every this many rounds")
    parser.add_argument("--coat-dir", default=None)
    args = parser.parse_args()
    data = {"main simulator": load_data(RatingsRun(models=("mf",)))}
    if args.coat_dir:
        data["Coat"] = load_coat(args.coat_dir)
    for name, ratings in data.items():
        split = mcar_split(ratings, seed=0)
        for damping in map(float, args.damping.split(",")):
            print(f"{name}, damping {damping}: MCAR MSE of r̂ after each round (round 0: r̃ fixed, mf-dr)")
            print("  " + "; ".join(trace(split, args.rounds, damping, args.lbfgs_iters, args.every)))


if __name__ == "__main__":
    main()
