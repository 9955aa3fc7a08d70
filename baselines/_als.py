"""The vectorised ridge steps of the alternating-least-squares factorisations."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def ridge_rows(weights: sp.csr_matrix, targets: sp.csr_matrix, feats: np.ndarray,
               reg: np.ndarray | float) -> np.ndarray:
    """Solve, for every row r at once, (sum_j w_rj f_j f_j^T + reg_r I) x_r = sum_j w_rj t_rj f_j.

    ``weights`` and ``targets`` share one sparsity pattern (j runs over row r's stored entries);
    ``feats`` is (n_cols, d). The per-row Gram matrices come from a single sparse product of
    ``weights`` with the flattened outer products f_j f_j^T, so no Python loop over rows is needed.
    """
    n_cols, d = feats.shape
    outer = np.einsum("jf,jg->jfg", feats, feats).reshape(n_cols, d * d)
    gram = np.asarray(weights @ outer).reshape(-1, d, d)
    gram += np.asarray(reg, dtype=np.float64).reshape(-1, 1, 1) * np.eye(d)
    rhs = np.asarray(weights.multiply(targets).tocsr() @ feats)
    return np.linalg.solve(gram, rhs[..., None])[..., 0]


def shared_ridge(features: np.ndarray, targets: np.ndarray, reg: float) -> np.ndarray:
    """Solve (F^T F + reg I) x_r = targets_r for every row r: each row's loss runs over all cells, so all
    rows share one Gram matrix. ``targets`` is (rows, d), F^T t_r for each row's cell targets t_r."""
    gram = features.T @ features + reg * np.eye(features.shape[1])
    return np.linalg.solve(gram, targets.T).T
